"""The component image, built here (``make images``), holds what the kfp-gpu components import, and the example
pipeline runs with every kfp-gpu step in it (``kfp-gpu run --containers``)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from kfp import compiler

from kfp_gpu.image import STEP_ENTRY, VERSION
from kfp_gpu.steps.entry import STEPS
from kfp_gpu_rehearsal.devcluster import images
from tests.import_closure import CHECK, REPO, closure, imports_of

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1800)]  # a cold run builds the images first

# Reached by the closure but not wanted in the component image, each for a stated reason:
NOT_IN_IMAGE = {
    # kfp_gpu.checkpoint.torch_io / dcp_io import torch inside the functions the trainer calls (trainer image);
    # the steps and the controller read checkpoint manifests only
    "torch": "trainer only",
    # FsspecBackend: checkpoint URIs other than local, gs:// and s3:// (kfp_gpu.checkpoint.backends._guard fails in
    # one line naming `pip install fsspec` when it is absent); gs:// goes through google-cloud-storage, in the image
    "fsspec": "other URL schemes only",
}


def _component_sources(tmp_path: Path) -> dict[str, str]:
    """Compile every kfp-gpu component; the Python source each executor carries (its last command element)."""
    from kfp_gpu.components import ALL

    sources: dict[str, str] = {}
    for name, comp in ALL.items():
        out = tmp_path / f"{name}.yaml"
        compiler.Compiler().compile(comp, str(out))
        for ex in yaml.safe_load(out.read_text())["deploymentSpec"]["executors"].values():
            command = ex["container"]["command"]
            assert STEP_ENTRY in command[-1], f"{name}: the component source is not where kfp puts it"
            sources[name] = command[-1]
    assert len(sources) == len(ALL) == 5
    return sources


def _missing_in(env: dict[str, str], names: list[str]) -> list[str]:
    out = subprocess.run(["podman", "run", "--rm", images.COMPONENT, "python", "-c", CHECK, json.dumps(names)],  # noqa: S603
                         env=env, capture_output=True, text=True, check=True)
    result: list[str] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def test_component_image_runs_the_cli(built_images: dict[str, str]) -> None:
    out = subprocess.run(["podman", "run", "--rm", images.COMPONENT, "kfp-gpu", "--version"], env=built_images,  # noqa: S603
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == f"kfp-gpu {VERSION}"
    user = subprocess.run(["podman", "run", "--rm", images.COMPONENT, "id", "-u"], env=built_images,  # noqa: S603
                          capture_output=True, text=True, check=True)
    assert user.stdout.strip() == "10001"  # no root by default


def test_component_image_has_every_module_the_components_import(built_images: dict[str, str],
                                                                 tmp_path: Path) -> None:
    roots: set[str] = set()
    for source in _component_sources(tmp_path).values():
        roots |= imports_of(source)
    roots |= {spec.split(":")[0] for spec in STEPS.values()}  # entry.resolve imports them by name
    ours, theirs = closure(roots)
    assert "kfp_gpu.steps.entry" in ours and "kfp_gpu.gang.client" in ours and "kubernetes" in {
        t.split(".")[0] for t in theirs}
    names = sorted(n for n in ours | theirs if n.split(".")[0] not in NOT_IN_IMAGE)
    assert _missing_in(built_images, names) == []
    # the check fails for what the image lacks: torch is the trainer image's, never the component image's
    assert [m.split(":")[0] for m in _missing_in(built_images, ["kfp_gpu.spec", "torch"])] == ["torch"]


def test_example_pipeline_runs_its_kfp_gpu_steps_in_the_component_image(built_images: dict[str, str],
                                                                         kube: object) -> None:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    out = subprocess.run([sys.executable, "-m", "kfp_gpu.cli", "run", "--containers", "pipelines/llm_finetune.py"],  # noqa: S603
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=900, check=False)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-4000:]
    assert re.search(r"=== pipeline llm-finetune SUCCEEDED .*kfp-gpu steps in localhost/kfp-gpu:", text), text[-3000:]
    ran = dict(re.findall(r"^    (\S+) runs in (.+)$", text, re.M))
    kfp_gpu_steps = {"quota-preflight", "reserve-warm-pool", "burst-scale-up", "train-pytorchjob", "teardown"}
    assert {k for k, v in ran.items() if v.startswith(images.COMPONENT + " ")} == kfp_gpu_steps, ran
    assert {k for k, v in ran.items() if v.startswith("host subprocess")} == {"prepare-data", "evaluate"}, ran
    assert "nothing left" in text and "Cost-risk report:" in text and "Provisioning timeline" in text
