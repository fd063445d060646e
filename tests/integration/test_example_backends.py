"""The example pipeline, end to end, through the provisioning-request backend: on the real cluster-autoscaler
(pipelines/llm_finetune_ca.py, atomic class) and on DWS flex-start served by the GKE stand-in
(pipelines/llm_finetune_flex.py, queued-provisioning.gke.io). Run as a person runs them: `kfp-gpu run` in a
subprocess from the repo root (issue 13, "Must show")."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def _run(args: list[str], kube) -> tuple[str, dict, str]:
    env = {**os.environ, "KUBECONFIG": str(kube.kubeconfig)}
    env.pop("KFP_GPU_SIM_ENDPOINT", None)
    res = subprocess.run([sys.executable, "-m", "kfp_gpu.cli", "run", *args], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=400)
    term = res.stdout + res.stderr
    assert res.returncode == 0, term[-4000:]
    assert "SUCCEEDED" in res.stdout and "nothing left" in res.stdout, term[-3000:]
    (log,) = set(re.findall(r"^executor logs: (\S+)$", res.stdout, re.M))
    text = Path(log).read_text()
    # the preflight step's output (its JSON, escaped once inside the executor log) names the backend it chose
    m = re.search(r'"provisioner": (\{"name": "[^"]+", "reason": "[^"]*"\})', text)
    assert m, "no provisioner choice in the preflight output"
    return res.stdout, json.loads(m.group(1)), text


def test_example_on_the_cluster_autoscaler(kube, autoscaler):
    out, choice, _ = _run(["pipelines/llm_finetune_ca.py"], kube)
    assert choice["name"] == "provisioning-request" and "ca-a100-a" in choice["reason"], choice
    assert re.search(r"^ca-a100-[ab]-\S+ +│", out, re.M), out  # the gang came from the autoscaler's node groups


def test_example_on_dws_flex_start(kube):
    _, choice, log = _run(["pipelines/llm_finetune_flex.py", "--scenario", "kfp_gpu/sim/scenarios/flex-start.yaml"],
                          kube)
    assert choice["name"] == "provisioning-request" and "queued provisioning" in choice["reason"], choice
    assert "- a100-80gb-dws-a (us-central1-a): 2 nodes" in log, log[-3000:]  # scale-up's report: the queued pool
