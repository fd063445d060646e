"""Run-time values reach the job in a real local run: ``kfp-gpu run`` (kfp.local SubprocessRunner, the local
control plane, the GKE stand-in and the Training Operator) of tests/integration/pipelines/runtime_params_pipeline.py
with non-default values for a pipeline parameter and a run-time spec field.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
PIPELINE = "tests/integration/pipelines/runtime_params_pipeline.py"


def _let_user_steps_read_jobs(kube, namespace: str) -> None:
    """The pipeline's own record_job step lists the namespace's PyTorchJobs. Every step of a run, the user's
    included, runs as the namespace's ``kfp-gpu`` ServiceAccount, whose kfp-gpu Role grants gpugangs only: the
    user grants what their own steps need, as this does."""
    from kubernetes import client

    rbac = client.RbacAuthorizationV1Api(kube.api)
    rbac.create_namespaced_role(namespace, {"metadata": {"name": "read-jobs"}, "rules": [
        {"apiGroups": ["kubeflow.org"], "resources": ["pytorchjobs"], "verbs": ["list"]}]})
    rbac.create_namespaced_role_binding(namespace, {
        "metadata": {"name": "read-jobs"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "read-jobs"},
        "subjects": [{"kind": "ServiceAccount", "name": "kfp-gpu", "namespace": namespace}]})


def _run(kube, namespace: str, tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    _let_user_steps_read_jobs(kube, namespace)
    cluster = f"rt{uuid.uuid4().hex[:6]}"
    scenario = yaml.safe_load((ROOT / "kfp_gpu_rehearsal/sim/scenarios/default.yaml").read_text())
    scenario["cluster"] = cluster
    (tmp_path / "scenario.yaml").write_text(yaml.safe_dump(scenario))
    record = tmp_path / "job.json"
    env = {**os.environ, "KUBECONFIG": str(kube.kubeconfig), "RT_CLUSTER": cluster, "RT_NAMESPACE": namespace,
           "RT_RECORD": str(record)}
    env.pop("KFP_GPU_SIM_ENDPOINT", None)
    cmd = [sys.executable, "-m", "kfp_gpu.cli", "run", PIPELINE, *args, "--scenario", str(tmp_path / "scenario.yaml")]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300), record


def _log(res: subprocess.CompletedProcess[str]) -> str:
    logs = re.findall(r"^executor logs: (\S+)$", res.stdout, re.M)
    assert logs, res.stdout + res.stderr
    return Path(logs[0]).read_text()


def test_non_default_parameter_and_upstream_output_reach_the_trainer_args(kube, namespace, tmp_path):
    res, record = _run(kube, namespace, tmp_path, "--arg", "train_steps=7", "--arg", "run_tag=blue",
                       "--arg", "nodes=3")
    assert res.returncode == 0, (res.stdout + res.stderr)[-4000:]
    jobs = json.loads(record.read_text())  # the PyTorchJob as the Training Operator got it, before teardown
    assert jobs, "no PyTorchJob found in the run's namespace"
    for replica in jobs:
        assert replica["args"] == ["--steps", "7", "--tag=blue-upstream"], replica
        assert replica["env"]["RUN_TAG"] == "blue", replica
    # nodes=3 (default 2) sized the gang: Master + Workers, and three nodes were provisioned and released
    assert sum(r["replicas"] for r in jobs) == 3, jobs
    assert "teardown: released 3 nodes" in res.stdout, res.stdout


def test_bad_runtime_spec_value_fails_preflight_naming_the_field(kube, namespace, tmp_path):
    res, _ = _run(kube, namespace, tmp_path, "--arg", "nodes=0")
    assert res.returncode != 0, res.stdout
    log = _log(res)
    assert "kfp-gpu preflight failed: invalid nodes=0" in log, log[-3000:]
    err = next(json.loads(line.strip())["error"] for line in log.splitlines() if line.strip().startswith('{"error"'))
    assert err["type"] == "InvalidSpec" and err["fields"]["field"] == "nodes"
    assert "reserve-warm-pool started" not in res.stdout  # failed fast: nothing was provisioned
    # the terminal says why, under the failure and after the summary, without opening the executor log
    assert "\n    invalid nodes=0: must be in [1, 4096] (fix: " in res.stdout, res.stdout
    assert "\nquota-preflight: invalid nodes=0: must be in [1, 4096] (fix: " in res.stdout, res.stdout
    # teardown resolves the same bad value, falls back to the compiled spec and still cleans up
    assert re.search(r"^  ✓ teardown finished", res.stdout, re.M), res.stdout
    assert "Traceback" not in res.stdout + res.stderr
