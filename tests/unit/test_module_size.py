"""Modules stay small (issue 31): no Python module of the product, the rehearsal world or the bench passes 400 lines.

A module that grows past it is split along a real seam (one concern a module, with a docstring stating its
contract), not trimmed: docs/architecture.md, "Rules".
"""

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MAX_LINES = 400


def _modules() -> list[Path]:
    return sorted(p for top in ("kfp_gpu", "kfp_gpu_rehearsal", "bench") for p in (ROOT / top).rglob("*.py"))


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_module_is_at_most_400_lines(path: Path) -> None:
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_LINES, (f"{path.relative_to(ROOT)} has {lines} lines (> {MAX_LINES}): split it along a seam, "
                                "one concern a module (docs/architecture.md)")
