"""A rank that hangs twice on one node of a ProvisioningRequest gang, on the real cluster-autoscaler (kwok provider).

The provisioning-request backend cannot give one node of a request back (a request's spec is immutable; the contract's
``releases_one_node`` is False), so the repeat offender of two stalls is cordoned and tainted out of the gang, its
claim dropped, and the replacement is asked for beside it (a second request). The rehearsal trainer
(:class:`kfp_gpu_rehearsal.sim.progress.ProgressWorld`, scenario key ``training``) plays a sticky hang: whichever rank
runs on that node hangs, in every incarnation of the job, until the job runs elsewhere.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from kfp_gpu.cluster import pytorchjob
from kfp_gpu.job import JobTemplate
from kfp_gpu.ownership import LABEL_RUN_ID, SWAP_OUT_ANNOTATION, label_safe
from kfp_gpu.plan import provreq as plan
from kfp_gpu.spec import CapacityType, ProvisioningSpec, Recovery, Target
from kfp_gpu.steps import scale_up, teardown
from kfp_gpu.steps.capacity import Capacity
from kfp_gpu_rehearsal.devcluster import ca_profile, worldtime
from kfp_gpu_rehearsal.devcluster.client import Kube
from kfp_gpu_rehearsal.sim.progress import STEP_ANNOTATION, ProgressWorld
from kfp_gpu_rehearsal.sim.ranks import PG_TIMEOUT_ANNOTATION
from kfp_gpu_rehearsal.sim.trainingspec import parse_training
from tests.integration.test_train_support import StepThread, job_pods, swapped_after_two_stalls

pytestmark = pytest.mark.integration
STEP_S = 2.0  # world seconds per training step
HANG_AFTER_S = 240.0  # world seconds after the rendezvous
SCALE = 60.0  # the stall tests' REPAIR_SCALE (tests/integration/test_stall_hang.py): restarts race the pg timeout
RUN_S = 9.0  # wall seconds a rank trains (540 s world): the hang at 240 s falls in it


def _requests(api: client.ApiClient, ns: str) -> list[str]:
    items = client.CustomObjectsApi(api).list_namespaced_custom_object(plan.GROUP, plan.VERSION, ns, plan.PLURAL)
    return [str(r["metadata"]["name"]) for r in items["items"]]


def test_rank_hang_twice_on_a_provisioning_request_node_cordons_it_and_asks_for_a_replacement_beside_it(
        kube: Kube, autoscaler: Any, namespace: str, step_api: client.ApiClient, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(worldtime, "TIME_SCALE", SCALE)
    training = parse_training({"step_s": STEP_S, "checkpoint_every": 50,
                               "hang": {"rank": 1, "after_s": HANG_AFTER_S, "times": 3, "sticky": True}})
    assert training is not None
    spec = ProvisioningSpec(
        "a100-80gb", 2, capacity=CapacityType.ON_DEMAND, zones=("us-central1-a",), scale_up_deadline_s=60.0,
        target=Target(kind="local", cluster=ca_profile.CLUSTER, region="us-central1", namespace=namespace,
                      provisioner="provisioning-request", tolerations=(ca_profile.TAINT,)),
        checkpoint_uri=str(tmp_path / "ckpt"), recovery=Recovery(max_preemptions=3))
    template = JobTemplate(name="train", image="busybox", command=("true",), checkpoint_every=50,
                           annotations={pytorchjob.SIM_DURATION_ANNOTATION: f"{RUN_S:g}s",
                                        STEP_ANNOTATION: f"{STEP_S:g}", PG_TIMEOUT_ANNOTATION: "600"})
    run = f"run-{uuid.uuid4().hex[:6]}"
    world = ProgressWorld(kube.api, training, cluster=ca_profile.CLUSTER)
    world.start()
    stop, seen_bad = threading.Event(), {}

    def follow_bad() -> None:  # the repeat offender as the cluster shows it once cordoned (CA may remove it later)
        while not stop.wait(0.05):
            name = world.bad_nodes.get((namespace, pytorchjob.job_name(run, "train")))
            if not name or "cordoned" in seen_bad:
                continue
            try:
                node = kube.core.read_node(name)
            except client.exceptions.ApiException:
                continue
            if node.spec.unschedulable:
                seen_bad["cordoned"] = {"swap_out": (node.metadata.annotations or {}).get(SWAP_OUT_ANNOTATION),
                                        "at": time.time()}

    follower = threading.Thread(target=follow_bad, daemon=True)
    follower.start()
    try:
        cap_json = scale_up.run(spec, run, "", api=step_api).output_json
        first = Capacity.from_json(cap_json).nodes
        th = StepThread(spec=spec, run_id=run, capacity_json=cap_json, job_json=template.to_json(), api=step_api)
        th.start()  # reprovision=None: the real provisioning-request backend asks CA for the replacement
        out = json.loads(th.outcome(240).output_json)
        bad = world.bad_nodes[(namespace, pytorchjob.job_name(run, "train"))]
        placed = sorted(p.spec.node_name for p in job_pods(kube.core, namespace, pytorchjob.job_name(run, "train")))
        requests_during = _requests(kube.api, namespace)
        left = kube.core.list_node(field_selector=f"metadata.name={bad}").items
    finally:
        stop.set()
        world.stop()
        teardown.run(spec, run, "", api=step_api)
    new, final = swapped_after_two_stalls(out, bad, first)  # a request's node cannot be given back one at a time
    assert bad not in placed and new in placed, placed  # the third incarnation ran on the survivor and the new node
    assert len(requests_during) == 2, requests_during  # the gang's request + the replacement's
    assert (seen_bad.get("cordoned") or {}).get("swap_out") == "stall", seen_bad  # cordoned, marked for the swap
    assert out["ledger"]["budget"]["preemptions"] == 2  # two restarts; the third incarnation ran clean
    assert all(LABEL_RUN_ID not in (n.metadata.labels or {}) for n in left), left  # left to CA, unclaimed (or gone)
    assert _requests(kube.api, namespace) == [] and not client.CoreV1Api(step_api).list_node(
        label_selector=f"{LABEL_RUN_ID}={label_safe(run)}").items  # teardown gave back the rest
    print(f"\nrank hang twice on {bad} (a provisioning-request node): cordoned, replaced by {new} through a second "
          f"request {requests_during}; {'still there, unclaimed' if left else 'removed by CA'} when the job ended")
