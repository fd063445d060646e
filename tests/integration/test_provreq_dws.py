"""capacity="flex-start" through GKE's Dynamic Workload Scheduler class (queued-provisioning.gke.io), served by the
GKE stand-in as GKE does (docs/sim.md section 12), with the provisioning-request backend chosen by detection.

Fault rows of issue 13: BookingExpired before the job starts (the train step requests the gang again), and
CapacityRevoked mid-training (spot-style recovery on a new request, resumed from the checkpoint). Steps run as the
controller's identity. Scenario times are real-world seconds (booking 600 s = 5 s here).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from kfp_gpu import provisioners
from kfp_gpu.checkpoint.store import CheckpointStore
from kfp_gpu.cluster import pytorchjob
from kfp_gpu.ownership import LABEL_RUN_ID, label_safe
from kfp_gpu.plan import provreq as plan
from kfp_gpu.providers.gke import GkeProvider
from kfp_gpu.spec import CapacityType, ProvisioningSpec, Recovery, Target
from kfp_gpu.steps import scale_up, teardown
from kfp_gpu.steps.capacity import Capacity
from kfp_gpu_rehearsal.devcluster.client import Kube
from kfp_gpu_rehearsal.sim import scenario as scenario_mod
from kfp_gpu_rehearsal.sim.server import SimServer
from tests.integration.standin_support import serving
from tests.integration.test_train_support import StepThread, job_json, running_pods, wait_until

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
POOL = "a100-80gb-dws-a"


@pytest.fixture
def sim(kube: Kube, request: pytest.FixtureRequest) -> Iterator[SimServer]:
    """The flex-start scenario; booking 600 s (5 s here) unless the test says ``@pytest.mark.booking_s(N)``: our
    own control loop is not time-compressed, so a test that re-creates a job on new capacity needs a longer one."""
    mark = request.node.get_closest_marker("booking_s")
    stockout = request.node.get_closest_marker("stockout")
    cluster = f"c{uuid.uuid4().hex[:6]}"
    data: dict[str, Any] = yaml.safe_load((ROOT / "kfp_gpu_rehearsal/sim/scenarios/flex-start.yaml").read_text())
    data["cluster"] = cluster
    for i, p in enumerate(data["pools"]):
        p["boot"] = {"dist": "lognormal", "median_s": 60, "sigma": 0.3, "seed": i}
    data["dws"] = {"accept_s": 10, "queue": {"dist": "fixed", "median_s": 60},
                   "booking_s": mark.args[0] if mark else 600}
    if stockout:  # a zone with no capacity: DWS keeps the request queued, then fails it after queue_timeout_s
        data["stockouts"] = [{"zone": stockout.args[0], "window": "always"}]
        data["dws"]["queue_timeout_s"] = 600
    yield from serving(SimServer(scenario_mod.from_dict(data), kube.kubeconfig), kube, cluster)


def _spec(sim: SimServer, ns: str, nodes: int = 2, zones: tuple[str, ...] = ("us-central1-a",),
          **more: Any) -> ProvisioningSpec:
    return ProvisioningSpec(
        "a100-80gb", nodes, capacity=CapacityType.FLEX_START, max_run_duration_s=3600.0, zones=zones,
        target=Target(kind="local", cluster=sim.state.scenario.cluster, region="us-central1", endpoint=sim.url,
                      namespace=ns),
        scale_up_deadline_s=60, **more)


def _requests(api: client.ApiClient, ns: str) -> list[dict[str, Any]]:
    return client.CustomObjectsApi(api).list_namespaced_custom_object(plan.GROUP, plan.VERSION, ns, plan.PLURAL)["items"]


def test_flex_start_is_detected_and_served_through_dws(kube, namespace, step_api, sim):
    spec = _spec(sim, namespace)
    choice = provisioners.detect(spec, step_api, GkeProvider.from_target(spec.target))
    assert choice.name == "provisioning-request" and POOL in choice.reason, choice
    run = f"run-{uuid.uuid4().hex[:6]}"
    t0 = time.time()
    cap = Capacity.from_json(scale_up.run(spec, run, "", api=step_api).output_json)
    took = time.time() - t0
    assert cap.extra["class"] == plan.QUEUED and cap.pools == (POOL,) and len(cap.nodes) == 2, cap
    (req,) = _requests(kube.api, namespace)
    assert req["spec"]["parameters"] == {"maxRunDurationSeconds": "3600"}
    tmpl = client.CoreV1Api(kube.api).read_namespaced_pod_template(req["metadata"]["name"], namespace)
    assert tmpl.template.spec.node_selector["cloud.google.com/gke-nodepool"] == POOL
    assert any(t.key == "cloud.google.com/gke-queued" for t in tmpl.template.spec.tolerations)
    # the pool was never resized by kfp-gpu: GKE refuses setSize on a queued pool; its nodes came from the request
    print(f"[dws] request -> gang of 2 Ready and claimed in {took:.2f}s")
    teardown.run(spec, run, "", api=step_api)
    assert _requests(kube.api, namespace) == []
    assert client.CoreV1Api(kube.api).list_namespaced_pod_template(namespace).items == []
    assert client.CoreV1Api(kube.api).list_node(label_selector=f"{LABEL_RUN_ID}={label_safe(run)}").items == []


def test_booking_expired_before_the_job_starts_is_requested_again(kube, namespace, step_api, sim, tmp_path):
    spec = _spec(sim, namespace, checkpoint_uri=str(tmp_path / "ckpt"))
    run = f"run-{uuid.uuid4().hex[:6]}"
    cap_json = scale_up.run(spec, run, "", api=step_api).output_json
    first = Capacity.from_json(cap_json)
    name = first.extra["requests"][-1]
    # the data steps take longer than the 10-minute booking: GKE removes the unconsumed nodes
    wait_until("BookingExpired", lambda: plan.read_state(next(
        (r.get("status", {}).get("conditions") for r in _requests(kube.api, namespace)
         if r["metadata"]["name"] == name), None)).state is plan.ReqState.BOOKING_EXPIRED, timeout=60)
    th = StepThread(spec=spec, run_id=run, capacity_json=cap_json, job_json=job_json(3.0), api=step_api)
    th.start()
    try:
        out = json.loads(th.outcome(180).output_json)
    finally:
        teardown.run(spec, run, "", api=step_api)
    assert out["status"] == "Succeeded", out
    final = out["capacity"]
    assert final["extra"]["rebooked"] == 1 and final["extra"]["requests"][-1] != name, final["extra"]
    assert out["preemptions"] == 0, out  # a lapsed booking is not a preemption
    assert not set(final["placements"][0]["nodes"]) & set(first.nodes)


@pytest.mark.booking_s(3600)  # 30 s here: the replacement job (old job torn down, new one created) takes ~5 s of
def test_capacity_revoked_mid_training_recovers_from_the_checkpoint(kube, namespace, step_api, sim, tmp_path):
    ckpt = tmp_path / "ckpt"
    spec = _spec(sim, namespace, checkpoint_uri=str(ckpt), recovery=Recovery(max_preemptions=2))
    run = f"run-{uuid.uuid4().hex[:6]}"
    cap_json = scale_up.run(spec, run, "", api=step_api).output_json
    cap = Capacity.from_json(cap_json)
    th = StepThread(spec=spec, run_id=run, capacity_json=cap_json, job_json=job_json(6.0), api=step_api)
    th.start()
    job = pytorchjob.job_name(run, "train")
    try:
        wait_until("2 pods running", lambda: running_pods(kube.core, namespace, job, 2), timeout=90)
        CheckpointStore(str(ckpt)).save(15, {"w": b"15"}, meta={"loss": 3.0})
        revoked = sim.revoke_provisioning(namespace, cap.extra["requests"][-1])
        assert sorted(revoked) == sorted(cap.nodes)
        out = json.loads(th.outcome(240).output_json)
    finally:
        teardown.run(spec, run, "", api=step_api)
    assert out["status"] == "Succeeded" and out["preemptions"] == 1, out
    p = out["ledger"]["preemptions"][0]
    assert sorted(p["lost_nodes"]) == sorted(cap.nodes) and p["checkpoint_step"] == 15, p
    reqs = out["capacity"]["extra"]["requests"]
    assert len(reqs) == 2 and reqs[0] == cap.extra["requests"][-1], reqs  # the replacement came from a new request
    assert _requests(kube.api, namespace) == []


@pytest.mark.stockout("us-central1-a")
def test_a_failed_request_fails_over_to_the_next_zone(kube, namespace, step_api, sim):
    spec = _spec(sim, namespace, zones=("us-central1-a", "us-central1-b"))
    run = f"run-{uuid.uuid4().hex[:6]}"
    try:
        cap = Capacity.from_json(scale_up.run(spec, run, "", api=step_api).output_json)
        assert cap.pools == ("a100-80gb-dws-b",) and len(cap.nodes) == 2, cap
        (req,) = _requests(kube.api, namespace)  # zone a's request (Failed: WaitTimeExceeded) was deleted
        assert plan.read_state(req["status"]["conditions"]).state is plan.ReqState.PROVISIONED
    finally:
        teardown.run(spec, run, "", api=step_api)
