"""Stall detection when Kueue forms the gang at admission (the ``kueue-admission`` backend: the capacity has no
nodes; the nodes the job's pods bind to become the gang), against the real Kueue controller and the rehearsal
trainer's progress world (``training`` key, tests/integration/test_stall_hang.py's ``world``).

A Kueue user gets the same detection as on the node-pool backend: the hung rank is found from the progress objects,
the gang restarts from the newest checkpoint and is re-admitted; a node whose rank stopped first twice is cordoned,
taken out of the adopted gang, and the re-admitted job lands elsewhere.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from kfp_gpu.cluster import ledger, pytorchjob
from kfp_gpu.providers.base import PoolRef
from kfp_gpu.spec import Health, ProvisioningSpec, Recovery
from kfp_gpu.steps.capacity import Capacity
from kfp_gpu_rehearsal.devcluster.client import Kube
from kfp_gpu_rehearsal.sim.clock import expand
from kfp_gpu_rehearsal.sim.dws import SIM_CLUSTER_LABEL
from tests.integration import test_kueue_preflight, test_stall_hang
from tests.integration.gke_world_support import POOL, ZONE, ready_gpu_nodes
from tests.integration.test_kueue_preflight import GPU, Kueue
from tests.integration.test_stall_hang import (
    CKPT_STEP,
    HANG_AFTER_S,
    HANGS,
    OWNER,
    REPAIR_SCALE,
    STEP_S,
    _spec,
    _template,
)
from tests.integration.test_train_support import StepThread, running_pods, wait_until

pytestmark = pytest.mark.integration
kq = test_kueue_preflight.kq
world = test_stall_hang.world
NODES = 2


def _admission_gang(kq: Kueue, sim: Any, namespace: str, ckpt: Path, run: str, max_preemptions: int = 2,
                    probe: bool = False) -> tuple[ProvisioningSpec, Capacity]:
    """A ClusterQueue whose flavor selects the world's nodes only, a LocalQueue, and the kueue-admission capacity
    (no nodes: the gang forms when Kueue admits the job)."""
    cluster = sim.state.scenario.cluster
    flavor = kq.flavor("stall", {"cloud.google.com/gke-accelerator": "nvidia-h100-80gb", SIM_CLUSTER_LABEL: cluster})
    cq = kq._cluster("clusterqueues", "ClusterQueue", "stall", {"namespaceSelector": {}, "resourceGroups": [
        {"coveredResources": [GPU], "flavors": [{"name": flavor, "resources": [
            {"name": GPU, "nominalQuota": str(8 * NODES)}]}]}]})
    kq.wait_active(cq)
    lq = kq.local_queue("team", cq)
    spec = _spec(sim, namespace, ckpt).replace(nodes=NODES, recovery=Recovery(max_preemptions=max_preemptions),
                                               health=Health(probe=probe))
    cap = Capacity(run, (), 8, "nvidia-h100-80gb", True, "",
                   {"provisioner": "kueue-admission", "queue": lq, "cluster_queue": cq}, namespace=namespace)
    return spec, cap


def test_rank_hang_under_kueue_admission_is_a_stall_and_the_gang_restarts_from_the_checkpoint(
    kube: Kube, namespace: str, kq: Kueue, step_api: client.ApiClient, world: Any, tmp_path: Path,
) -> None:
    sim, _, nodes = world(NODES, HANGS, scale=REPAIR_SCALE)  # the world's gang checkpoints every 50 steps itself
    ckpt, run = tmp_path / "ckpt", f"run-{uuid.uuid4().hex[:6]}"
    spec, cap = _admission_gang(kq, sim, namespace, ckpt, run, probe=True)
    th = StepThread(spec=spec, run_id=run, capacity_json=cap.to_json(), job_json=_template(10.0).to_json(),
                    api=step_api)
    th.start()
    job = pytorchjob.job_name(run, "train")
    try:
        first = wait_until("2 ranks running", lambda: running_pods(kube.core, namespace, job, NODES), timeout=90)
        victim = next(p for p in first if p.metadata.name.endswith("worker-0"))  # rank 1
        out = json.loads(th.outcome(120).output_json)
    finally:
        th.join(1)
    assert out["status"] == "Succeeded", out
    (stall,) = out["ledger"]["stalls"]
    assert stall["first_stopped"] == [1] and stall["checkpoint_step"] == CKPT_STEP, stall
    assert stall["first_stopped_nodes"] == {"1": victim.spec.node_name}, stall
    assert out["ledger"]["budget"]["preemptions"] == 1 and out["attempts"] == 2, out
    assert len(out["ledger"]["admissions"]) == 2  # the restarted job went through the queue again
    assert sorted(out["ledger"]["adopted_nodes"][0]) == sorted(nodes)
    # the probe cannot run before a gang that forms at admission: said once, not passed silently
    [skipped] = out["ledger"]["health"]
    assert skipped["action"] == "skipped" and "gang_forms_at_admission" in skipped["message"], skipped
    print(f"\nrank hang under kueue admission: stall after {expand(stall['timeout_s']):.0f}s (world) timeout, "
          f"restarted from step {CKPT_STEP} through LocalQueue {cap.extra['queue']}")


def test_rank_hang_twice_on_one_node_under_kueue_admission_cordons_it_out_of_the_gang(
    kube: Kube, namespace: str, kq: Kueue, step_api: client.ApiClient, world: Any, tmp_path: Path,
) -> None:
    sim, prov, nodes = world(NODES, {"step_s": STEP_S, "hang": {"rank": 1, "after_s": HANG_AFTER_S, "times": 3,
                                                                 "sticky": True}}, scale=REPAIR_SCALE)
    ckpt, run = tmp_path / "ckpt", f"run-{uuid.uuid4().hex[:6]}"
    spec, cap = _admission_gang(kq, sim, namespace, ckpt, run, max_preemptions=4)  # 2 stalls, room for 1 more
    th = StepThread(spec=spec, run_id=run, capacity_json=cap.to_json(), job_json=_template(10.0).to_json(),
                    api=step_api)
    th.start()
    try:
        def stalls() -> int:
            return len((ledger.read(kube.api, namespace, run, "train") or {}).get("stalls") or [])
        wait_until("two stalls recorded", lambda: stalls() >= 2, timeout=120)
        # the autoscaler's answer to the re-admitted job (Kueue's ProvisioningRequest): one more node in the world
        prov.resize(PoolRef(POOL, ZONE), NODES + 1, OWNER)
        out = json.loads(th.outcome(180).output_json)
    finally:
        th.join(1)
    spare = set(ready_gpu_nodes(kube, sim.state.scenario.cluster)) - set(nodes)
    bad = sim.progress_world.bad_nodes[(namespace, pytorchjob.job_name(run, "train"))]
    assert out["status"] == "Succeeded", out
    entries = [{k: v for k, v in e.items() if k != "logs"} for e in out["ledger"]["stalls"]]
    first, second, *later = entries
    assert set(first["first_stopped_nodes"].values()) == {bad} == set(second["first_stopped_nodes"].values()), entries
    assert "cordoned" not in first and second["cordoned"] == [bad], second
    # The world runs 60x (the stall timeout's 120 s floor is 2 wall seconds), so a loaded machine can add a stall
    # (seen once in CI: a third stall and admission, its entry not printed then; not reproduced in 6 runs here, 3 of
    # them beside 3 busy loops). One more stall is allowed for; it must not be the bad node's (cordoned: no rank runs
    # there) and must cordon nothing.
    assert len(later) <= 1 and all(bad not in e["first_stopped_nodes"].values() and "cordoned" not in e
                                   for e in later), entries
    assert second["slot_released"] is False  # Kueue's request, not the run's: cordoned, left to the autoscaler
    node = kube.core.read_node(bad)
    assert node.spec.unschedulable is True
    last = out["ledger"]["adopted_nodes"][-1]
    assert bad not in last and len(last) == NODES and spare <= set(last), (out["ledger"]["adopted_nodes"], spare)
    print(f"\nrank hang twice on {bad} under kueue admission: cordoned; the last attempt ran on {last}"
          + "".join(f"; one more stall (the machine): {e['first_stopped_nodes']} {e.get('timeout_s')}" for e in later))
