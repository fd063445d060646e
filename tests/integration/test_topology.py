"""Topology-aware gangs on the local cluster, with the GKE stand-in's nodes carrying GKE's block / sub-block / host
labels (kfp_gpu_rehearsal.sim.topology): a topology-required gang admitted by the real Kueue's TAS into one block; a
replacement kept in the survivors' block by the node-pool backend (no Kueue); a gang no block can hold refused at
preflight, naming the block sizes.
"""

from __future__ import annotations

import collections
import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from kfp_gpu import install
from kfp_gpu.cluster.capacity import Capacity
from kfp_gpu.errors import ProvisioningTimeout, QuotaExceeded
from kfp_gpu.job import JobTemplate
from kfp_gpu.plan import topology
from kfp_gpu.plan.kueue import GROUP, VERSION
from kfp_gpu.plan.quota import Verdict
from kfp_gpu.providers.gke import GkeProvider
from kfp_gpu.spec import CapacityType, ProvisioningSpec, Target
from kfp_gpu.steps.preflight import check, run_preflight
from kfp_gpu_rehearsal.devcluster.client import Kube
from kfp_gpu_rehearsal.sim import scenario as scenario_mod
from kfp_gpu_rehearsal.sim.server import SimServer
from kfp_gpu_rehearsal.sim.topology import BLOCK
from tests.integration import test_kueue_preflight
from tests.integration.test_kueue_preflight import Kueue
from tests.integration.test_train_support import ACCEL_LABEL, job_json, job_pods, make_capacity

pytestmark = pytest.mark.integration
kq = test_kueue_preflight.kq  # the Kueue-objects fixture (cluster-scoped ones unique per test, deleted afterwards)
ROOT = Path(__file__).resolve().parents[2]
POOL = "h100-80gb-a"
ZONE = "us-central1-a"


def _world(kube: Kube, topo: dict[str, int], pool_name: str = POOL, **pool: Any) -> SimServer:
    """The default scenario under a cluster name of its own, with a ``topology:`` block and ``pool`` changes to
    ``pool_name`` (an h100 pool of us-central1-a)."""
    data: dict[str, Any] = yaml.safe_load((ROOT / "kfp_gpu_rehearsal/sim/scenarios/default.yaml").read_text())
    data["cluster"] = f"t{uuid.uuid4().hex[:6]}"
    data["topology"] = topo
    for p in data["pools"]:
        if p["name"] == pool_name:
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


def _blocks(kube: Kube, names: list[str], *, gone_ok: bool = False) -> dict[str, str]:
    """Each node's block label; with ``gone_ok`` a node deleted since ``names`` was read is left out."""
    have = {n.metadata.name: n for n in client.CoreV1Api(kube.api).list_node().items}
    missing = [n for n in names if n not in have]
    assert gone_ok or not missing, f"nodes gone: {missing}"
    return {n: have[n].metadata.labels.get(BLOCK, "") for n in names if n in have}


def _tas_run(kube: Kube, namespace: str, kq: Kueue, worlds: list[SimServer], tmp_path: Path,
             step_api: client.ApiClient, job: str) -> tuple[dict[str, str], collections.Counter[str]]:
    """A topology-required gang of 3 through a Kueue TAS queue on 5 scattered nodes (blocks of 3 + 2). Returns the
    block of each pod's node and the world's nodes per block."""
    # 5 nodes of an unplaced pool scatter over two blocks of 4 hosts: 3 + 2
    sim = _world(kube, {"block_nodes": 4, "subblock_nodes": 2, "blocks": 2}, initial_size=5, max_nodes=5)
    worlds.append(sim)
    names = sim.nodes(POOL)
    per_block = collections.Counter(_blocks(kube, names).values())
    assert sorted(per_block.values()) == [2, 3], per_block
    # the admin's side: a Topology of GKE's levels, a flavor naming it (only this world's nodes), a queue
    topo = {**install.kueue_topology("gke")[0], "metadata": {"name": f"gke-{kq.suffix}"}}  # kfp-gpu install --kueue-topology gke
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

    res = train.run(spec, run_id, make_capacity(run_id, POOL, names, spot=False).to_json(), job_json=job,
                    api=step_api)
    out = json.loads(res.output_json)
    assert out["status"] == "Succeeded", out
    pods = job_pods(client.CoreV1Api(kube.api), namespace, out["job"])
    assert pods and {p.metadata.annotations.get(topology.REQUIRED_ANNOTATION) for p in pods} == {BLOCK}
    wls = kq.custom.list_namespaced_custom_object(GROUP, VERSION, namespace, "workloads")["items"]
    assignment = [ps.get("topologyAssignment") for w in wls
                  for ps in ((w.get("status") or {}).get("admission") or {}).get("podSetAssignments") or []
                  if ps.get("count", 1)]
    assert assignment and all(assignment), wls  # Kueue's TAS placed every pod set
    return _blocks(kube, [p.spec.node_name for p in pods]), per_block


def test_topology_required_gang_is_admitted_by_kueue_tas_into_one_block(
    kube: Kube, namespace: str, kq: Kueue, worlds: list[SimServer], tmp_path: Path, step_api: client.ApiClient,
) -> None:
    placed, per_block = _tas_run(kube, namespace, kq, worlds, tmp_path, step_api, job_json(2.0))
    assert len(placed) == 3 and len(set(placed.values())) == 1, placed  # one block: the one with 3 hosts
    print(f"\nTAS (PyTorchJob): gang of 3 admitted into block {next(iter(placed.values()))} (blocks {dict(per_block)})")


def test_topology_required_trainjob_is_admitted_by_kueue_tas_into_one_block(
    kube: Kube, trainer: Any, namespace: str, kq: Kueue, worlds: list[SimServer], tmp_path: Path,
    step_api: client.ApiClient,
) -> None:
    job = JobTemplate(name="train", image="busybox", command=("true",), checkpoint_every=10, kind="trainjob",
                      annotations={"kfp-gpu.io/sim-duration": "2s"}).to_json()
    placed, per_block = _tas_run(kube, namespace, kq, worlds, tmp_path, step_api, job)
    assert len(placed) == 3 and len(set(placed.values())) == 1, placed
    print(f"\nTAS (TrainJob): gang of 3 admitted into block {next(iter(placed.values()))} (blocks {dict(per_block)})")


def _spec(sim: SimServer, namespace: str, nodes: int, pool: str, *, spot: bool = False) -> ProvisioningSpec:
    return ProvisioningSpec(
        accelerator="h100-80gb", nodes=nodes, capacity=CapacityType.SPOT if spot else CapacityType.ON_DEMAND,
        topology="required", topology_level="block", zones=(ZONE,), scale_up_deadline_s=60,
        target=Target(kind="local", cluster=sim.state.scenario.cluster, region="us-central1", endpoint=sim.url,
                      namespace=namespace, pools=(pool,), provisioner="node-pool"))


def test_topology_gang_no_block_can_hold_is_refused_at_preflight_naming_the_block_sizes(
    kube: Kube, namespace: str, worlds: list[SimServer], step_api: client.ApiClient,
) -> None:
    # a full pool of 4 nodes in two blocks of 2 hosts: a gang of 3 fits the cluster, never one block
    sim = _world(kube, {"block_nodes": 2, "blocks": 2}, initial_size=4, max_nodes=4)
    worlds.append(sim)
    spec = _spec(sim, namespace, 3, POOL)
    res = run_preflight(spec, GkeProvider.from_target(spec.target), step_api, capacity_wait_s=1.0)
    checks = {c.name: c for c in res.cluster_checks}
    assert checks["gpu-capacity"].verdict is Verdict.FITS  # enough nodes: only the topology refuses it
    assert checks["topology"].verdict is Verdict.SHORT
    with pytest.raises(QuotaExceeded) as ei:
        check(res)
    msg = ei.value.message
    assert "fits no single block" in msg and "largest holds 2" in msg and "\n" not in msg
    blocks = sorted(set(_blocks(kube, sim.nodes(POOL)).values()))
    assert len(blocks) == 2 and all(f"{b}=2" in msg for b in blocks), msg
    fits = run_preflight(_spec(sim, namespace, 2, POOL), GkeProvider.from_target(spec.target), step_api,
                         capacity_wait_s=1.0)
    assert next(c for c in fits.cluster_checks if c.name == "topology").verdict is Verdict.FITS
    print(f"\npreflight refused: {msg[:240]}")


def test_topology_replacement_is_kept_in_the_survivors_block(
    kube: Kube, namespace: str, worlds: list[SimServer], step_api: client.ApiClient,
) -> None:
    # 4 spot nodes in two blocks of 2; the gang takes one block, the other block's 2 nodes stay free and Ready
    spot_pool = "h100-80gb-spot-a"
    sim = _world(kube, {"block_nodes": 2, "blocks": 2}, pool_name=spot_pool, initial_size=4, max_nodes=4,
                 boot={"dist": "fixed", "median_s": 60})
    worlds.append(sim)
    spec = _spec(sim, namespace, 2, spot_pool, spot=True)
    run_id = f"run-topo-{namespace}"
    from kfp_gpu.steps import replace, scale_up

    cap = Capacity.from_json(scale_up.run(spec, run_id, "", api=step_api).output_json)
    gang = list(cap.nodes)
    where = _blocks(kube, sim.nodes(spot_pool))
    home = {where[n] for n in gang}
    assert len(gang) == 2 and len(home) == 1, where
    others = [n for n, b in where.items() if b not in home]
    victim, survivor = gang
    uid = client.CoreV1Api(kube.api).read_node(victim).metadata.uid
    t0 = time.monotonic()
    sim.preempt(victim)  # GCE: the group recreates the VM under the same name, on a free host of its zone
    merged = replace.replace(spec, run_id, step_api, cap, [victim], zone_hint=ZONE, on_demand=False, attempt=1,
                             hook=None, lost_uids=[uid])
    took = time.monotonic() - t0
    now = _blocks(kube, list(merged.nodes))
    assert survivor in merged.nodes and len(merged.nodes) == 2, merged.nodes
    assert set(now.values()) == home and not set(merged.nodes) & set(others), (now, others)
    print(f"\nreplacement kept in block {next(iter(home))} in {took:.2f} s (free nodes elsewhere: {others})")


def test_topology_required_gang_from_a_scattering_pool_times_out_and_from_a_compact_pool_lands_in_one_block(
    kube: Kube, namespace: str, worlds: list[SimServer], step_api: client.ApiClient,
) -> None:
    # two empty blocks of 2 hosts: an unplaced pool's 2 new VMs take one host in each, a compact pool's share a block
    from kfp_gpu.steps import scale_up

    fixed = {"dist": "fixed", "median_s": 120}
    loose = _world(kube, {"block_nodes": 2, "blocks": 2}, max_nodes=2, boot=fixed)
    worlds.append(loose)
    spec = _spec(loose, namespace, 2, POOL).replace(scale_up_deadline_s=8.0)
    t0 = time.monotonic()
    with pytest.raises(ProvisioningTimeout) as ei:
        scale_up.run(spec, f"run-loose-{namespace}", "", api=step_api)
    waited = time.monotonic() - t0
    assert "no block held 2 Ready nodes (topology='required'; 2 Ready in all)" in ei.value.message, ei.value.message
    assert "compact placement pool" in ei.value.remediation

    compact = _world(kube, {"block_nodes": 2, "blocks": 2}, max_nodes=2, boot=fixed, placement_policy="compact")
    worlds.append(compact)
    cap = Capacity.from_json(scale_up.run(_spec(compact, namespace, 2, POOL), f"run-compact-{namespace}", "",
                                          api=step_api).output_json)
    blocks = _blocks(kube, list(cap.nodes))
    assert len(blocks) == 2 and len(set(blocks.values())) == 1, blocks
    print(f"\nscattering pool: refused after {waited:.1f} s (deadline 8 s); compact pool: one block {blocks}")


def test_topology_required_gang_whose_best_effort_compact_pool_spills_is_refused_never_started_across_blocks(
    kube: Kube, namespace: str, worlds: list[SimServer], step_api: client.ApiClient,
) -> None:
    # GKE COMPACT without a max distance is best effort (docs/sim.md, "Topology"): a pool of 3 in blocks of 2 puts
    # 2 nodes in its block and the third in another. Preflight cannot promise one block; scale-up never starts the
    # gang across two and gives the nodes back.
    from kfp_gpu.steps import scale_up

    fixed = {"dist": "fixed", "median_s": 120}
    pool = "h100-80gb-b"  # a pool (and zone) of its own: another world's h100-80gb-a nodes share this cluster
    sim = _world(kube, {"block_nodes": 2, "blocks": 3}, pool, max_nodes=3, boot=fixed, placement_policy="compact")
    worlds.append(sim)
    spec = _spec(sim, namespace, 3, pool).replace(scale_up_deadline_s=8.0, zones=("us-central1-b",))
    res = run_preflight(spec, GkeProvider.from_target(spec.target), step_api, capacity_wait_s=1.0)
    row = next(c for c in res.cluster_checks if c.name == "topology")
    assert row.verdict is Verdict.UNKNOWN and "best effort" in row.detail, (row.detail, row.remediation)
    with pytest.raises(ProvisioningTimeout) as ei:
        scale_up.run(spec, f"run-spill-{namespace}", "", api=step_api)
    assert "no block held 3 Ready nodes (topology='required'; 3 Ready in all)" in ei.value.message, ei.value.message
    spilled = collections.Counter(_blocks(kube, sim.nodes(pool), gone_ok=True).values())  # teardown may be deleting
    # the world did spill (all 3 still listed: 2 + 1), or teardown has already deleted some of them
    assert sum(spilled.values()) < 3 or sorted(spilled.values()) == [1, 2], spilled
    print(f"\nbest-effort compact pool spilled {dict(spilled)}: refused: {ei.value.message[:160]}")
