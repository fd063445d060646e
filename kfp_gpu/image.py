"""The component image: its tag is tied to the package version, as GCPC does.

``VERSION`` is the installed distribution's version (``importlib.metadata.version("kfp-gpu")``),
falling back to ``[project].version`` of the source checkout's pyproject.toml when the package is not
installed (e.g. run from a plain checkout). tests/test_image_version.py keeps the two, the
Dockerfile's ``KFP_GPU_VERSION`` and every ``components/*/component.yaml`` image in step.
"""

from __future__ import annotations

import re
from importlib import metadata
from pathlib import Path

IMAGE_REPO = "ghcr.io/kfp-gpu/kfp-gpu"
DIST_NAME = "kfp-gpu"
PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"


def pyproject_version(path: Path = PYPROJECT) -> str | None:
    """``[project].version`` from pyproject.toml, or None when the file is absent or has none."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return None
    section = re.search(r"^\[project\]\s*$(.*?)(?=^\[|\Z)", text, re.M | re.S)
    if not section:
        return None
    m = re.search(r'^version\s*=\s*"([^"]+)"', section.group(1), re.M)
    return m.group(1) if m else None


def package_version() -> str:
    """The kfp-gpu version: installed metadata, else pyproject.toml, else ``0.0.0+unknown``."""
    try:
        return metadata.version(DIST_NAME)
    except metadata.PackageNotFoundError:
        return pyproject_version() or "0.0.0+unknown"


VERSION = package_version()


def image_for_version(version: str | None = None) -> str:
    """The image every component's ``base_image`` points to: ``ghcr.io/kfp-gpu/kfp-gpu:<version>``.

    Raises: nothing.
    """
    return f"{IMAGE_REPO}:{version or VERSION}"
