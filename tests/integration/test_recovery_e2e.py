"""Scale-up -> train -> spot preemption by the GKE stand-in -> replace.reprovision -> resume, all real."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client

from kfp_gpu.checkpoint.store import CheckpointStore
from kfp_gpu.cluster import pytorchjob
from kfp_gpu.providers.gke import GkeProvider
from kfp_gpu.spec import CapacityType, ProvisioningSpec, Recovery, Target
from kfp_gpu.steps import scale_up, teardown
from kfp_gpu.steps.capacity import Capacity
from kfp_gpu_rehearsal.devcluster.client import Kube
from kfp_gpu_rehearsal.sim.server import SimServer
from tests.integration.gke_world_support import default_world
from tests.integration.test_train_support import StepThread, job_json, running_pods, wait_until

pytestmark = pytest.mark.integration


@pytest.fixture
def sim(kube: Kube) -> Iterator[SimServer]:
    yield from default_world(kube)


def test_sim_preemption_recovers_through_reprovision(
    kube: Kube, namespace: str, step_api: client.ApiClient, sim: SimServer, tmp_path: Path,
) -> None:
    ckpt = tmp_path / "ckpt"
    spec = ProvisioningSpec(
        "a100-80gb", 4, capacity=CapacityType.SPOT,
        target=Target(kind="local", cluster=sim.state.scenario.cluster, region="us-central1", endpoint=sim.url,
                      namespace=namespace),
        zones=("us-central1-a", "us-central1-b"), scale_up_deadline_s=60, checkpoint_uri=str(ckpt),
        recovery=Recovery(max_preemptions=2),
    )
    run = f"run-{uuid.uuid4().hex[:6]}"
    provider = GkeProvider.from_target(spec.target)
    cap_json = scale_up.run(spec, run, "", api=step_api, provider=provider).output_json
    cap = Capacity.from_json(cap_json)
    th = StepThread(spec=spec, run_id=run, capacity_json=cap_json, job_json=job_json(6.0), api=step_api)
    th.start()  # reprovision=None: the real replace.reprovision against the stand-in
    job = pytorchjob.job_name(run, "train")
    try:
        wait_until("4 pods running", lambda: running_pods(kube.core, namespace, job, 4), timeout=90)
        CheckpointStore(str(ckpt)).save(15, {"w": b"15"}, meta={"loss": 3.0})
        victim = cap.nodes[1]
        t0 = time.time()
        sim.preempt(victim)
        out = json.loads(th.outcome(240).output_json)
        targets = {name: p.target for name, p in sim.state.pools.items() if p.target}
    finally:
        teardown.run(spec, run, "", api=step_api, provider=provider)
    assert out["status"] == "Succeeded" and out["preemptions"] == 1, out
    p = out["ledger"]["preemptions"][0]
    assert p["lost_nodes"] == [victim] and p["checkpoint_step"] == 15
    # the instance group kept its target and recreated the VM under its own name: that Node, claimed again,
    # is the replacement; nothing else was added (over-provisioning would show as a larger target)
    assert p["replacement_nodes"] == [victim], p
    assert sorted(out["capacity"]["placements"][0]["nodes"]) == sorted(cap.nodes)
    assert sum(targets.values()) == 4, targets
    assert p["decided_at"] - t0 < 1.0
    print(f"\nsim preemption -> decision: {(p['decided_at'] - t0) * 1000:.1f} ms; "
          f"decision -> resumed gang running: {p['time_to_resume_s']:.2f} s")
