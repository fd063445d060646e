"""The compute-class backend on the local cluster: the controller's identity creates a GKE custom ComputeClass from
the spec's capacity chain, and the GKE stand-in's node auto-provisioning (kfp_gpu_rehearsal/sim/computeclass.py, docs/sim.md
"ComputeClass") walks its rules for the gang's placeholder pods.

Fault rows of issue 31: reservation exhausted -> flex-start; flex-start not obtained in time -> spot; spot stockout
-> on-demand; activeMigration back to the preferred rule when it frees up. Scenario times are real-world seconds
(TIME_SCALE 120: 10 min = 5 s here).
"""

from __future__ import annotations

import copy
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from kfp_gpu import provisioners
from kfp_gpu.cluster import computeclass as api_cc
from kfp_gpu.ownership import LABEL_RUN_ID, label_safe
from kfp_gpu.plan import computeclass as plan
from kfp_gpu.spec import ProvisioningSpec, Target
from kfp_gpu.steps import scale_up, teardown
from kfp_gpu.steps.capacity import Capacity
from kfp_gpu_rehearsal.devcluster import computeclass_crd, worldtime
from kfp_gpu_rehearsal.devcluster.client import Kube
from kfp_gpu_rehearsal.sim import scenario as scenario_mod
from kfp_gpu_rehearsal.sim.server import SimServer
from tests.integration.standin_support import serving
from tests.integration.test_train_support import swapped_after_two_stalls, wait_until
from tests.sim._helpers import default_dict

pytestmark = pytest.mark.integration
ZONE = "us-central1-a"


@pytest.fixture(scope="module")
def computeclass_api(kube: Kube) -> None:
    """GKE serves the ComputeClass CRD in every cluster: install it (additive, idempotent)."""
    computeclass_crd.install(kube.api)


@pytest.fixture
def world(kube: Kube, computeclass_api: None, request: pytest.FixtureRequest) -> Iterator[SimServer]:
    """A GKE stand-in with an exhausted reservation ``res-a`` in us-central1-a; ``@pytest.mark.world(queue_s=...,
    stockouts=[...], training={...}, scale=...)`` sets flex-start obtainability, stockouts, the rehearsal trainer
    (scenario key ``training``) and the world's time compression."""
    mark = request.node.get_closest_marker("world")
    opts: dict[str, Any] = dict(mark.kwargs) if mark else {}
    if "scale" in opts:  # the one name: the world and the stand-in API read it
        request.getfixturevalue("monkeypatch").setattr(worldtime, "TIME_SCALE", opts["scale"])
    cluster = f"c{uuid.uuid4().hex[:6]}"
    data = copy.deepcopy(default_dict())
    data["cluster"] = cluster
    data["pools"] = [{"name": "a100-dws-a", "zone": ZONE, "accelerator": "a100-80gb", "max_nodes": 4,
                      "queued_provisioning": {"enabled": True}, "autoscaling": {"enabled": True},
                      "boot": {"dist": "fixed", "median_s": 60}}] if opts.get("dws_pool") else []
    data["reservations"] = [{"name": "res-a", "zone": ZONE, "accelerator": "a100-80gb", "count": 2, "in_use": 2,
                             "specific": True}]
    data["dws"] = {"accept_s": 10, "queue": {"dist": "fixed", "median_s": opts.get("queue_s", 120)}}
    data["stockouts"] = opts.get("stockouts", [])
    if "training" in opts:
        data["training"] = opts["training"]
    yield from serving(SimServer(scenario_mod.from_dict(data), kube.kubeconfig), kube, cluster)


def _spec(sim: SimServer, ns: str, capacity: str, fallback: tuple[str, ...], nodes: int = 1, deadline: float = 25,
          **more: Any) -> ProvisioningSpec:
    return ProvisioningSpec("a100-80gb", nodes, capacity=capacity, fallback=fallback, zones=(ZONE,),
                            reservation="res-a" if "reservation" in (capacity, *fallback) else "",
                            target=Target(kind="local", cluster=sim.state.scenario.cluster, region="us-central1",
                                          endpoint=sim.url, namespace=ns),
                            scale_up_deadline_s=deadline, **more)


def _node_labels(api: client.ApiClient, cap: Capacity) -> list[dict[str, str]]:
    core = client.CoreV1Api(api)
    return [core.read_node(n).metadata.labels or {} for n in cap.nodes]


def _acquire(step_api: client.ApiClient, spec: ProvisioningSpec) -> tuple[str, Capacity, float]:
    run = f"run-{uuid.uuid4().hex[:6]}"
    t0 = time.time()
    cap = Capacity.from_json(scale_up.run(spec, run, "", api=step_api).output_json)
    return run, cap, time.time() - t0


def test_computeclass_reservation_exhausted_falls_to_flex_start(kube, namespace, step_api, world):
    spec = _spec(world, namespace, "reservation", ("flex-start", "spot", "on-demand"))
    choice = provisioners.detect(spec, step_api, None)
    assert choice.name == "compute-class" and "reservation > flex-start > spot > on-demand" in choice.reason, choice
    run, cap, took = _acquire(step_api, spec)
    try:
        name = plan.class_name(run)
        cls = api_cc.get_class(kube.api, name)
        assert cls is not None and [plan.capacity_of(r) for r in cls["spec"]["priorities"]] == [
            "reservation", "flex-start", "spot", "on-demand"]
        assert cap.extra["provisioner"] == "compute-class" and len(cap.nodes) == 1, cap
        (labels,) = _node_labels(kube.api, cap)
        assert labels[plan.CLASS_LABEL] == name and labels.get("cloud.google.com/gke-flex-start") == "true", labels
        assert "cloud.google.com/reservation-name" not in labels
        assert any("rule 0 (reservation) backed off" in h for h in world.cc.snapshot()[name]["history"])
        print(f"[computeclass] reservation exhausted -> flex-start node Ready and claimed in {took:.2f}s")
    finally:
        teardown.run(spec, run, "", api=step_api)
    assert api_cc.get_class(kube.api, plan.class_name(run)) is None
    assert client.CoreV1Api(kube.api).list_node(label_selector=f"{LABEL_RUN_ID}={label_safe(run)}").items == []


@pytest.mark.world(queue_s=3600)
def test_computeclass_flex_start_queue_timeout_falls_to_spot(kube, namespace, step_api, world):
    spec = _spec(world, namespace, "flex-start", ("spot", "on-demand"))
    run, cap, took = _acquire(step_api, spec)
    try:
        (labels,) = _node_labels(kube.api, cap)
        hist = world.cc.snapshot()[plan.class_name(run)]["history"]
        assert any("(flex-start) not obtained in 900s" in h for h in hist), (labels, world.cc.snapshot())
        # the next rung, spot, gives the node; on a loaded machine the spot VM itself may outlast
        # --max-node-provision-time in wall time, and then the class rightly goes on to on-demand (history says so)
        spot_stuck = any("(spot) VM" in h and "not created" in h for h in hist)
        assert labels.get("cloud.google.com/gke-spot") == "true" or spot_stuck, (sorted(labels.items()), hist)
        assert "cloud.google.com/gke-flex-start" not in labels, labels
        assert took >= 7.0  # flex-start was waited for up to --max-node-provision-time (15 min = 7.5 s here)
        print(f"[computeclass] flex-start timeout -> spot node Ready and claimed in {took:.2f}s")
    finally:
        teardown.run(spec, run, "", api=step_api)


@pytest.mark.world(stockouts=[{"zone": ZONE, "window": "always", "provisioning": "spot"}])
def test_computeclass_spot_stockout_falls_to_on_demand(kube, namespace, step_api, world):
    spec = _spec(world, namespace, "spot", ("on-demand",), nodes=2)
    run, cap, took = _acquire(step_api, spec)
    try:
        labels = _node_labels(kube.api, cap)
        assert len(labels) == 2 and all("cloud.google.com/gke-spot" not in lab for lab in labels), labels
        print(f"[computeclass] spot stockout -> 2 on-demand nodes Ready and claimed in {took:.2f}s")
    finally:
        teardown.run(spec, run, "", api=step_api)


@pytest.mark.world(stockouts=[{"zone": ZONE, "start_s": 0, "end_s": 600, "provisioning": "spot"}])
def test_computeclass_active_migration_returns_to_the_preferred_rule(kube, namespace, step_api, world):
    spec = _spec(world, namespace, "spot", ("on-demand",), active_migration=True)
    run, cap, _ = _acquire(step_api, spec)
    name = plan.class_name(run)
    try:
        (old,) = cap.nodes
        assert "cloud.google.com/gke-spot" not in _node_labels(kube.api, cap)[0]  # spot is stocked out for 5 s
        core = client.CoreV1Api(kube.api)

        def migrated() -> bool:
            nodes = core.list_node(label_selector=f"{plan.CLASS_LABEL}={name}").items
            return [n.metadata.labels.get("cloud.google.com/gke-spot") for n in nodes] == ["true"]

        wait_until("the class's node moved to spot", migrated, timeout=20)
        assert not any(n.metadata.name == old for n in core.list_node(label_selector=plan.CLASS_LABEL).items)
        assert any("migrated" in h for h in world.cc.snapshot()[name]["history"])
    finally:
        teardown.run(spec, run, "", api=step_api)



@pytest.mark.world(dws_pool=True, queue_s=60)
def test_computeclass_multi_node_flex_start_goes_through_queued_provisioning(kube, namespace, step_api, world):
    """A ComputeClass flexStart rule adds nodes one at a time: a gang of 2 gets flex-start all at once from a
    queued-provisioning ProvisioningRequest instead, and the class keeps only the other rungs."""
    from kfp_gpu.plan import provreq

    spec = _spec(world, namespace, "flex-start", ("spot", "on-demand"), nodes=2, max_run_duration_s=3600.0)
    run, cap, took = _acquire(step_api, spec)
    try:
        assert cap.extra["class"] == provreq.QUEUED and cap.pools == ("a100-dws-a",) and len(cap.nodes) == 2, cap
        assert api_cc.get_class(kube.api, plan.class_name(run)) is None  # the class was not needed
        print(f"[computeclass] 2-node flex-start through queued provisioning in {took:.2f}s")
    finally:
        teardown.run(spec, run, "", api=step_api)


def test_computeclass_through_the_gang_api(kube, computeclass_api, tenant):
    """As a pipeline runs it: the tenant's steps write the GpuGang; the controller (its own ServiceAccount, the only
    one that may write the cluster-scoped class) creates the ComputeClass and claims what GKE brings."""
    from tests.integration.controller_support import new_run

    t = tenant(stockouts=[{"zone": ZONE, "window": "always", "provisioning": "spot"}])
    spec = ProvisioningSpec("a100-80gb", 2, capacity="spot", fallback=("on-demand",), zones=(ZONE,),
                            scale_up_deadline_s=25, target=Target(kind="local", cluster=t.cluster, region="us-central1",
                                                                  endpoint=t.sim.url, namespace=t.ns))
    run = new_run()
    for step in ("preflight", "warm_pool", "scale_up"):
        try:
            t.step(step, spec, run)
        except Exception as exc:
            raise AssertionError(f"{step}: {exc}\ncontroller log:\n{t.controller_log()}") from exc
    st = (t.gang(run) or {}).get("status") or {}
    assert st.get("phase") == "Ready" and st.get("ready") == "2/2" and st.get("backend") == "compute-class", st
    cls = api_cc.get_class(kube.api, plan.class_name(run))
    assert cls is not None and [plan.capacity_of(r) for r in cls["spec"]["priorities"]] == ["spot", "on-demand"]
    core = client.CoreV1Api(kube.api)
    labels = [core.read_node(n).metadata.labels for n in st["gangNodes"]]
    assert all(lab[plan.CLASS_LABEL] == plan.class_name(run) and "cloud.google.com/gke-spot" not in lab
               for lab in labels), labels
    t.step("teardown", spec, run)
    assert api_cc.get_class(kube.api, plan.class_name(run)) is None and t.claimed(run) == []


@pytest.mark.world(stockouts=[{"zone": ZONE, "window": "always", "provisioning": "spot"}])
def test_computeclass_job_runs_on_the_class_nodes(kube, namespace, step_api, world, tmp_path):
    """The train step's pods select the class and tolerate its taint (the stand-in adds no toleration: GKE's webhook
    would), and run on the nodes the class brought."""
    import json

    from tests.integration.test_train_support import StepThread, job_json

    spec = _spec(world, namespace, "spot", ("on-demand",), nodes=2, checkpoint_uri=str(tmp_path / "ckpt"))
    run = f"run-{uuid.uuid4().hex[:6]}"
    cap_json = scale_up.run(spec, run, "", api=step_api).output_json
    th = StepThread(spec=spec, run_id=run, capacity_json=cap_json, job_json=job_json(2.0), api=step_api)
    th.start()
    try:
        out = json.loads(th.outcome(120).output_json)
    finally:
        teardown.run(spec, run, "", api=step_api)
    assert out["status"] == "Succeeded" and out["preemptions"] == 0, out
    assert sorted(out["capacity"]["placements"][0]["nodes"]) == sorted(Capacity.from_json(cap_json).nodes)


@pytest.mark.world(scale=60.0, training={"step_s": 2.0, "checkpoint_every": 50,
                                         "hang": {"rank": 1, "after_s": 240.0, "times": 3, "sticky": True}})
def test_computeclass_rank_hang_twice_on_one_node_cordons_it_and_the_class_brings_a_replacement(
        kube, namespace, step_api, world, tmp_path):
    """GKE's autoscaler owns a class's nodes (the contract's ``releases_one_node`` is False): the node whose rank is
    first to stop in two stalls is cordoned and marked for the swap, and the replacement comes from the class (its
    placeholder scales a node up), not from a call that frees one node. World at 60 (the stall tests' REPAIR_SCALE):
    the ranks train 9 s (540 s world), a sticky hang on one node 240 s after each rendezvous."""
    import json
    import threading

    from kfp_gpu.cluster import pytorchjob
    from kfp_gpu.job import JobTemplate
    from kfp_gpu.ownership import SWAP_OUT_ANNOTATION
    from kfp_gpu.spec import Recovery
    from kfp_gpu_rehearsal.sim.progress import STEP_ANNOTATION
    from kfp_gpu_rehearsal.sim.ranks import PG_TIMEOUT_ANNOTATION
    from tests.integration.test_train_support import StepThread, job_pods

    spec = _spec(world, namespace, "spot", ("on-demand",), nodes=2, deadline=60, checkpoint_uri=str(tmp_path / "ckpt"),
                 recovery=Recovery(max_preemptions=3))
    template = JobTemplate(name="train", image="busybox", command=("true",), checkpoint_every=50,
                           annotations={pytorchjob.SIM_DURATION_ANNOTATION: "9s", STEP_ANNOTATION: "2",
                                        PG_TIMEOUT_ANNOTATION: "600"})
    run = f"run-{uuid.uuid4().hex[:6]}"
    job = pytorchjob.job_name(run, "train")
    cap_json = scale_up.run(spec, run, "", api=step_api).output_json
    first = Capacity.from_json(cap_json).nodes
    stop, seen = threading.Event(), dict[str, str]()

    def follow_bad() -> None:  # the cordoned node's marks, read before the autoscaler may scale it down
        while not stop.wait(0.05) and not seen:
            name = world.progress_world.bad_nodes.get((namespace, job))
            try:
                node = kube.core.read_node(name) if name else None
            except client.exceptions.ApiException:
                continue
            if node is not None and node.spec.unschedulable:
                seen.update(node.metadata.annotations or {})

    follower = threading.Thread(target=follow_bad, daemon=True)
    follower.start()
    th = StepThread(spec=spec, run_id=run, capacity_json=cap_json, job_json=template.to_json(), api=step_api)
    th.start()
    try:
        out = json.loads(th.outcome(240).output_json)
        bad = world.progress_world.bad_nodes[(namespace, job)]
        placed = sorted(p.spec.node_name for p in job_pods(kube.core, namespace, job))
        left = [n for n in kube.core.list_node(field_selector=f"metadata.name={bad}").items]
    finally:
        stop.set()
        teardown.run(spec, run, "", api=step_api)
    new, final = swapped_after_two_stalls(out, bad, first)
    assert seen.get(SWAP_OUT_ANNOTATION) == "stall", seen
    assert bad not in placed and new in placed, (final, placed)
    assert out["ledger"]["budget"]["preemptions"] == 2  # two restarts; the third incarnation ran clean
    # left to GKE's autoscaler while the run goes on: no claim of the run, no scale-down protection (or gone already)
    for node in left:
        assert LABEL_RUN_ID not in (node.metadata.labels or {}), node.metadata.labels
        assert "cluster-autoscaler.kubernetes.io/scale-down-disabled" not in (node.metadata.annotations or {})
    print(f"\ncomputeclass: rank hang twice on {bad}: cordoned, the class brought {new}; "
          f"{'still there, unclaimed' if left else 'removed by the autoscaler'} when the job ended")


def test_computeclass_warm_pool_placeholders_are_the_gang(kube, namespace, step_api, world):
    """The warm pool's placeholders select the class (holds_placeholders): GKE scales up for them, and the scale-up
    claims those nodes without asking for more."""
    from kfp_gpu.spec import WarmPool
    from kfp_gpu.steps import warm_pool

    spec = _spec(world, namespace, "spot", ("on-demand",), nodes=2, warm_pool=WarmPool(nodes=2))
    run = f"run-{uuid.uuid4().hex[:6]}"
    name = plan.class_name(run)
    core = client.CoreV1Api(kube.api)
    try:
        warm_pool.run(spec, run, "", api=step_api)
        wait_until("the warm pool's 2 class nodes", lambda: len(core.list_node(
            label_selector=f"{plan.CLASS_LABEL}={name}").items) == 2, timeout=15)
        warm = {n.metadata.name for n in core.list_node(label_selector=f"{plan.CLASS_LABEL}={name}").items}
        cap = Capacity.from_json(scale_up.run(spec, run, "", api=step_api).output_json)
        assert set(cap.nodes) == warm, (cap.nodes, warm)
        time.sleep(1.0)  # a few autoscaler scans (10 s each = 0.08 s here): nothing more was asked for
        assert len(world.cc.snapshot()[name]["nodes"]) == 2, world.cc.snapshot()[name]
    finally:
        teardown.run(spec, run, "", api=step_api)


def test_computeclass_gang_of_16_makes_16_nodes(kube, namespace, step_api, world):
    """The placeholders are kept at the nodes still wanted while the gang gathers: none is left pending behind a
    claim (GKE's autoscaler would bring it a node of its own), so the class makes the gang and not a node more."""
    spec = _spec(world, namespace, "spot", ("on-demand",), nodes=16)
    run, cap, took = _acquire(step_api, spec)
    name = plan.class_name(run)
    try:
        assert len(cap.nodes) == 16, cap.nodes
        time.sleep(1.0)  # a dozen autoscaler scans (10 s each = 0.08 s here) after the gang was whole
        made = world.cc.snapshot()[name]["nodes"]
        assert len(made) == 16, (len(made), world.cc.snapshot()[name]["history"])
        print(f"[computeclass] a gang of 16 in {took:.2f}s: the class made {len(made)} nodes")
    finally:
        teardown.run(spec, run, "", api=step_api)


@pytest.mark.world(dws_pool=True, queue_s=36000)
def test_computeclass_multi_node_flex_start_not_obtained_falls_to_the_class(kube, namespace, step_api, world):
    """The queued-provisioning request gets half the deadline; when DWS has not provisioned by then, the request is
    withdrawn and the class (without its flex-start rule) takes the other rungs."""
    from kfp_gpu.plan import provreq

    spec = _spec(world, namespace, "flex-start", ("spot",), nodes=2, deadline=16, max_run_duration_s=3600.0)
    run, cap, took = _acquire(step_api, spec)
    try:
        labels = _node_labels(kube.api, cap)
        assert len(labels) == 2 and all(lab.get("cloud.google.com/gke-spot") == "true" for lab in labels), labels
        cls = api_cc.get_class(kube.api, plan.class_name(run))
        assert cls is not None and [plan.capacity_of(r) for r in cls["spec"]["priorities"]] == ["spot"]
        reqs = client.CustomObjectsApi(kube.api).list_namespaced_custom_object(
            provreq.GROUP, provreq.VERSION, namespace, provreq.PLURAL)["items"]
        assert reqs == [], reqs  # the queued request was withdrawn
        assert 8.0 <= took < 16.0, took  # waited its half (8 s) for DWS, then the class
        print(f"[computeclass] DWS not obtained in 8 s -> 2 spot nodes from the class in {took:.2f}s")
    finally:
        teardown.run(spec, run, "", api=step_api)
