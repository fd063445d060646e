"""The component image tag, the package version, the Dockerfile and compiled components agree."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from kfp_gpu import image

ROOT = Path(__file__).resolve().parent.parent


def test_image_tag_is_package_version() -> None:
    assert image.image_for_version() == f"ghcr.io/kfp-gpu/kfp-gpu:{image.VERSION}"
    assert image.image_for_version("9.9.9") == "ghcr.io/kfp-gpu/kfp-gpu:9.9.9"


def test_installed_metadata_matches_pyproject() -> None:
    py = image.pyproject_version(ROOT / "pyproject.toml")
    assert py is not None
    assert image.VERSION == py, "stale install: re-run `pip install -e .` after bumping the version"


def test_pyproject_parser(tmp_path: Path) -> None:
    f = tmp_path / "pyproject.toml"
    f.write_text('[tool.x]\nversion = "no"\n[project]\nname = "kfp-gpu"\nversion = "1.2.3"\n[tool.y]\n')
    assert image.pyproject_version(f) == "1.2.3"
    assert image.pyproject_version(tmp_path / "missing.toml") is None


def test_dockerfile_version_matches() -> None:
    text = (ROOT / "Dockerfile").read_text()
    (arg,) = re.findall(r"^ARG KFP_GPU_VERSION=(\S+)$", text, re.M)
    assert arg == image.VERSION
    assert re.search(r"^FROM python:3\.11-slim$", text, re.M)
    assert 'pip install "kfp==2.17.3" "kfp-kubernetes==2.17.3" ".[gke,eks]"' in text
    assert 'org.opencontainers.image.version="${KFP_GPU_VERSION}"' in text


def test_every_component_uses_the_versioned_image() -> None:
    files = sorted((ROOT / "components").glob("*/component.yaml"))
    for f in files:
        images = set()
        for doc in yaml.safe_load_all(f.read_text()):
            for ex in ((doc or {}).get("deploymentSpec", {}).get("executors", {}) or {}).values():
                img = (ex.get("container") or {}).get("image")
                if img:
                    images.add(img)
        assert images == {image.image_for_version()}, f"{f.relative_to(ROOT)}: {images}"
