"""The component image: its tag is tied to the package version, as GCPC does."""

from __future__ import annotations

IMAGE_REPO = "ghcr.io/kfp-gpu/kfp-gpu"
VERSION = "0.1.0"  # keep equal to pyproject.toml [project].version (tests check it)


def image_for_version(version: str = VERSION) -> str:
    """The image every component's ``base_image`` points to."""
    return f"{IMAGE_REPO}:{version}"
