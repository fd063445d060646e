"""`kfp-gpu run` on a pipeline that is not the example, as a person runs it: a subprocess from the repo root.

The pipeline (tests/integration/pipelines/tiny_pipeline.py) gets a unique stand-in cluster (scenario file)
and namespace, so it never meets the demo or other tests on the shared local cluster.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import yaml
from kubernetes import client

from kfp_gpu import ownership, rehearsal_seam
from kfp_gpu.cluster import owned
from tests.waiting import wait_until

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
PIPELINE = "tests/integration/pipelines/tiny_pipeline.py"
STEPS = ("quota-preflight", "reserve-warm-pool", "burst-scale-up", "greet", "train-pytorchjob", "teardown")


def _run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kfp_gpu.cli", "run", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


def test_run_rehearses_a_user_pipeline_quietly_and_leaves_nothing(kube, namespace, tmp_path):
    cluster = f"run{uuid.uuid4().hex[:6]}"
    scenario = yaml.safe_load((ROOT / "kfp_gpu_rehearsal/sim/scenarios/default.yaml").read_text())
    scenario["cluster"] = cluster
    idle = next(p for p in scenario["pools"] if p["accelerator"] != "l4")
    idle["initial_size"] = 1  # a node of the world's that the run never touches: it goes when the world does
    (tmp_path / "scenario.yaml").write_text(yaml.safe_dump(scenario))
    env = {**os.environ, "KUBECONFIG": str(kube.kubeconfig), "TINY_CLUSTER": cluster, "TINY_NAMESPACE": namespace}
    env.pop("KFP_GPU_SIM_ENDPOINT", None)

    res = _run([PIPELINE, "--arg", "greeting=bonjour", "--arg", "repeat=2",
                "--scenario", str(tmp_path / "scenario.yaml")], env)
    term = res.stdout + res.stderr
    assert res.returncode == 0, term[-4000:]

    # what a person reads: one progress line per step, then the summary sections, in this order
    for step in STEPS:
        assert re.search(rf"^  > {step} started$", res.stdout, re.M), (step, term)
        assert re.search(rf"^  ✓ {step} finished in (\d+(\.\d)?s|\d+\.\d (min|h))$", res.stdout, re.M), (step, term)
    assert "every time and cost below is in the world's clock (one second here = 120 real-world seconds)" in res.stdout
    sections = ["=== pipeline tiny-l4 SUCCEEDED", "Provisioning timeline", "Cost-risk report:",
                "Cost risk: 2 x l4 (on-demand)", "teardown: released 2 nodes", "leak check (run ", "nothing left"]
    positions = [res.stdout.find(s) for s in sections]
    assert -1 not in positions and positions == sorted(positions), (sections, positions, term)
    assert f"gke-{cluster}-l4-" in res.stdout  # the timeline shows this run's nodes
    # its gang was worked by the dev cluster's controller row (its log), which still runs: not one of the run's own
    said = re.search(r"^kfp-gpu controller: the dev cluster's \((?:started|re-used), pid (\d+);", res.stdout, re.M)
    assert said, term
    row_log = (rehearsal_seam.cluster_dir() / "kfp-gpu-controller.log").read_text(errors="replace")
    assert re.search(rf" INFO {namespace}/\S+ Released: released", row_log), row_log[-3000:]
    assert Path(f"/proc/{said.group(1)}").exists()

    # executor logs and JSON went to the printed file, not the terminal
    logs = re.findall(r"^executor logs: (\S+)$", res.stdout, re.M)
    assert logs and len(set(logs)) == 1, term
    log = Path(logs[0])
    assert log.is_file()
    text = log.read_text()
    assert "tiny-marker: bonjour bonjour" in text  # the --arg values reached the step
    assert '"parameterValues"' in text or '"parameters"' in text
    assert "Connection pool is full" not in text  # the GKE clients' pools fit their concurrency (10 did not)
    for noise in ("tiny-marker", "KFP Executor", '"parameterValues"', '"run_id"', "executor_output",
                  "Connection pool is full", "Traceback", "Warning:"):
        assert noise not in term, (noise, term)

    # nothing of the run left, checked independently of the command's own leak check
    run_id = re.search(r"leak check \(run (\S+):", res.stdout).group(1)  # type: ignore[union-attr]
    assert run_id.isdigit() and run_id in text
    core = client.CoreV1Api(kube.api)
    wait_until("the run's and the world's nodes gone", lambda: not core.list_node(
        label_selector=f"kfp-gpu.io/sim-cluster={cluster}").items, timeout=30)
    for kind in (owned.LEDGER, owned.BALLOON, owned.NODE, owned.JOB, owned.LEASE):
        ns = namespace if kind.namespaced else None
        assert owned.list_objects(kube.api, kind, ns, owned.run_selector(kind, run_id)) == [], kind.name
        assert owned.list_objects(kube.api, kind, ns, kind.selector) == [] or not kind.namespaced, kind.name


def test_run_refuses_an_unknown_arg_in_one_line_before_booting(kube):
    env = {**os.environ, "KUBECONFIG": str(kube.kubeconfig)}
    res = _run([PIPELINE, "--arg", "greting=hi"], env)
    assert res.returncode == 2
    assert res.stdout == ""
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert "--arg" in lines[0] and "'greting'" in lines[0]
    assert "greeting:String" in lines[0] and "repeat:Integer" in lines[0] and "shout:Boolean" in lines[0]


def test_leak_check_names_what_a_run_left(kube, namespace, kwok_nodes):
    from kfp_gpu.ownership import LABEL_RUN_ID, LEDGER_LABEL
    from kfp_gpu_rehearsal.leftovers import leftovers

    core = client.CoreV1Api(kube.api)
    run = f"9{uuid.uuid4().int % 10**7:07d}"
    core.create_namespaced_config_map(namespace, {"metadata": {
        "name": f"kfp-gpu-ledger-{run}-x", "labels": {LEDGER_LABEL: "true", LABEL_RUN_ID: run}}})
    client.CoordinationV1Api(kube.api).create_namespaced_lease(namespace, {"metadata": {
        "name": f"kfp-gpu-run-{run}", "labels": {ownership.RUN_LEASE_LABEL: "true", LABEL_RUN_ID: run}}})
    home = "kfp-gpu-system"  # a controller's ledgers of this namespace's gangs (kfp_gpu/cluster/ledger.py)
    core.create_namespaced_config_map(home, {"metadata": {
        "name": f"kfp-gpu-ledger-{namespace}-{run}-y", "labels": {LEDGER_LABEL: "true", LABEL_RUN_ID: run,
                                                                   "kfp-gpu.io/gang-namespace": namespace}}})
    try:
        _, nodes = kwok_nodes(1, gpus=1)
        left = leftovers(kube.api, namespace, run, deleted_nodes=nodes, timeout_s=0.5, ledger_home=home)
    finally:
        core.delete_namespaced_config_map(f"kfp-gpu-ledger-{namespace}-{run}-y", home)
    assert left == {"configmap": [f"kfp-gpu-ledger-{run}-x", f"kfp-gpu-ledger-{namespace}-{run}-y"],
                    "lease": [f"kfp-gpu-run-{run}"], "node": nodes}
    assert leftovers(kube.api, namespace, f"{run}0", timeout_s=0.5) == {}  # another run's view is clean
