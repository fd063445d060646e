"""Scale-up -> GPU health gate -> train, all real, against the GKE stand-in whose scenario gives a pool a node born
with a bad GPU (gpu_faults.born_bad): the probe finds it, the real node-pool backend replaces it, the job runs on
healthy nodes only."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client

from kfp_gpu.cluster import pytorchjob
from kfp_gpu.providers.gke import GkeProvider
from kfp_gpu.spec import CapacityType, Health, ProvisioningSpec, Target
from kfp_gpu.steps import scale_up, teardown
from kfp_gpu.steps.capacity import Capacity
from kfp_gpu_rehearsal.devcluster.client import Kube
from kfp_gpu_rehearsal.sim.server import SimServer
from tests.integration.gke_world_support import default_world
from tests.integration.test_train_support import StepThread, job_json, job_pods

pytestmark = pytest.mark.integration
POOL = "a100-80gb-spot-a"


@pytest.fixture
def sim(kube: Kube) -> Iterator[SimServer]:
    born_bad = {"pool": POOL, "count": 1, "kind": "dcgm", "crash_after_s": 120}
    yield from default_world(kube, gpu_faults={"born_bad": [born_bad]})


def test_health_born_bad_node_replaced_by_the_node_pool_backend(
    kube: Kube, namespace: str, step_api: client.ApiClient, sim: SimServer, tmp_path: Path,
) -> None:
    spec = ProvisioningSpec(
        "a100-80gb", 2, capacity=CapacityType.SPOT,
        target=Target(kind="local", cluster=sim.state.scenario.cluster, region="us-central1", endpoint=sim.url,
                      namespace=namespace),
        zones=("us-central1-a",), scale_up_deadline_s=60, checkpoint_uri=str(tmp_path / "ckpt"),
        health=Health(probe=True, probe_timeout_s=30.0),
    )
    run = f"run-{uuid.uuid4().hex[:6]}"
    provider = GkeProvider.from_target(spec.target)
    cap_json = scale_up.run(spec, run, "", api=step_api, provider=provider).output_json
    first = Capacity.from_json(cap_json).nodes
    bad = [n for n in first if (kube.core.read_node(n).metadata.annotations or {}).get("kfp-gpu.io/sim-gpu-fault")]
    assert len(bad) == 1, first  # the world made the pool's first node bad
    th = StepThread(spec=spec, run_id=run, capacity_json=cap_json, job_json=job_json(2.0), api=step_api)
    th.start()  # reprovision=None: the real node-pool backend against the stand-in
    try:
        out = json.loads(th.outcome(120).output_json)
        target = sim.state.pools[POOL].target
        placed = sorted(p.spec.node_name for p in job_pods(kube.core, namespace, pytorchjob.job_name(run, "train")))
    finally:
        teardown.run(spec, run, "", api=step_api, provider=provider)
    assert out["status"] == "Succeeded" and out["attempts"] == 1 and out["preemptions"] == 0, out
    health = out["ledger"]["health"]  # the step's output (teardown removed the ledger ConfigMaps)
    assert [r["action"] for r in health] == ["replace", "pass"], health
    assert health[0]["bad"] == [{"node": bad[0], "reason": "dcgmi diag failed"}]
    replacement = health[0]["replacement_nodes"]
    assert len(replacement) == 1 and replacement[0] not in first, health
    assert placed == sorted([n for n in first if n != bad[0]] + replacement), placed
    assert bad[0] not in sim.nodes(POOL)  # its VM was deleted (deleteInstances), not left running cordoned
    # the bad VM's slot was given back (deleteInstances), and one VM was added: the pool holds the gang, no more
    assert target == 2, target
