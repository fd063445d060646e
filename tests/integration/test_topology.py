"""Topology-aware gangs on the local cluster, with the GKE stand-in's nodes carrying GKE's block / sub-block / host
labels (kfp_gpu.sim.topology): a topology-required gang admitted by the real Kueue's TAS into one block; a
replacement kept in the survivors' block by the node-pool backend (no Kueue); a gang no block can hold refused at
preflight, naming the block sizes.
"""

from __future__ import annotations

import collections
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from kfp_gpu.cluster import node_labels
from kfp_gpu.devcluster.client import Kube
from kfp_gpu.plan import topology
from kfp_gpu.plan.kueue import GROUP, VERSION
from kfp_gpu.sim import scenario as scenario_mod
from kfp_gpu.sim.server import SimServer
from kfp_gpu.sim.topology import BLOCK
from kfp_gpu.spec import ProvisioningSpec, Target
from tests.integration import test_kueue_preflight
from tests.integration.test_kueue_preflight import GPU, Kueue
from tests.integration.test_train_support import ACCEL_LABEL, job_json, job_pods, make_capacity

pytestmark = pytest.mark.integration
kq = test_kueue_preflight.kq  # the Kueue-objects fixture (cluster-scoped ones unique per test, deleted afterwards)
ROOT = Path(__file__).resolve().parents[2]
POOL = "h100-80gb-a"
ZONE = "us-central1-a"


def _world(kube: Kube, topo: dict[str, int], **pool: Any) -> SimServer:
    """The default scenario under a cluster name of its own, with a ``topology:`` block and ``pool`` changes to
    the h100 pool of us-central1-a (the only pool the tests use)."""
    data: dict[str, Any] = yaml.safe_load((ROOT / "kfp_gpu/sim/scenarios/default.yaml").read_text())
    data["cluster"] = f"t{uuid.uuid4().hex[:6]}"
    data["topology"] = topo
    for p in data["pools"]:
        if p["name"] == POOL:
            p.update(pool)
    server = SimServer(scenario_mod.from_dict(data), kube.kubeconfig)
    server.start()
    return server


@pytest.fixture
def worlds(kube: Kube) -> Iterator[list[SimServer]]:
    made: list[SimServer] = []
    yield made
    core = client.CoreV1Api(kube.api)
    for server in made:
        server.stop()
        for n in core.list_node(label_selector=f"kfp-gpu.io/sim-cluster={server.state.scenario.cluster}").items:
            core.delete_node(n.metadata.name)


def _blocks(kube: Kube, names: list[str]) -> dict[str, str]:
    core = client.CoreV1Api(kube.api)
    return {n: core.read_node(n).metadata.labels.get(BLOCK, "") for n in names}


def test_topology_required_gang_is_admitted_by_kueue_tas_into_one_block(
    kube: Kube, namespace: str, kq: Kueue, worlds: list[SimServer], tmp_path: Path, step_api: client.ApiClient,
) -> None:
    # 5 nodes of an unplaced pool scatter over two blocks of 4 hosts: 3 + 2
    sim = _world(kube, {"block_nodes": 4, "subblock_nodes": 2, "blocks": 2}, initial_size=5, max_nodes=5)
    worlds.append(sim)
    names = sim.nodes(POOL)
    per_block = collections.Counter(_blocks(kube, names).values())
    assert sorted(per_block.values()) == [2, 3], per_block
    # the admin's side: a Topology of GKE's levels, a flavor naming it (only this world's nodes), a queue
    topo = topology.kueue_topology(f"gke-{kq.suffix}", node_labels.GKE.topology)
    kq.custom.create_cluster_custom_object(GROUP, VERSION, "topologies", topo)
    kq.made.append(("topologies", topo["metadata"]["name"]))  # type: ignore[index]
    flavor = kq._cluster("resourceflavors", "ResourceFlavor", "h100-tas", {
        "nodeLabels": {"cloud.google.com/gke-accelerator": ACCEL_LABEL,
                       "kfp-gpu.io/sim-cluster": sim.state.scenario.cluster},
        "topologyName": topo["metadata"]["name"]})  # type: ignore[index]
    cq = kq.cluster_queue("tas", [{"name": flavor, "nominal": 64}])
    kq.wait_active(cq)
    lq = kq.local_queue("team", cq)

    spec = ProvisioningSpec(accelerator="h100-80gb", nodes=3, topology="required", topology_level="block",
                            target=Target(namespace=namespace, queue=lq), checkpoint_uri=str(tmp_path / "ckpt"))
    run_id = f"run-tas-{namespace}"
    from kfp_gpu.steps import train

    res = train.run(spec, run_id, make_capacity(run_id, POOL, names, spot=False).to_json(), job_json=job_json(2.0),
                    api=step_api)
    out = json.loads(res.output_json)
    assert out["status"] == "Succeeded", out
    pods = job_pods(client.CoreV1Api(kube.api), namespace, out["job"])
    assert {p.metadata.annotations.get(topology.REQUIRED_ANNOTATION) for p in pods} == {BLOCK}
    wls = kq.custom.list_namespaced_custom_object(GROUP, VERSION, namespace, "workloads")["items"]
    assignment = [ps.get("topologyAssignment") for w in wls
                  for ps in ((w.get("status") or {}).get("admission") or {}).get("podSetAssignments") or []]
    assert assignment and all(assignment), wls  # Kueue's TAS placed the pod set
    placed = _blocks(kube, [p.spec.node_name for p in pods])
    assert len(placed) == 3 and len(set(placed.values())) == 1, placed  # one block: the one with 3 hosts
    print(f"\nTAS: gang of 3 admitted into block {next(iter(placed.values()))} "
          f"(blocks {dict(per_block)}), GPU {GPU}")
