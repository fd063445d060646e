"""The fence of a controller replica that stops acting (kfp_gpu/controller/work.py FENCE): no work unit starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from kfp_gpu.controller import work


def test_no_unit_starts_once_the_replica_is_fenced(tmp_path: Path) -> None:
    work.FENCE.set()
    try:
        with pytest.raises(RuntimeError, match="not starting scale_up: this controller replica is stopping"):
            work.Work("scale_up", "scale_up", "{}", "run-1", "", tmp_path / "unit.log")
        assert not list(tmp_path.iterdir())  # nothing written, no process
    finally:
        work.FENCE.clear()
