"""The compute-class backend's pure decisions: spec rules, the class body, the all-or-nothing split, node -> rule,
and the gang verdict (virtual time: times are plain numbers)."""

from __future__ import annotations

import pytest

from kfp_gpu.errors import InvalidSpec, ProvisioningTimeout
from kfp_gpu.plan import computeclass as cc
from kfp_gpu.spec import ProvisioningSpec, Target, TargetKind

GKE = Target(kind=TargetKind.GKE, provisioner="compute-class", region="us-central1")


def chain_spec(**kw: object) -> ProvisioningSpec:
    base: dict[str, object] = {"accelerator": "h100-80gb", "nodes": 2, "capacity": "reservation", "reservation": "res-a",
                               "fallback": ("flex-start", "spot", "on-demand"), "zones": ("us-central1-a",),
                               "target": GKE}
    base.update(kw)
    return ProvisioningSpec(**base)  # type: ignore[arg-type]


# ---- spec rules -----------------------------------------------------------------------------------------
@pytest.mark.parametrize(("kw", "field", "words"), [
    ({"fallback": ("preemptible",)}, "fallback", "allowed"),
    ({"fallback": ("spot", "spot")}, "fallback", "repeats"),
    ({"capacity": "spot", "reservation": "", "fallback": ("reservation",)}, "reservation", "names none"),
    ({"capacity": "spot", "fallback": ("on-demand",)}, "reservation", "consumes a reservation"),
    ({"target": Target(kind=TargetKind.GKE, provisioner="node-pool")}, "fallback", "only the compute-class"),
    ({"target": Target(kind=TargetKind.EKS, region="us-east-1"), "zones": (), "reservation": "cr-0abc"},
     "fallback", "EKS"),
    ({"fallback": (), "active_migration": True}, "active_migration", "chain"),
])
def test_spec_refuses_chains_gke_cannot_follow_in_one_line(kw: dict[str, object], field: str, words: str) -> None:
    with pytest.raises(InvalidSpec) as info:
        chain_spec(**kw)
    assert info.value.fields["field"] == field
    assert words in str(info.value)
    assert "\n" not in str(info.value)


def test_target_refuses_a_compute_class_for_another_backend() -> None:
    with pytest.raises(InvalidSpec, match="only the compute-class backend") as info:
        Target(kind=TargetKind.GKE, provisioner="karpenter", compute_class="gpu-class")
    assert info.value.fields["field"] == "target.compute_class"
    with pytest.raises(InvalidSpec, match="ComputeClass name"):
        Target(kind=TargetKind.GKE, provisioner="compute-class", compute_class="Bad_Name")


def test_spec_chain_round_trips_through_json() -> None:
    spec = chain_spec(active_migration=True, max_run_duration_s=3600.0)
    again = ProvisioningSpec.from_json(spec.to_json())
    assert again == spec
    assert [c.value for c in again.chain] == ["reservation", "flex-start", "spot", "on-demand"]


def test_max_run_duration_is_accepted_when_flex_start_is_a_later_rung_only() -> None:
    assert chain_spec(max_run_duration_s=600.0).max_run_duration_s == 600.0
    with pytest.raises(InvalidSpec, match="max_run_duration_s"):
        chain_spec(fallback=("spot",), max_run_duration_s=600.0)


@pytest.mark.parametrize(("kw", "field"), [
    ({"target": Target(kind=TargetKind.GKE, provisioner="compute-class", compute_class="team-gpus")}, "fallback"),
    ({"reservation": "cr-0123456789"}, "reservation"),
    ({"capacity": "on-demand", "reservation": "", "fallback": ("spot",),
      "warm_pool": {"nodes": 1, "cloud_reservation": True}}, "warm_pool.cloud_reservation"),
])
def test_check_refuses_what_a_computeclass_cannot_express(kw: dict[str, object], field: str) -> None:
    if isinstance(kw.get("warm_pool"), dict):
        from kfp_gpu.spec import WarmPool

        kw = {**kw, "warm_pool": WarmPool(**kw["warm_pool"])}  # type: ignore[arg-type]
    with pytest.raises(InvalidSpec) as info:
        cc.check(chain_spec(**kw))
    assert info.value.fields["field"] == field


def test_check_refuses_eks_targets() -> None:
    spec = ProvisioningSpec("h100-80gb", 1, target=Target(kind=TargetKind.EKS, region="us-east-1",
                                                          provisioner="compute-class"))
    with pytest.raises(InvalidSpec, match="GKE API"):
        cc.check(spec)


def test_a_required_topology_is_refused_in_one_line_naming_the_compact_pool_fix() -> None:
    with pytest.raises(InvalidSpec) as info:
        cc.check(chain_spec(topology="required"))
    assert info.value.fields["field"] == "topology"
    assert info.value.message == ("invalid topology='required': the compute-class provisioner cannot keep a gang in "
                                  "one network domain (its ComputeClass names no compact placement policy)")
    assert "target.provisioner='node-pool'" in info.value.remediation
    assert "placementPolicy is COMPACT" in info.value.remediation and "topology='preferred'" in info.value.remediation
    assert "\n" not in str(info.value)
    named = Target(kind=TargetKind.GKE, provisioner="compute-class", compute_class="team-gpus")
    with pytest.raises(InvalidSpec, match="topology='required'"):  # a class the platform team manages: the same
        cc.check(chain_spec(target=named, fallback=(), topology="required"))


@pytest.mark.parametrize("topology", ["preferred", "none"])
def test_a_preferred_or_no_topology_runs_on_the_class(topology: str) -> None:
    cc.check(chain_spec(topology=topology))  # may span domains: runs


# ---- the all-or-nothing split -----------------------------------------------------------------------------
def test_multi_node_flex_start_goes_through_queued_provisioning_when_the_class_is_not_atomic() -> None:
    queued, rules = cc.split(chain_spec(nodes=4), class_atomic=False)
    assert queued is True
    assert rules == ["reservation", "spot", "on-demand"]


def test_single_node_or_atomic_class_keeps_flex_start_in_the_class() -> None:
    assert cc.split(chain_spec(nodes=1), class_atomic=False) == (False, ["reservation", "flex-start", "spot",
                                                                         "on-demand"])
    assert cc.split(chain_spec(nodes=4), class_atomic=True)[0] is False


def test_a_chain_of_flex_start_alone_leaves_no_rule_for_a_multi_node_gang() -> None:
    spec = chain_spec(capacity="flex-start", reservation="", fallback=())
    queued, rules = cc.split(spec, class_atomic=False)
    assert queued and rules == []
    with pytest.raises(InvalidSpec, match="no rule"):
        cc.class_body("x", spec, rules, labels={}, annotations={})


# ---- the class body -----------------------------------------------------------------------------------------
def test_class_body_has_one_rule_per_rung_in_order() -> None:
    spec = chain_spec(active_migration=True, max_run_duration_s=7200.0)
    body = cc.class_body("kfp-gpu-r1", spec, ["reservation", "flex-start", "spot", "on-demand"],
                         labels={"kfp-gpu.io/run-id": "r1"}, annotations={})
    pr = body["spec"]["priorities"]
    assert pr[0]["reservations"] == {"affinity": "Specific", "specific": [{"name": "res-a"}]}
    assert pr[1]["flexStart"] == {"enabled": True} and pr[1]["maxRunDurationSeconds"] == 7200
    assert pr[2]["spot"] is True and pr[3]["spot"] is False
    assert all(r["machineFamily"] == "a3" and r["gpu"] == {"type": "nvidia-h100-80gb", "count": 8} for r in pr)
    assert "spot" not in pr[0] and "spot" not in pr[1]  # GKE refuses spot beside reservations or flexStart
    assert body["spec"]["activeMigration"] == {"optimizeRulePriority": True}
    assert body["spec"]["nodePoolAutoCreation"] == {"enabled": True}
    assert body["spec"]["priorityDefaults"]["location"]["zones"] == ["us-central1-a"]
    assert [cc.capacity_of(r) for r in pr] == ["reservation", "flex-start", "spot", "on-demand"]


def test_class_name_is_a_label_value_and_distinct_per_run() -> None:
    a, b = cc.class_name("Run_A" * 20), cc.class_name("Run_B" * 20)
    assert a != b and len(a) <= 63 and a == a.lower()


def test_rule_of_reads_the_labels_gke_puts_on_a_node() -> None:
    pr = cc.class_body("c", chain_spec(), ["reservation", "flex-start", "spot", "on-demand"], labels={},
                       annotations={})["spec"]["priorities"]
    assert cc.rule_of(pr, {"cloud.google.com/reservation-name": "res-a"}) == 0
    assert cc.rule_of(pr, {"cloud.google.com/gke-flex-start": "true"}) == 1
    assert cc.rule_of(pr, {"cloud.google.com/gke-spot": "true"}) == 2
    assert cc.rule_of(pr, {}) == 3
    assert cc.rule_of(pr, {"cloud.google.com/reservation-name": "other"}) == -1


# ---- the verdict (virtual time) -----------------------------------------------------------------------------
def test_assess_waits_then_is_ready_or_times_out() -> None:
    assert cc.assess(ready=1, wanted=2, now=10.0, deadline=100.0).verdict is cc.Verdict.WAIT
    assert cc.assess(ready=2, wanted=2, now=10.0, deadline=100.0).verdict is cc.Verdict.READY
    out = cc.assess(ready=1, wanted=2, now=100.0, deadline=100.0)
    assert out.verdict is cc.Verdict.TIMEOUT and "1/2" in out.message


def test_the_timeout_names_the_class_and_the_rules() -> None:
    t = cc.timed_out(ready=1, wanted=2, name="c1", deadline_s=60, rules=["spot", "on-demand"])
    assert isinstance(t, ProvisioningTimeout) and "c1" in str(t) and "spot > on-demand" in str(t)


# ---- the backend hands a multi-node flex-start rung to an all-or-nothing backend ------------------------------
class _Atomic:
    """A stand-in backend object (no Kubernetes client involved): what the compute-class backend reads of it is the
    contract, ``all_or_nothing`` and ``acquire``."""

    name = "atomic"
    holds_placeholders = False

    def __init__(self, all_or_nothing: bool) -> None:
        self.all_or_nothing = all_or_nothing
        self.asked: list[ProvisioningSpec] = []

    def acquire(self, spec: ProvisioningSpec, run_id: str, request: object) -> object:
        from kfp_gpu.cluster.capacity import Capacity, Placement

        self.asked.append(spec)
        return Capacity(run_id, (Placement("dws-a", "us-central1-a", ("n1", "n2")),), 8, "nvidia-h100-80gb", False)


def test_multi_node_flex_start_is_acquired_through_the_all_or_nothing_backend() -> None:
    from kubernetes import client

    from kfp_gpu.provisioners.base import GangRequest
    from kfp_gpu.provisioners.compute_class import ComputeClassProvisioner

    atomic = _Atomic(all_or_nothing=True)
    backend = ComputeClassProvisioner(client.ApiClient(), queued=atomic)  # type: ignore[arg-type]
    spec = chain_spec(capacity="flex-start", reservation="", fallback=("spot", "on-demand"), nodes=2,
                      max_run_duration_s=3600.0, scale_up_deadline_s=600)
    cap = backend.acquire(spec, "run-1", GangRequest())
    assert cap.nodes == ("n1", "n2")
    (asked,) = atomic.asked
    assert asked.capacity.value == "flex-start" and asked.fallback == () and asked.nodes == 2
    assert asked.target.provisioner == "provisioning-request" and asked.max_run_duration_s == 3600.0
    assert asked.scale_up_deadline_s == 300  # half the deadline: the class's rungs get the rest


def test_acquire_refuses_a_required_topology_before_asking_for_any_capacity() -> None:
    from kubernetes import client

    from kfp_gpu.provisioners.base import GangRequest
    from kfp_gpu.provisioners.compute_class import ComputeClassProvisioner

    atomic = _Atomic(all_or_nothing=True)
    backend = ComputeClassProvisioner(client.ApiClient(), queued=atomic)  # type: ignore[arg-type]
    spec = chain_spec(capacity="flex-start", reservation="", fallback=("spot",), nodes=2, topology="required")
    with pytest.raises(InvalidSpec, match="topology='required'"):
        backend.acquire(spec, "run-1", GangRequest())
    assert atomic.asked == []  # refused up front: not even the queued flex-start rung was asked
