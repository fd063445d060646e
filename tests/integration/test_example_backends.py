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
import threading
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
    _, choice, log = _run(["pipelines/llm_finetune_flex.py", "--scenario", "kfp_gpu_rehearsal/sim/scenarios/flex-start.yaml"],
                          kube)
    assert choice["name"] == "provisioning-request" and "queued provisioning" in choice["reason"], choice
    assert "- a100-80gb-dws-a (us-central1-a): 2 nodes" in log, log[-3000:]  # scale-up's report: the queued pool


def test_example_topology_gang_under_kueue_tas(kube, kueue):
    """pipelines/llm_finetune_topology.py on the bundled ``topology`` world: the admin's Kueue objects (a Topology
    over GKE's levels, a TAS flavor for the compact pool, a ClusterQueue, the team's LocalQueue) exist first."""
    from kfp_gpu import install
    from kfp_gpu.cluster import node_labels
    from kfp_gpu.plan import topology
    from kfp_gpu.plan.kueue import GROUP, VERSION
    from pipelines.llm_finetune_topology import SPEC
    from tests.integration.conftest import scoped_namespace
    from tests.integration.test_kueue_preflight import Kueue

    ns = SPEC.target.namespace
    made = scoped_namespace(kube, ns)
    next(made)
    kq = Kueue(kube.api, ns)
    try:
        topo = {**install.kueue_topology("gke")[0], "metadata": {"name": f"gke-{kq.suffix}"}}  # kfp-gpu install --kueue-topology gke
        kq.custom.create_cluster_custom_object(GROUP, VERSION, "topologies", topo)
        kq.made.append(("topologies", topo["metadata"]["name"]))
        flavor = kq._cluster("resourceflavors", "ResourceFlavor", "h100-compact", {
            "nodeLabels": {"cloud.google.com/gke-nodepool": SPEC.target.pools[0]},
            "topologyName": topo["metadata"]["name"]})
        cq = kq._cluster("clusterqueues", "ClusterQueue", "topology", {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
            "resourceGroups": [{"coveredResources": ["nvidia.com/gpu"], "flavors": [
                {"name": flavor, "resources": [{"name": "nvidia.com/gpu", "nominalQuota": "32"}]}]}]})
        kq.wait_active(cq)
        kq.local_queue(SPEC.target.queue, cq)
        seen: dict[str, tuple[dict, str]] = {}  # pod -> (annotations, its node's block), while the run lives
        stop = threading.Event()

        def watch() -> None:
            while not stop.wait(0.2):
                for p in kube.core.list_namespaced_pod(ns, label_selector="kfp-gpu.io/job").items:
                    if p.spec.node_name and p.metadata.name not in seen:
                        node = kube.core.read_node(p.spec.node_name)
                        seen[p.metadata.name] = (dict(p.metadata.annotations or {}),
                                                 node.metadata.labels.get(node_labels.GKE.topology[0], ""))

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        try:
            _, choice, log = _run(["pipelines/llm_finetune_topology.py", "--scenario", "topology"], kube)
        finally:
            stop.set()
            watcher.join(5)
        assert choice["name"] == "node-pool", choice
        assert "- h100-80gb-compact-a (us-central1-a): 2 nodes" in log, log[-3000:]
        assert len(seen) == 2, seen  # master + worker, each on a node of one block, placed by Kueue TAS
        assert all(a.get(topology.REQUIRED_ANNOTATION) == node_labels.GKE.topology[0] and a.get(
            topology.GROUP_ANNOTATION) for a, _ in seen.values()), seen
        assert len({b for _, b in seen.values()}) == 1 and all(b for _, b in seen.values()), seen
    finally:
        for w in kq.custom.list_namespaced_custom_object(GROUP, VERSION, ns, "workloads")["items"]:
            kq.custom.delete_namespaced_custom_object(GROUP, VERSION, ns, "workloads", w["metadata"]["name"])
        kq.cleanup()
        next(made, None)
