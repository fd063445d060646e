"""Users' own component image: `kfp-gpu compile --image REPO:TAG` and `KFP_GPU_IMAGE`, on the compiled YAML."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

# kfp_gpu.components is defined with the default image before a test sets KFP_GPU_IMAGE: the in-process
# compiles below prove the IR rewrite, the subprocesses the env path.
import kfp_gpu.components  # noqa: F401
from kfp_gpu import cli, image
from kfp_gpu.errors import InvalidSpec

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "pipelines" / "llm_finetune.py"
MINE = "europe-docker.pkg.dev/acme-ml/mirror/kfp-gpu:0.1.0-acme.2"
KFP_GPU_STEPS = {"exec-quota-preflight", "exec-reserve-warm-pool", "exec-burst-scale-up", "exec-train-pytorchjob",
                 "exec-teardown"}


def _images(path: Path) -> dict[str, str]:
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    return {name: ex["container"]["image"] for name, ex in docs[0]["deploymentSpec"]["executors"].items()}


@pytest.fixture
def env_restored(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """`compile --image` exports KFP_GPU_IMAGE in-process; restore the variable's absence afterwards."""
    monkeypatch.setenv(image.ENV_VAR, "placeholder.example/kfp-gpu:0")
    monkeypatch.delenv(image.ENV_VAR)
    return monkeypatch


@pytest.mark.parametrize("ref", [
    "repo:tag", "localhost:5000/kfp-gpu:1", "us-docker.pkg.dev/p/r/kfp-gpu:0.1.0", MINE,
    "ghcr.io/a/b@sha256:" + "0" * 64, "ghcr.io/a/b:1.0@sha256:" + "f" * 64,
])
def test_valid_references(ref: str) -> None:
    assert image.validate_image(ref) == ref


@pytest.mark.parametrize("ref", ["", "kfp-gpu", "ghcr.io/a/b", "Upper/case:1", "a:b:c", "a b:1", "reg:443/x", "x:"])
def test_invalid_reference_is_one_line_naming_the_source_value_and_fix(ref: str) -> None:
    with pytest.raises(InvalidSpec) as err:
        image.validate_image(ref, image.ENV_VAR)
    msg = cli.one_line(err.value)
    assert "\n" not in msg
    assert f"KFP_GPU_IMAGE={ref!r}" in msg and "REPO:TAG" in msg and "fix: set KFP_GPU_IMAGE to e.g." in msg


def test_env_var_chooses_the_image(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(image.ENV_VAR, MINE)
    assert image.image_for_version() == MINE
    assert image.image_for_version("9.9.9") == "ghcr.io/kfp-gpu/kfp-gpu:9.9.9"  # an explicit version is the published one
    monkeypatch.setenv(image.ENV_VAR, "not an image")
    with pytest.raises(InvalidSpec, match="KFP_GPU_IMAGE"):
        image.image_for_version()
    monkeypatch.setenv(image.ENV_VAR, "  ")
    assert image.image_for_version() == f"{image.IMAGE_REPO}:{image.VERSION}"


@pytest.mark.parametrize("target", ["kfp", "vertex"])
def test_compile_image_flag_sets_every_kfp_gpu_executor(target: str, tmp_path: Path, env_restored: object,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / f"{target}.yaml"
    assert cli.main(["compile", str(EXAMPLE), "-o", str(out), "--target", target, "--image", MINE]) == 0
    images = _images(out)
    assert {n for n, i in images.items() if i == MINE} == KFP_GPU_STEPS
    assert {i for n, i in images.items() if n not in KFP_GPU_STEPS} == {"python:3.11-slim"}  # user steps keep theirs
    assert f"image: {image.IMAGE_REPO}" not in out.read_text()
    assert f"(component image {MINE})" in capsys.readouterr().out


def test_compile_without_override_uses_the_published_image(tmp_path: Path, env_restored: object) -> None:
    out = tmp_path / "p.yaml"
    assert cli.main(["compile", str(EXAMPLE), "-o", str(out)]) == 0
    assert {i for n, i in _images(out).items() if n in KFP_GPU_STEPS} == {f"{image.IMAGE_REPO}:{image.VERSION}"}


def test_env_var_reaches_the_components_when_they_are_defined(tmp_path: Path) -> None:
    out = tmp_path / "v.yaml"
    env = {**os.environ, image.ENV_VAR: MINE}
    code = "from kfp_gpu import components; print(components.IMAGE)"
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=ROOT, check=True)
    assert res.stdout.strip() == MINE
    res = subprocess.run([sys.executable, "-m", "kfp_gpu.cli", "compile", str(EXAMPLE), "-o", str(out),
                          "--target", "vertex"], env=env, capture_output=True, text=True, cwd=ROOT)
    assert res.returncode == 0, res.stderr
    assert {i for n, i in _images(out).items() if n in KFP_GPU_STEPS} == {MINE}


@pytest.mark.parametrize("flag,env_value,named", [(["--image", "kfp-gpu"], None, "--image"),
                                                  ([], "kfp-gpu:", "KFP_GPU_IMAGE")])
def test_bad_image_fails_compile_in_one_line(flag: list[str], env_value: str | None, named: str,
                                            tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != image.ENV_VAR}
    if env_value is not None:
        env[image.ENV_VAR] = env_value
    res = subprocess.run([sys.executable, "-m", "kfp_gpu.cli", "compile", str(EXAMPLE), "-o", str(tmp_path / "x.yaml"),
                          *flag], env=env, capture_output=True, text=True, cwd=ROOT)
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"kfp-gpu: invalid {named}="), res.stderr
    assert not (tmp_path / "x.yaml").exists()


def test_retag_rewrites_only_when_needed(tmp_path: Path, env_restored: object) -> None:
    out = tmp_path / "p.yaml"
    assert cli.main(["compile", str(EXAMPLE), "-o", str(out), "--image", MINE]) == 0
    before = out.stat().st_mtime_ns, out.read_text()
    assert set(image.retag_compiled(out, MINE)) == KFP_GPU_STEPS
    assert (out.stat().st_mtime_ns, out.read_text()) == before
    image.retag_compiled(out, "other.example/kfp-gpu:2")
    assert {i for n, i in _images(out).items() if n in KFP_GPU_STEPS} == {"other.example/kfp-gpu:2"}
