"""Queued provisioning (queued-provisioning.gke.io) in the stand-in's world, on virtual time (no sleeps)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from kfp_gpu.errors import InvalidSpec
from kfp_gpu_rehearsal.sim import SimServer, from_dict
from kfp_gpu_rehearsal.sim.clock import Timeline, compress
from kfp_gpu_rehearsal.sim.dws import QUEUED_TAINT, REQUEST_LABEL, Demand, DwsWorld, Refusal
from kfp_gpu_rehearsal.sim.dws_request import consumer, demand
from kfp_gpu_rehearsal.sim.state import MemoryBackend, SimState
from tests.sim._helpers import default_dict

POOL = "h100-dws-a"
KEY = ("team-a", "train-1")


def _data(**dws: Any) -> dict[str, Any]:
    data = copy.deepcopy(default_dict())
    data["pools"].append({"name": POOL, "zone": "us-central1-a", "accelerator": "h100-80gb", "gpus_per_node": 8,
                          "max_nodes": 4, "queued_provisioning": {"enabled": True}, "autoscaling": {"enabled": True},
                          "boot": {"dist": "fixed", "median_s": 60}})
    data["dws"] = {"accept_s": 10, "queue": {"dist": "fixed", "median_s": 120}, "queue_timeout_s": 3600,
                   "booking_s": 600, **dws}
    return data


class World:
    def __init__(self, data: dict[str, Any] | None = None) -> None:
        self.backend = MemoryBackend()
        self.tl = Timeline(virtual=True)
        self.state = SimState(from_dict(data or _data()), self.backend, timeline=self.tl)
        self.status: dict[Any, dict[str, Any]] = {}
        self.dws = DwsWorld(self.state, lambda k, s: self.status.__setitem__(k, s))

    def at(self, real_s: float) -> None:
        """Advance to ``real_s`` real-world seconds since the world started."""
        self.tl.advance(max(0.0, compress(real_s) - self.tl.now()))

    def cond(self, ctype: str) -> dict[str, Any] | None:
        return next((c for c in self.status.get(KEY, {}).get("conditions", []) if c["type"] == ctype), None)

    def true(self, ctype: str) -> bool:
        c = self.cond(ctype)
        return c is not None and c["status"] == "True"


def test_accepted_queued_then_all_nodes_at_once_then_provisioned_after_gpus() -> None:
    w = World()
    w.dws.submit(KEY, "u1", 1, Demand(POOL, 2, 7200))
    w.at(9)
    assert KEY not in w.status
    w.at(11)
    acc = w.cond("Accepted")
    assert acc is not None and (acc["status"], acc["reason"]) == ("True", "SuccessfullyQueued")
    assert acc["observedGeneration"] == 1 and acc["lastTransitionTime"]
    assert w.status[KEY]["provisioningClassDetails"]["NodePoolName"] == POOL
    w.at(129)  # still in the queue
    assert w.backend.created == [] and w.state.pools[POOL].instances == {}
    w.at(131)
    assert len(w.state.pools[POOL].instances) == 2  # both requested at once
    w.at(200)  # booted (60 s) and registered, GPUs not yet advertised (device plugin 90 s)
    assert len(w.backend.created) == 2 and not w.true("Provisioned")
    w.at(300)
    prov = w.cond("Provisioned")
    assert prov is not None and (prov["status"], prov["reason"]) == ("True", "Provisioned")
    assert all(w.backend.gpus[n] == 8 for n in w.backend.created)


def test_unconsumed_booking_expires_and_the_nodes_go() -> None:
    w = World()
    w.dws.submit(KEY, "u1", 1, Demand(POOL, 2, 7200))
    w.at(300)
    assert w.true("Provisioned") and w.backend.deleted == []
    w.at(300 + 600 + 10)
    exp = w.cond("BookingExpired")
    assert exp is not None and (exp["status"], exp["reason"]) == ("True", "BookingExpired")
    assert sorted(w.backend.deleted) == sorted(w.backend.created)
    assert w.state.pools[POOL].instances == {} and w.state.pools[POOL].target == 0


def test_consumed_nodes_stay_past_the_booking_until_idle_then_max_run_revokes() -> None:
    w = World()
    w.dws.submit(KEY, "u1", 1, Demand(POOL, 2, 3600))
    w.at(300)
    a, b = w.backend.created
    w.dws.set_busy(KEY, {a})
    w.at(1000)
    assert w.true("BookingExpired") and w.backend.deleted == [b]  # GKE sets it anyway; idle node scaled down
    w.at(3000)
    assert w.backend.deleted == [b] and not w.true("CapacityRevoked")
    w.at(300 + 3600 + 10)  # maxRunDurationSeconds after Provisioned: GCE deletes the VMs
    rev = w.cond("CapacityRevoked")
    assert rev is not None and (rev["status"], rev["reason"]) == ("True", "CapacityRevoked")
    assert sorted(w.backend.deleted) == sorted([a, b])


def test_stockout_keeps_it_queued_until_the_wait_time_is_exceeded() -> None:
    data = _data()
    data["stockouts"] = [{"zone": "us-central1-a", "window": "always", "accelerator": "h100-80gb"}]
    w = World(data)
    w.dws.submit(KEY, "u1", 1, Demand(POOL, 2, 7200))
    w.at(3000)
    assert w.true("Accepted") and not w.true("Failed") and w.backend.created == []
    w.at(3611)
    failed = w.cond("Failed")
    assert failed is not None and (failed["status"], failed["reason"]) == ("True", "WaitTimeExceeded")
    assert w.backend.created == [] and w.cond("Provisioned") is None


def test_stockout_that_ends_is_served_late() -> None:
    data = _data()
    data["stockouts"] = [{"zone": "us-central1-a", "start_s": 0, "end_s": 900}]
    w = World(data)
    w.dws.submit(KEY, "u1", 1, Demand(POOL, 1, 7200))
    w.at(890)
    assert w.state.pools[POOL].instances == {}
    w.at(1300)
    assert w.true("Provisioned") and not w.true("Failed")


def test_revocation_sets_capacity_revoked_and_removes_nodes_after_the_notice() -> None:
    w = World()
    w.dws.submit(KEY, "u1", 1, Demand(POOL, 2, 7200))
    w.at(300)
    with pytest.raises(KeyError):
        w.dws.revoke(("team-a", "other"))
    nodes = w.dws.revoke(KEY)
    assert w.true("BookingExpired") and w.true("CapacityRevoked")
    assert sorted(w.backend.noticed) == sorted(nodes) and w.backend.deleted == []
    w.at(300 + 31)  # GCE's 30 s notice
    assert sorted(w.backend.deleted) == sorted(nodes)
    with pytest.raises(ValueError):
        w.dws.revoke(KEY)


def test_deleting_a_queued_request_never_creates_nodes() -> None:
    w = World()
    w.dws.submit(KEY, "u1", 1, Demand(POOL, 2, 7200))
    w.at(60)
    w.dws.withdraw(KEY, "u1")
    w.at(2000)
    assert w.backend.created == [] and w.dws.snapshot() == {}


def test_deleting_a_provisioned_request_drops_idle_nodes_and_busy_ones_when_their_pods_end() -> None:
    w = World()
    w.dws.submit(KEY, "u1", 1, Demand(POOL, 2, 7200))
    w.at(300)
    a, b = w.backend.created
    w.dws.set_busy(KEY, {a})
    w.dws.withdraw(KEY, "u1")
    assert w.backend.deleted == [b]
    w.dws.set_busy(KEY, set())
    assert sorted(w.backend.deleted) == sorted([a, b])


def test_quota_short_fails_at_once_and_refusals_fail_unaccepted() -> None:
    data = _data()
    data["regions"]["us-central1"]["quotas"]["NVIDIA_H100_GPUS"] = {"limit": 8, "usage": 0}
    w = World(data)
    w.dws.submit(KEY, "u1", 1, Demand(POOL, 2, 7200))
    w.at(11)
    failed, acc = w.cond("Failed"), w.cond("Accepted")
    assert failed is not None and failed["reason"] == "QuotaExceeded" and acc is not None and acc["status"] == "False"
    w2 = World()
    w2.dws.submit(KEY, "u2", 1, Refusal("InvalidArgument", "bad", POOL))
    w2.at(11)
    assert w2.true("Failed") and not w2.true("Accepted")


def test_a_queued_request_over_the_cpus_quota_fails_with_quota_exceeded() -> None:
    data = _data()
    data["regions"]["us-central1"]["quotas"]["CPUS"] = {"limit": 100, "usage": 0}  # below one H100 VM's vCPUs
    w = World(data)
    w.dws.submit(KEY, "u1", 1, Demand(POOL, 1, 7200))
    w.at(11)
    failed = w.cond("Failed")
    assert failed is not None and failed["reason"] == "QuotaExceeded" and "'CPUS' exceeded" in failed["message"]


def test_node_extras_taint_and_label_queued_nodes_only() -> None:
    w = World()
    w.dws.submit(KEY, "u1", 1, Demand(POOL, 1, 7200))
    w.at(140)
    node = next(iter(w.state.pools[POOL].instances))
    labels, taints = w.dws.node_extras(POOL, node)
    assert taints == [QUEUED_TAINT] and labels[REQUEST_LABEL] and labels["cloud.google.com/gke-flex-start"] == "true"
    assert w.dws.node_extras("a100-80gb-a", "x") == ({}, [])


def _request(pod_sets: int = 1, **params: str) -> dict[str, Any]:
    return {"spec": {"provisioningClassName": "queued-provisioning.gke.io", "parameters": params,
                     "podSets": [{"count": 2, "podTemplateRef": {"name": f"t{i}"}} for i in range(pod_sets)]}}


def _template(pool_sel: dict[str, Any]) -> dict[str, Any]:
    return {"template": {"spec": pool_sel}}


def test_demand_selects_own_queued_pools_and_cluster() -> None:
    sc = from_dict(_data())
    by_selector = _template({"nodeSelector": {"cloud.google.com/gke-nodepool": POOL}})
    assert demand(_request(), {"t0": by_selector}, sc) == Demand(POOL, 2, 604800.0)
    affinity = _template({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [
            {"key": "cloud.google.com/gke-nodepool", "operator": "In", "values": ["elsewhere", POOL]}]}]}}}})
    assert demand(_request(maxRunDurationSeconds="3600"), {"t0": affinity}, sc) == Demand(POOL, 2, 3600.0)
    other_cluster = _template({"nodeSelector": {"cloud.google.com/gke-nodepool": POOL,
                                                "kfp-gpu.io/sim-cluster": "someone-else"}})
    assert demand(_request(), {"t0": other_cluster}, sc) is None
    ours = _template({"nodeSelector": {"cloud.google.com/gke-nodepool": POOL, "kfp-gpu.io/sim-cluster": sc.cluster}})
    assert isinstance(demand(_request(), {"t0": ours}, sc), Demand)
    not_queued = _template({"nodeSelector": {"cloud.google.com/gke-nodepool": "a100-80gb-a"}})
    assert demand(_request(), {"t0": not_queued}, sc) is None
    assert demand(_request(), {"t0": None}, sc) is None
    atomic = _request()
    atomic["spec"]["provisioningClassName"] = "best-effort-atomic-scale-up.autoscaling.x-k8s.io"
    assert demand(atomic, {"t0": by_selector}, sc) is None


def test_demand_refusals() -> None:
    sc = from_dict(_data())
    t = _template({"nodeSelector": {"cloud.google.com/gke-nodepool": POOL}})
    for params in ({"maxRunDurationSeconds": "604801"}, {"maxRunDurationSeconds": "1h"}):
        got = demand(_request(**params), {"t0": t}, sc)
        assert isinstance(got, Refusal) and got.reason == "InvalidArgument"
    assert isinstance(demand(_request(pod_sets=2), {"t0": t, "t1": t}, sc), Refusal)
    big = _request()
    big["spec"]["podSets"][0]["count"] = 5
    assert isinstance(demand(big, {"t0": t}, sc), Refusal)


def test_consumer_needs_both_annotations() -> None:
    pod = {"metadata": {"namespace": "ns", "annotations": {
        "autoscaling.x-k8s.io/consume-provisioning-request": "r",
        "autoscaling.x-k8s.io/provisioning-class-name": "queued-provisioning.gke.io"}}}
    assert consumer(pod) == ("ns", "r")
    del pod["metadata"]["annotations"]["autoscaling.x-k8s.io/provisioning-class-name"]
    assert consumer(pod) is None


def test_scenario_validation() -> None:
    data = _data()
    data["pools"][-1]["autoscaling"] = {"enabled": False}
    with pytest.raises(InvalidSpec, match="autoscaling"):
        from_dict(data)
    data = _data()
    data["provisioning_revocations"] = [{"at_s": 10, "pool": "a100-80gb-a"}]
    with pytest.raises(InvalidSpec, match="provisioning_revocations"):
        from_dict(data)
    data = _data()
    data["dws"]["queue"] = {"dist": "weibull"}
    with pytest.raises(InvalidSpec, match="dws.queue.dist"):
        from_dict(data)


def test_node_pool_rendering_and_set_size_refusal() -> None:
    sim = SimServer(from_dict(_data()), backend=MemoryBackend())
    try:
        base = "/v1/projects/local-project/locations/us-central1/clusters/kfp-gpu-local/nodePools"
        status, pool = sim.handle("GET", f"{base}/{POOL}", {}, {})
        assert status == 200 and pool["queuedProvisioning"] == {"enabled": True}
        assert pool["autoscaling"]["locationPolicy"] == "ANY" and pool["config"]["flexStart"] is True
        assert {"key": "cloud.google.com/gke-queued", "value": "true", "effect": "NO_SCHEDULE"} in pool["config"]["taints"]
        _, listed = sim.handle("GET", base, {}, {})
        other = next(p for p in listed["nodePools"] if p["name"] == "a100-80gb-a")
        assert "queuedProvisioning" not in other
        with pytest.raises(Exception, match="queued provisioning"):
            sim.handle("POST", f"{base}/{POOL}:setSize", {}, {"nodeCount": 1})
    finally:
        sim.stop()
