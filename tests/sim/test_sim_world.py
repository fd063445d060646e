"""The stand-in's world behaves like GKE/Compute in time (docs/sim.md, "World behaviour").

One test per behaviour, on virtual time (no sleeps): the world's timeline only moves when a test
advances it. The real google-cloud-* REST clients talk to the stand-in where the behaviour is visible
through the API. The seeded 5xx of the API layer is switched off here (it has its own tests).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from google.api_core import exceptions as gexc
from google.cloud import compute_v1, container_v1

from kfp_gpu_rehearsal.devcluster.worldtime import TIME_SCALE
from kfp_gpu_rehearsal.sim import SimServer, from_dict, load
from kfp_gpu_rehearsal.sim.clock import Timeline, compress
from kfp_gpu_rehearsal.sim.state import MemoryBackend, SimState
from tests.sim._helpers import CLUSTER, PARENT, PROJECT, REGION, client_kwargs, scenario

OPS = {"pending_s": 3, "set_size_s": 20, "delete_instances_s": 45}


@contextmanager
def world(**overrides: Any) -> Iterator[tuple[SimServer, Timeline, MemoryBackend]]:
    """A stand-in on virtual time with in-memory nodes; ``overrides`` change the default scenario."""
    sc = from_dict(scenario(**{"api": {"error_rate": 0.0}, "operations": OPS, **overrides}))
    backend, tl = MemoryBackend(), Timeline(virtual=True)
    sim = SimServer(sc, backend=MemoryBackend())
    sim.state.shutdown()
    sim.state = SimState(sc, backend, timeline=tl)
    sim.start()
    try:
        yield sim, tl, backend
    finally:
        sim.stop()


def pools(**changes: dict[str, Any]) -> list[dict[str, Any]]:
    """The default pools with per-pool changes, e.g. ``pools(**{"l4-a": {"initial_size": 2}})``."""
    out = scenario()["pools"]
    for p in out:
        p.update(changes.get(p["name"], {}))
    return out


def igm(pool: str, zone: str) -> str:
    return f"gke-{CLUSTER}-{pool}-grp"


def node(pool: str, i: int) -> str:
    return f"gke-{CLUSTER}-{pool}-{i:04d}"


def gke_op(cm: Any, name: str) -> Any:
    return cm.get_operation(name=f"projects/{PROJECT}/locations/{REGION}/operations/{name}")


def set_size(cm: Any, pool: str, n: int) -> Any:
    return cm.set_node_pool_size(request=container_v1.SetNodePoolSizeRequest(
        name=f"{PARENT}/nodePools/{pool}", node_count=n))


def real(seconds: float) -> float:
    """Stand-in seconds for real-world seconds (the one compression factor)."""
    return compress(seconds)


# ---- 0. one time-compression factor ---------------------------------------------------------------
def test_one_time_scale_compresses_real_world_durations() -> None:
    assert TIME_SCALE == 120.0 and compress(60.0) == 0.5
    sc = load()  # scenario durations stay in real-world seconds; the world compresses them
    assert sc.world.notice_s == 30.0 and sc.world.operations.set_size_s == 20.0
    assert sc.pool("h100-80gb-a").boot.median_s == 270.0


# ---- 1. boot latency: minutes, long tail ------------------------------------------------------------
@pytest.mark.parametrize("pool", ["a100-80gb-a", "h100-80gb-spot-b", "l4-c"])
def test_default_boot_latency_is_minutes_with_a_long_tail(pool: str) -> None:
    boot = load().pool(pool).boot
    rng = boot.sampler()
    xs = sorted(boot.sample(rng) for _ in range(4000))
    median, p99 = statistics.median(xs), xs[int(0.99 * len(xs))]
    assert 120 <= median <= 300, median  # GPU nodes: minutes from request to Node
    assert p99 / median > 2.2, (median, p99)  # the long tail field reports show
    assert xs[0] >= 60  # no GPU VM registers as a Node in under a minute


# ---- 2. Nodes appear when the VM boots; GPUs after the device plugin --------------------------------
def test_node_registers_after_boot_and_gpus_after_the_device_plugin() -> None:
    fixed = pools(**{"a100-80gb-b": {"boot": {"dist": "fixed", "median_s": 240}}})
    with world(pools=fixed, device_plugin_s=90) as (sim, tl, backend):
        cm = container_v1.ClusterManagerClient(**client_kwargs(sim.url))
        op = set_size(cm, "a100-80gb-b", 1)
        tl.advance(real(3 + 20) + 0.001)
        assert gke_op(cm, op.name).status == container_v1.Operation.Status.DONE
        assert sim.nodes("a100-80gb-b") == []  # the operation is done, the VM is still booting
        registered = real(3 + 10 + 240)  # PENDING, the creation attempt mid-RUNNING, then the boot
        tl.advance(registered - tl.now() - 0.001)
        assert sim.nodes("a100-80gb-b") == []
        tl.advance(0.002)
        name = node("a100-80gb-b", 0)
        assert sim.nodes("a100-80gb-b") == [name] and backend.gpus[name] == 0
        assert backend.boot_samples[name] == pytest.approx(registered, abs=1e-3)  # counted from the request
        tl.advance(real(90) - 0.01)
        assert backend.gpus[name] == 0
        tl.advance(0.02)
        assert backend.gpus[name] == 8


# ---- 3. asynchronous operations; a second mutation is refused; shrink cancels creations first --------
def test_set_size_and_delete_instances_are_operations_refusing_a_second_mutation() -> None:
    with world(pools=pools(**{"l4-a": {"initial_size": 2}})) as (sim, tl, backend):
        kw = client_kwargs(sim.url)
        cm, mig = container_v1.ClusterManagerClient(**kw), compute_v1.InstanceGroupManagersClient(**kw)
        zops = compute_v1.ZoneOperationsClient(**kw)
        op = set_size(cm, "l4-a", 4)
        assert op.status == container_v1.Operation.Status.PENDING
        with pytest.raises(gexc.BadRequest, match="is currently operating on node pool l4-a") as info:
            set_size(cm, "l4-a", 5)
        assert info.value.response.json()["error"]["status"] == "FAILED_PRECONDITION"
        with pytest.raises(gexc.BadRequest, match="is not ready"):
            mig.delete_instances_unary(
                project=PROJECT, zone="us-central1-a", instance_group_manager=igm("l4-a", "us-central1-a"),
                instance_group_managers_delete_instances_request_resource=compute_v1.
                InstanceGroupManagersDeleteInstancesRequest(instances=[node("l4-a", 0)]))
        tl.advance(real(3) + 0.001)
        assert gke_op(cm, op.name).status == container_v1.Operation.Status.RUNNING
        assert mig.get(project=PROJECT, zone="us-central1-a",
                       instance_group_manager=igm("l4-a", "us-central1-a")).target_size == 4
        tl.advance(real(20))
        assert gke_op(cm, op.name).status == container_v1.Operation.Status.DONE

        raw = mig.delete_instances_unary(
            project=PROJECT, zone="us-central1-a", instance_group_manager=igm("l4-a", "us-central1-a"),
            instance_group_managers_delete_instances_request_resource=compute_v1.
            InstanceGroupManagersDeleteInstancesRequest(instances=[f"zones/us-central1-a/instances/{node('l4-a', 0)}"]))
        assert raw.status == compute_v1.Operation.Status.PENDING
        tl.advance(real(3) + 0.001)
        got = zops.get(project=PROJECT, zone="us-central1-a", operation=raw.name)
        assert got.status == compute_v1.Operation.Status.RUNNING
        state = mig.get(project=PROJECT, zone="us-central1-a", instance_group_manager=igm("l4-a", "us-central1-a"))
        assert state.target_size == 3 and state.current_actions.deleting == 1
        assert node("l4-a", 0) in sim.nodes("l4-a")  # deleted when the operation completes
        tl.advance(real(45))
        assert zops.get(project=PROJECT, zone="us-central1-a", operation=raw.name).status == \
            compute_v1.Operation.Status.DONE
        assert node("l4-a", 0) not in sim.nodes("l4-a") and backend.deleted == [node("l4-a", 0)]


def test_shrinking_cancels_instances_not_created_yet_first() -> None:
    with world(pools=pools(**{"l4-b": {"initial_size": 2}})) as (sim, tl, backend):
        cm = container_v1.ClusterManagerClient(**client_kwargs(sim.url))
        set_size(cm, "l4-b", 4)
        tl.advance(real(3 + 20) + 0.001)  # 0002 and 0003 are booting, no Node yet
        set_size(cm, "l4-b", 2)
        tl.advance(real(3 + 20) + 0.001)
        assert sim.nodes("l4-b") == [node("l4-b", 0), node("l4-b", 1)] and backend.deleted == []
        tl.advance(real(3600))
        assert sim.nodes("l4-b") == [node("l4-b", 0), node("l4-b", 1)]  # the cancelled VMs never register
        assert sim.state.pools["l4-b"].target == 2


# ---- 4. a stockout starting mid-resize: op DONE, IGM errors, the MIG retries ------------------------
def test_stockout_mid_resize_fails_remaining_creations_into_igm_errors_and_retries() -> None:
    # set_size_s 40 with 3 VMs: creations are attempted 10, 20 and 30 s into RUNNING (13, 23, 33 s);
    # the stockout starts at 18 s and lasts until 200 s.
    so = [{"zone": "us-central1-c", "start_s": 18, "end_s": 200, "with_details": True}]
    with world(stockouts=so, mig_retry_s=60, operations={**OPS, "set_size_s": 40}) as (sim, tl, backend):
        kw = client_kwargs(sim.url)
        cm, mig = container_v1.ClusterManagerClient(**kw), compute_v1.InstanceGroupManagersClient(**kw)
        op = set_size(cm, "a100-80gb-c", 3)
        tl.advance(real(3 + 40) + 0.001)
        done = gke_op(cm, op.name)
        assert done.status == container_v1.Operation.Status.DONE and not done.error.message
        errors = sim.state.igm_errors("us-central1-c", igm("a100-80gb-c", "us-central1-c"))
        assert [e["error"]["code"] for e in errors] == ["ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS"] * 2
        assert {e["instanceActionDetails"]["action"] for e in errors} == {"CREATING"}
        assert [e["instanceActionDetails"]["instance"].rsplit("/", 1)[1] for e in errors] == [
            node("a100-80gb-c", 1), node("a100-80gb-c", 2)]
        state = mig.get(project=PROJECT, zone="us-central1-c", instance_group_manager=igm("a100-80gb-c", ""))
        assert state.target_size == 3 and state.current_actions.creating == 3  # one booting, two to retry
        tl.advance(real(150))  # retries at 83, 93, 143, 153 s still meet the stockout
        assert len(sim.state.igm_errors("us-central1-c", igm("a100-80gb-c", ""))) == 6
        tl.advance(real(3600))  # the stockout ended at 200 s: the retries succeed
        assert len(sim.nodes("a100-80gb-c")) == 3
        assert len(sim.state.igm_errors("us-central1-c", igm("a100-80gb-c", ""))) == 6


# ---- 5. spot preemption: notice, Node gone, the MIG recreates the same name ------------------------
def test_preemption_keeps_the_target_and_recreates_the_vm_under_the_same_name() -> None:
    import json
    import urllib.request

    with world(pools=pools(**{"l4-spot-a": {"initial_size": 2}})) as (sim, tl, backend):
        victim = node("l4-spot-a", 1)
        req = urllib.request.Request(f"{sim.url}/sim/v1/preempt", json.dumps({"node": victim}).encode(),
                                     {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as resp:
            out = json.loads(resp.read())
        assert out["node"] == victim and out["poolSize"] == 2 and out["noticeS"] == real(30)
        assert victim in sim.nodes("l4-spot-a")  # returned at once: the notice has not run out
        tl.advance(0.001)
        assert backend.noticed == [victim]
        tl.advance(real(30))
        mig = compute_v1.InstanceGroupManagersClient(**client_kwargs(sim.url))
        state = mig.get(project=PROJECT, zone="us-central1-a", instance_group_manager=igm("l4-spot-a", ""))
        assert victim not in sim.nodes("l4-spot-a") and backend.deleted == [victim]
        assert state.target_size == 2 and state.current_actions.recreating == 1  # the pool never shrinks
        tl.advance(real(3600))
        assert sim.nodes("l4-spot-a") == [node("l4-spot-a", 0), victim]  # same name, a fresh Node
        assert backend.created.count(victim) == 2 and sim.state.pools["l4-spot-a"].target == 2


def test_gke_spot_notice_kills_the_pods_15_s_in_and_the_vm_at_30_s() -> None:
    """GKE graceful node shutdown on a Spot VM: notice at 0 (no taint), non-system pods killed at 15 s, VM gone at 30 s."""
    with world(pools=pools(**{"l4-spot-a": {"initial_size": 1}})) as (sim, tl, backend):
        victim = node("l4-spot-a", 0)
        tl.advance(real(10))
        sim.preempt(victim)
        tl.advance(real(14.9))
        assert backend.noticed == [victim] and backend.killed == [] and backend.deleted == []
        tl.advance(real(0.2))
        assert backend.killed == [victim] and backend.deleted == []
        tl.advance(real(15))
        assert backend.deleted == [victim]
        assert sim.state.world.taint_key == ""  # GKE >= 1.20 taints nothing: the kubelet's shutdown is the signal


def test_pod_grace_is_a_scenario_field_bounded_by_the_notice() -> None:
    from kfp_gpu.errors import InvalidSpec

    assert from_dict(scenario(preemption={"pod_grace_s": 5})).world.pod_grace_s == 5.0
    assert from_dict(scenario(cloud="aws")).world.pod_grace_s == 120.0
    assert from_dict(scenario(preemption={"notice_s": 10})).world.pod_grace_s == 10.0  # capped by a short notice
    with pytest.raises(InvalidSpec) as info:
        from_dict(scenario(preemption={"notice_s": 30, "pod_grace_s": 31}))
    assert "preemption.pod_grace_s" in str(info.value) and "notice_s (30)" in str(info.value)


def test_preemption_under_a_stockout_fails_the_recreation_and_retries() -> None:
    so = [{"zone": "us-central1-b", "start_s": 1, "end_s": 400}]
    spot = pools(**{"h100-80gb-spot-b": {"initial_size": 1}})
    with world(pools=spot, stockouts=so, mig_retry_s=60) as (sim, tl, backend):
        victim = node("h100-80gb-spot-b", 0)
        tl.advance(real(10))
        assert sim.preempt(victim)["poolSize"] == 1
        tl.advance(real(30) + 0.001)
        errors = sim.state.igm_errors("us-central1-b", igm("h100-80gb-spot-b", ""))
        assert [(e["instanceActionDetails"]["action"], e["error"]["code"]) for e in errors] == [
            ("RECREATING", "ZONE_RESOURCE_POOL_EXHAUSTED")]
        tl.advance(real(120))
        assert len(sim.state.igm_errors("us-central1-b", igm("h100-80gb-spot-b", ""))) == 3  # every 60 s
        assert sim.nodes("h100-80gb-spot-b") == [] and sim.state.pools["h100-80gb-spot-b"].target == 1
        tl.advance(real(3600))
        assert sim.nodes("h100-80gb-spot-b") == [victim]


def test_aws_flavour_gives_the_two_minute_notice_and_a_new_instance() -> None:
    with world(cloud="aws", pools=pools(**{"l4-spot-c": {"initial_size": 1}})) as (sim, tl, backend):
        victim = node("l4-spot-c", 0)
        assert sim.preempt(victim)["noticeS"] == real(120)
        tl.advance(real(119))
        assert victim in sim.nodes("l4-spot-c") and backend.killed == []  # pods run to the end of the notice
        tl.advance(real(2))
        assert victim not in sim.nodes("l4-spot-c") and sim.state.pools["l4-spot-c"].target == 1
        tl.advance(real(3600))
        assert sim.nodes("l4-spot-c") == [node("l4-spot-c", 1)]  # the group launched a replacement


# ---- 6. autoscaling state in nodePools.get -------------------------------------------------------
def test_autoscaling_settings_are_reported_like_gke() -> None:
    ps = pools(**{"l4-a": {"autoscaling": {"enabled": True, "min_nodes": 1, "max_nodes": 40}},
                  "l4-b": {"autoscaling": {"enabled": True, "max_nodes": 12, "total": True}},
                  "l4-c": {"autoscaling": {"enabled": False}}})
    with world(pools=ps) as (sim, tl, backend):
        cm = container_v1.ClusterManagerClient(**client_kwargs(sim.url))
        a = cm.get_node_pool(name=f"{PARENT}/nodePools/l4-a").autoscaling
        assert (a.enabled, a.min_node_count, a.max_node_count, a.total_max_node_count) == (True, 1, 40, 0)
        assert a.location_policy == container_v1.NodePoolAutoscaling.LocationPolicy.BALANCED
        b = cm.get_node_pool(name=f"{PARENT}/nodePools/l4-b").autoscaling
        assert (b.enabled, b.max_node_count, b.total_min_node_count, b.total_max_node_count) == (True, 0, 0, 12)
        c = cm.get_node_pool(name=f"{PARENT}/nodePools/l4-c").autoscaling
        assert (c.enabled, c.max_node_count, c.total_max_node_count) == (False, 0, 0)
        listed = {p.name: p.autoscaling for p in cm.list_node_pools(parent=PARENT).node_pools}
        assert listed["l4-a"].max_node_count == 40 and listed["a100-80gb-a"].max_node_count == 16
