"""GKE ComputeClasses in the stand-in's world (node auto-provisioning along a class's priorities), on virtual time."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from kfp_gpu.errors import InvalidSpec
from kfp_gpu_rehearsal.sim import from_dict
from kfp_gpu_rehearsal.sim.clock import Timeline, compress
from kfp_gpu_rehearsal.sim.computeclass import CLASS_LABEL, SCAN_S, ComputeClassWorld
from kfp_gpu_rehearsal.sim.computeclass_controller import usable, waiting
from kfp_gpu_rehearsal.sim.state import MemoryBackend, SimState
from tests.sim._helpers import default_dict

CLS = "kfp-gpu-run-1"
GPU = {"type": "nvidia-a100-80gb", "count": 8}
RES = {"machineFamily": "a2", "gpu": GPU, "reservations": {"affinity": "Specific", "specific": [{"name": "res-a"}]}}
FLEX = {"machineFamily": "a2", "gpu": GPU, "flexStart": {"enabled": True}}
SPOT = {"machineFamily": "a2", "gpu": GPU, "spot": True}
ON_DEMAND = {"machineFamily": "a2", "gpu": GPU, "spot": False}


def _data(*, queue_s: float = 120.0, stockouts: list[dict[str, Any]] | None = None, in_use: int = 1) -> dict[str, Any]:
    data = copy.deepcopy(default_dict())
    data["reservations"] = [{"name": "res-a", "zone": "us-central1-a", "accelerator": "a100-80gb", "count": 1,
                             "in_use": in_use, "specific": True}]
    data["dws"] = {"queue": {"dist": "fixed", "median_s": queue_s}}
    data["stockouts"] = stockouts or []
    return data


class World:
    def __init__(self, data: dict[str, Any], rules: list[dict[str, Any]], *, migrate: bool = False) -> None:
        self.backend = MemoryBackend()
        self.tl = Timeline(virtual=True)
        self.state = SimState(from_dict(data), self.backend, timeline=self.tl)
        self.cc = ComputeClassWorld(self.state)
        self.cc.set_class(CLS, {"priorities": rules, "activeMigration": {"optimizeRulePriority": migrate},
                                "priorityDefaults": {"location": {"zones": ["us-central1-a"]}}})

    def run_to(self, real_s: float) -> None:
        """Advance to ``real_s`` real-world seconds, the autoscaler scanning every --scan-interval."""
        while self.tl.now() < compress(real_s):
            self.tl.advance(min(compress(SCAN_S), compress(real_s) - self.tl.now()))
            self.state.world.dispatch(self.cc.scan())

    def nodes(self) -> dict[str, str]:
        """node -> the capacity of the rule it came from."""
        k = self.cc.classes[CLS]
        from kfp_gpu_rehearsal.sim.computeclass import capacity_of

        return {n: capacity_of(k.rules[r]) for n, r in k.nodes.items()}

    def registered(self) -> list[str]:
        return [n for n in self.backend.created if n not in self.backend.deleted]


def test_reservation_exhausted_falls_to_flex_start() -> None:
    w = World(_data(queue_s=120.0), [RES, FLEX, SPOT, ON_DEMAND])
    w.cc.set_pods(CLS, 2, set(), set())
    w.run_to(60)
    assert w.nodes() == {}  # flex-start nodes wait their turn (120 s); the reservation has no free slot
    assert any("rule 0 (reservation) backed off" in h for h in w.cc.classes[CLS].history)
    w.run_to(400)
    assert sorted(w.nodes().values()) == ["flex-start", "flex-start"]
    node = next(iter(w.nodes()))
    pool = next(p for p in w.state.pools.values() if node in p.instances)
    labels, taints = w.cc.node_extras(pool.spec.name, node)
    assert labels[CLASS_LABEL] == CLS and labels["cloud.google.com/gke-flex-start"] == "true"
    assert taints == [{"key": CLASS_LABEL, "value": CLS, "effect": "NoSchedule"}]


def test_flex_start_in_a_class_is_not_all_or_nothing() -> None:
    w = World(_data(stockouts=[{"zone": "us-central1-a", "window": "always", "provisioning": "flex-start",
                                "capacity": 1, "accelerator": "a100-80gb"}]), [FLEX, SPOT])
    w.cc.set_pods(CLS, 2, set(), set())
    w.run_to(1000)
    assert sorted(w.nodes().values()) == ["flex-start", "flex-start"]  # the second VM's MIG keeps failing
    w.run_to(1300)  # given up at 120 + 900 s, the rule backed off: the next rule gives the other node
    assert sorted(w.nodes().values()) == ["flex-start", "spot"]  # one node came; the other fell to the next rule


def test_a_free_reservation_slot_is_consumed_first_and_the_rest_falls_through() -> None:
    w = World(_data(in_use=0), [RES, SPOT, ON_DEMAND])
    w.cc.set_pods(CLS, 2, set(), set())
    w.run_to(30)
    assert sorted(w.nodes().values()) == ["reservation", "spot"]
    res_node = next(n for n, c in w.nodes().items() if c == "reservation")
    pool = next(p for p in w.state.pools.values() if res_node in p.instances)
    assert w.cc.node_extras(pool.spec.name, res_node)[0]["cloud.google.com/reservation-name"] == "res-a"
    assert w.state.reservations[("us-central1-a", "res-a")]["_held"] == {res_node}


def test_flex_start_not_obtained_within_max_node_provision_time_falls_to_spot() -> None:
    w = World(_data(queue_s=3600.0), [FLEX, SPOT, ON_DEMAND])
    w.cc.set_pods(CLS, 1, set(), set())
    w.run_to(880)
    assert w.nodes() == {}  # still waiting for flex-start (15 min max-node-provision-time)
    w.run_to(960)
    assert list(w.nodes().values()) == ["spot"]
    assert any("not obtained in 900s" in h for h in w.cc.classes[CLS].history)


def test_spot_stockout_falls_to_on_demand() -> None:
    w = World(_data(stockouts=[{"zone": "us-central1-a", "window": "always", "provisioning": "spot"}]),
              [SPOT, ON_DEMAND])
    w.cc.set_pods(CLS, 2, set(), set())
    w.run_to(30)
    assert sorted(w.nodes().values()) == ["on-demand", "on-demand"]


def test_a_stockout_of_one_model_leaves_the_others() -> None:
    w = World(_data(stockouts=[{"zone": "us-central1-a", "window": "always", "provisioning": "standard"}]),
              [ON_DEMAND, SPOT])
    w.cc.set_pods(CLS, 1, set(), set())
    w.run_to(30)
    assert list(w.nodes().values()) == ["spot"]


def test_every_rule_blocked_leaves_the_pods_pending_and_retries_after_backoff() -> None:
    w = World(_data(stockouts=[{"zone": "us-central1-a", "start_s": 0, "end_s": 400}]), [SPOT, ON_DEMAND])
    w.cc.set_pods(CLS, 1, set(), set())
    w.run_to(200)
    assert w.nodes() == {}
    w.run_to(800)  # the stockout ended at 400 s; the rules are asked again once their 5-minute backoff ends
    assert list(w.nodes().values()) == ["spot"]


def test_active_migration_moves_the_node_back_to_the_preferred_rule_when_it_frees_up() -> None:
    w = World(_data(stockouts=[{"zone": "us-central1-a", "start_s": 0, "end_s": 600, "provisioning": "spot"}]),
              [SPOT, ON_DEMAND], migrate=True)
    w.cc.set_pods(CLS, 1, set(), set())
    w.run_to(300)
    (old, cap), = w.nodes().items()
    assert cap == "on-demand"
    w.cc.set_pods(CLS, 0, {old}, set())
    w.run_to(590)
    assert w.nodes() == {old: "on-demand"}  # spot is still stocked out
    w.run_to(1200)
    assert list(w.nodes().values()) == ["spot"] and old in w.backend.deleted


def test_without_active_migration_the_node_stays_on_the_lower_rule() -> None:
    w = World(_data(stockouts=[{"zone": "us-central1-a", "start_s": 0, "end_s": 600, "provisioning": "spot"}]),
              [SPOT, ON_DEMAND], migrate=False)
    w.cc.set_pods(CLS, 1, set(), set())
    w.run_to(300)
    (old, _), = w.nodes().items()
    w.cc.set_pods(CLS, 0, {old}, set())
    w.run_to(1200)
    assert w.nodes() == {old: "on-demand"}


def test_unneeded_nodes_scale_down_after_ten_minutes_unless_protected() -> None:
    w = World(_data(), [ON_DEMAND])
    w.cc.set_pods(CLS, 2, set(), set())
    w.run_to(300)
    a, b = sorted(w.nodes())
    w.cc.set_pods(CLS, 0, set(), {a})
    w.run_to(850)
    assert set(w.nodes()) == {a, b}
    w.run_to(1000)
    assert set(w.nodes()) == {a}


def test_a_pod_waiting_beside_a_free_node_it_cannot_use_gets_a_new_node() -> None:
    """CA simulates scheduling before it scales up: a free node the waiting pod cannot land on (cordoned, or a
    taint it does not tolerate) is no room for it. (The stand-in counted every free class node as room: a pod
    waiting beside a cordoned node waited forever, while scale-down waited for no pod to wait.)"""
    w = World(_data(), [ON_DEMAND])
    w.cc.set_pods(CLS, 1, set(), set())
    w.run_to(300)
    (a,) = w.nodes()
    w.cc.set_pods(CLS, 1, set(), set())  # the node is free, and the pod fits it: nothing to add
    w.run_to(400)
    assert set(w.nodes()) == {a}
    w.cc.set_pods(CLS, 1, set(), set(), closed={a})  # cordoned: the pod waits for a new node
    w.run_to(500)
    assert len(w.nodes()) == 2 and a in w.nodes()


def test_a_node_is_usable_only_uncordoned_with_every_hard_taint_tolerated() -> None:
    taint = {"key": CLASS_LABEL, "value": CLS, "effect": "NoSchedule"}
    claim = {"key": "kfp-gpu.io/claimed-by-team-a", "value": "run-1", "effect": "NoSchedule"}
    exact = {"key": CLASS_LABEL, "operator": "Equal", "value": CLS, "effect": "NoSchedule"}
    assert usable({"spec": {"taints": [taint]}}, [exact])
    assert not usable({"spec": {"taints": [taint]}}, [])
    assert not usable({"spec": {"taints": [taint, claim]}}, [exact])  # a run's claim: not for the class's pods
    assert usable({"spec": {"taints": [taint, claim]}}, [{"operator": "Exists"}])  # tolerates everything
    assert usable({"spec": {"taints": [{**claim, "effect": "PreferNoSchedule"}]}}, [])  # soft taints do not bar
    assert not usable({"spec": {"unschedulable": True, "taints": [taint]}}, [exact])
    assert not usable({"spec": {"taints": [taint]}}, [{**exact, "value": "other-class"}])
    booting = {"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}
    assert usable({"spec": {"taints": [taint, booting]}}, [exact])  # upcoming capacity: no second node for the pod


def test_stockout_provisioning_model_is_validated() -> None:
    with pytest.raises(InvalidSpec, match=r"stockouts\[0\].provisioning"):
        from_dict(_data(stockouts=[{"zone": "us-central1-a", "provisioning": "preemptible"}]))


def _pod(**kw: Any) -> dict[str, Any]:
    pod: dict[str, Any] = {"metadata": {"name": "p"}, "spec": {"nodeSelector": {CLASS_LABEL: CLS}, "priority": 0},
                           "status": {"phase": "Pending", "conditions": [
                               {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]}}
    for k, v in kw.items():
        pod["spec" if k in ("priority", "nodeName") else "status"][k] = v
    return pod


def test_only_unschedulable_non_expendable_pods_wait_for_a_class() -> None:
    assert waiting(_pod()) == CLS
    assert waiting(_pod(priority=-10)) == CLS  # the cutoff itself is not expendable
    assert waiting(_pod(priority=-11)) == ""
    assert waiting(_pod(nodeName="n1")) == ""
    assert waiting(_pod(conditions=[])) == ""  # the scheduler has not looked at it yet


def test_a_world_serves_only_pods_that_select_its_own_nodes() -> None:
    """Several stand-ins share one control plane (the `kfp-gpu run` daemon beside a test's world): a pod that selects
    another world's nodes (kfp-gpu.io/sim-cluster) is not this world's to provision for."""
    pod = _pod()
    pod["spec"]["nodeSelector"]["kfp-gpu.io/sim-cluster"] = "c-other"
    assert waiting(pod, "c-mine") == ""
    assert waiting(pod, "c-other") == CLS
    assert waiting(_pod(), "c-mine") == CLS  # a pod that names no world (a real cluster's pods) is served
