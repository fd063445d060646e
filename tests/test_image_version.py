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
    # users' default base is the public image; `make images` passes the local Debian base (docs/images.md)
    assert re.search(r"^ARG BASE=python:3\.11-slim$", text, re.M) and re.search(r"^FROM \$\{BASE\}$", text, re.M)
    # the dependencies of pyproject.toml with the gke, eks and controller (kopf: the controller image) extras, within
    # the lock; then the package itself without dependencies
    assert 'pip install -c constraints.txt "kfp==2.17.3" "kfp-kubernetes==2.17.3" -r /tmp/requirements.txt' in text
    assert "for x in ('gke', 'eks', 'controller')" in text and "pip install --no-deps ." in text
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


TRAINER_DOCKERFILE = ROOT / "pipelines" / "trainer" / "Dockerfile"


def test_trainer_dockerfile_matches_the_default_trainer_image_and_the_torch_pin() -> None:
    from kfp_gpu.job import DEFAULT_TRAINER_IMAGE

    text = TRAINER_DOCKERFILE.read_text()
    (arg,) = re.findall(r"^ARG KFP_GPU_VERSION=(\S+)$", text, re.M)
    assert DEFAULT_TRAINER_IMAGE == f"ghcr.io/kfp-gpu/trainer:{arg}" and arg == image.VERSION
    (torch_pin,) = re.findall(r"^ARG TORCH_VERSION=(\S+)$", text, re.M)
    assert f"torch=={torch_pin} " in (ROOT / "Makefile").read_text()  # the version the tests train with
    assert re.search(r"^ARG BASE=python:3\.11-slim$", text, re.M) and re.search(r"^FROM \$\{BASE\}$", text, re.M)
    assert '"python", "-m", "pipelines.trainer.train_lm"' in text  # JobTemplate's default command


def test_trainer_dockerfile_copies_everything_the_trainer_imports(tmp_path: Path) -> None:
    """Lay out the image's /opt/trainer from the COPY lines and import the trainer there, without the
    installed kfp_gpu (no site .pth) and without kfp: a missing file or a new heavy import fails here."""
    import shutil
    import subprocess
    import sys
    import sysconfig

    copies = re.findall(r"^COPY (.+) (\S+)$", TRAINER_DOCKERFILE.read_text(), re.M)
    assert copies
    for sources, dest in copies:
        target = tmp_path / dest.removeprefix("./")
        for src in sources.split():
            path = ROOT / src
            if path.is_dir():
                shutil.copytree(path, target, ignore=shutil.ignore_patterns("__pycache__"))
            else:
                target.mkdir(parents=True, exist_ok=True)
                shutil.copy(path, target / path.name)
    code = ("import sys; sys.path.append(sys.argv[1]); import kfp_gpu.checkpoint, pipelines.trainer.train_lm; "
            "assert kfp_gpu.checkpoint.__file__.startswith(sys.argv[2]), kfp_gpu.checkpoint.__file__; "
            "assert 'kfp' not in sys.modules and 'kubernetes' not in sys.modules")
    res = subprocess.run([sys.executable, "-S", "-c", code, sysconfig.get_paths()["purelib"], str(tmp_path)],
                         cwd=tmp_path, capture_output=True, text=True, env={"PYTHONPATH": str(tmp_path)})
    assert res.returncode == 0, res.stderr
