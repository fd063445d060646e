"""GpuPolicy admission (kfp_gpu/plan/policy.py): selection, every rule's refusal, several policies. No cluster."""

from __future__ import annotations

import json
from typing import Any

import pytest

from kfp_gpu import install
from kfp_gpu.gang import api as gang
from kfp_gpu.plan.policy import NO_POLICY, RULES, Verdict, evaluate, matches, selects
from kfp_gpu.spec import CapacityType, ProvisioningSpec, Target


def policy(name: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": gang.API_VERSION, "kind": gang.POLICY_KIND, "metadata": {"name": name}, "spec": spec}


def gang_spec(**over: Any) -> dict[str, Any]:
    """A GpuGang spec as kfp_gpu.gang.api.body writes it (a real ProvisioningSpec), mirrors overridden."""
    spec = ProvisioningSpec(accelerator="a100-80gb", nodes=2, gpus_per_node=8)
    body = gang.body("run-1", "team-a", spec.to_json(), {"local": "local:host:1"})
    return {**body["spec"], **over}


TEAM = policy("tenant-team-a", namespaces=["team-a"])


def verdict(policies: list[dict[str, Any]], ns: str = "team-a", labels: dict[str, str] | None = None,
            in_use: int = 0, quota: bool = False, **over: Any) -> Verdict:
    return evaluate(policies, ns, labels or {}, gang_spec(**over), in_use, quota_request=quota)


# ---- selection --------------------------------------------------------------------------------------------

def test_no_policy_refuses_and_names_the_fix():
    v = verdict([policy("other", namespaces=["team-b"])])
    assert (v.admitted, v.rule, v.policy) == (False, NO_POLICY, "")
    assert "team-a" in v.message and "kfp-gpu tenant add team-a" in v.message


def test_empty_policy_list_refuses():
    assert verdict([]).rule == NO_POLICY


def test_policy_by_name_admits_with_no_limits():
    v = verdict([TEAM])
    assert v.admitted and v.policy == "tenant-team-a" and v.rule == ""
    assert "16 a100-80gb GPUs" in v.message


@pytest.mark.parametrize("selector, labels, selected", [
    ({}, {}, True),  # {} selects every namespace
    ({"matchLabels": {"team": "a"}}, {"team": "a", "x": "y"}, True),
    ({"matchLabels": {"team": "a"}}, {"team": "b"}, False),
    ({"matchLabels": {"team": "a"}}, {}, False),
    ({"matchExpressions": [{"key": "tier", "operator": "In", "values": ["gold", "silver"]}]}, {"tier": "gold"}, True),
    ({"matchExpressions": [{"key": "tier", "operator": "In", "values": ["gold"]}]}, {"tier": "bronze"}, False),
    ({"matchExpressions": [{"key": "tier", "operator": "In", "values": ["gold"]}]}, {}, False),
    ({"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["gold"]}]}, {"tier": "bronze"}, True),
    ({"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["gold"]}]}, {}, True),
    ({"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["gold"]}]}, {"tier": "gold"}, False),
    ({"matchExpressions": [{"key": "gpu", "operator": "Exists"}]}, {"gpu": ""}, True),
    ({"matchExpressions": [{"key": "gpu", "operator": "Exists"}]}, {}, False),
    ({"matchExpressions": [{"key": "gpu", "operator": "DoesNotExist"}]}, {}, True),
    ({"matchExpressions": [{"key": "gpu", "operator": "DoesNotExist"}]}, {"gpu": "x"}, False),
    ({"matchExpressions": [{"key": "gpu", "operator": "Gt", "values": ["1"]}]}, {"gpu": "2"}, False),  # unknown op
    ({"matchLabels": {"team": "a"}, "matchExpressions": [{"key": "gpu", "operator": "Exists"}]},
     {"team": "a"}, False),  # every requirement must hold
])
def test_namespace_selector(selector, labels, selected):
    assert matches(selector, labels) is selected
    p = policy("by-label", namespaceSelector=selector)
    assert selects(p, "team-a", labels) is selected
    assert verdict([p], labels=labels).admitted is selected


def test_no_selector_and_no_names_selects_nothing():
    assert not selects(policy("empty"), "team-a", {"team": "a"})


def test_name_or_selector_either_selects():
    p = policy("both", namespaces=["team-a"], namespaceSelector={"matchLabels": {"team": "z"}})
    assert selects(p, "team-a", {}) and selects(p, "team-z", {"team": "z"}) and not selects(p, "team-b", {})


# ---- each rule refuses ------------------------------------------------------------------------------------

REFUSALS = [
    ("accelerators", {"accelerators": ["h100-80gb"]}, {}, "accelerator='a100-80gb'", "h100-80gb"),
    ("capacityTypes", {"capacityTypes": ["on-demand"]}, {"capacityType": "spot"}, "capacityType='spot'", "on-demand"),
    ("pools", {"pools": ["gpu-a"]}, {"pools": ["gpu-a", "gpu-b"]}, "pools=['gpu-b']", "gpu-a"),
    ("pools", {"pools": ["gpu-a"]}, {"pools": []}, "any pool", "gpu-a"),
    ("backends", {"backends": ["karpenter"]}, {"backend": "auto"}, "backend='auto'", "karpenter"),
    ("maxGpusPerGang", {"maxGpusPerGang": 8}, {}, "16 GPUs (2 nodes x 8)", "at most 8"),
    ("maxRunSeconds", {"maxRunSeconds": 3600}, {"maxRunSeconds": 7200.0}, "maxRunSeconds=7200", "at most 3600"),
]


@pytest.mark.parametrize("rule, limits, over, asked, limit", REFUSALS, ids=[f"{r[0]}-{i}" for i, r in
                                                                            enumerate(REFUSALS)])
def test_each_rule_refuses_naming_value_limit_and_fix(rule, limits, over, asked, limit):
    v = verdict([policy("tenant-team-a", namespaces=["team-a"], **limits)], **over)
    assert (v.admitted, v.rule, v.policy) == (False, rule, "tenant-team-a")
    assert asked in v.message and limit in v.message and "(fix:" in v.message
    assert "kubectl edit gpupolicy tenant-team-a" in v.message


def test_namespace_gpus_count_what_the_other_gangs_hold():
    p = policy("tenant-team-a", namespaces=["team-a"], maxGpusPerNamespace=32)
    assert verdict([p], in_use=16).admitted  # 16 + 16 = 32
    v = verdict([p], in_use=17)
    assert v.rule == "maxGpusPerNamespace" and "other gangs hold 17" in v.message and "at most 32" in v.message


def test_quota_requests_need_the_policy_to_allow_them():
    assert verdict([TEAM]).admitted
    v = verdict([TEAM], quota=True)
    assert v.rule == "allowQuotaRequests" and not v.admitted
    assert verdict([policy("q", namespaces=["team-a"], allowQuotaRequests=True)], quota=True).admitted


def test_limits_at_the_edge_admit():
    p = policy("edge", namespaces=["team-a"], accelerators=["a100-80gb"], capacityTypes=["on-demand"],
               pools=["gpu-a"], backends=["node-pool"], maxGpusPerGang=16, maxGpusPerNamespace=16, maxRunSeconds=60)
    v = verdict([p], pools=["gpu-a"], backend="node-pool", maxRunSeconds=60.0)
    assert v.admitted, v.message
    assert v.max_run_seconds == 60.0


def test_a_gang_without_a_run_limit_gets_the_policys():
    v = verdict([policy("p", namespaces=["team-a"], maxRunSeconds=3600)])
    assert v.admitted and v.max_run_seconds == 3600.0
    assert verdict([TEAM]).max_run_seconds == 0.0  # neither asks: none


def test_a_zero_limit_admits_nothing():
    assert verdict([policy("p", namespaces=["team-a"], maxGpusPerGang=0)]).rule == "maxGpusPerGang"


def test_rules_are_checked_in_the_documented_order():
    p = policy("all", namespaces=["team-a"], accelerators=["h100-80gb"], maxGpusPerGang=1)
    assert verdict([p]).rule == "accelerators"  # both break: the first rule of RULES is named
    assert RULES.index("accelerators") < RULES.index("maxGpusPerGang")


# ---- several policies -------------------------------------------------------------------------------------

def test_any_selecting_policy_admits():
    strict = policy("a-strict", namespaces=["team-a"], maxGpusPerGang=8)
    wide = policy("b-wide", namespaceSelector={"matchLabels": {"tier": "gold"}}, maxGpusPerGang=64)
    assert verdict([strict, wide], labels={"tier": "gold"}).policy == "b-wide"
    v = verdict([wide, strict], labels={"tier": "bronze"})  # wide does not select: strict's refusal
    assert (v.admitted, v.policy, v.rule) == (False, "a-strict", "maxGpusPerGang")


def test_refusal_of_the_first_policy_by_name():
    b = policy("b", namespaces=["team-a"], accelerators=["h100-80gb"])
    a = policy("a", namespaces=["team-a"], capacityTypes=["spot"])
    v = verdict([b, a])
    assert (v.policy, v.rule) == ("a", "capacityTypes")


def test_policies_of_other_namespaces_do_not_count():
    other = policy("team-b", namespaces=["team-b"])
    v = verdict([other, policy("a", namespaces=["team-a"], maxGpusPerGang=1)])
    assert (v.admitted, v.policy) == (False, "a")


# ---- the policy `kfp-gpu tenant add` writes ---------------------------------------------------------------

def test_tenant_default_policy_admits_the_default_gang_and_refuses_too_big():
    p = install.tenant_objects("team-a")[-1]
    assert p["kind"] == gang.POLICY_KIND
    assert verdict([p]).admitted
    assert verdict([p], nodes=9, gpusPerNode=8).rule == "maxGpusPerGang"  # 72 > 64
    assert verdict([p], in_use=120).rule == "maxGpusPerNamespace"  # 120 + 16 > 128
    assert verdict([p], maxRunSeconds=604801.0).rule == "maxRunSeconds"
    assert verdict([p], quota=True).rule == "allowQuotaRequests"


def test_tenant_flags_become_rules():
    p = install.tenant_objects("team-a", accelerators=["h100-80gb"], capacity_types=["spot"],
                               max_gpus_per_gang=8)[-1]
    assert verdict([p]).rule == "accelerators"
    assert verdict([p], accelerator="h100-80gb").rule == "capacityTypes"
    assert verdict([p], accelerator="h100-80gb", capacityType="spot").rule == "maxGpusPerGang"
    assert verdict([p], accelerator="h100-80gb", capacityType="spot", nodes=1).admitted


def test_mirrors_of_a_real_spec_are_what_policy_reads():
    spec = ProvisioningSpec(accelerator="h100-80gb", nodes=4, gpus_per_node=8, capacity=CapacityType.SPOT,
                            target=Target(kind="gke", project="p", region="us-central1", cluster="c",
                                          pools=("gpu-a",), provisioner="node-pool"))
    body = gang.body("r", "team-a", spec.to_json(), {})
    p = policy("p", namespaces=["team-a"], accelerators=["h100-80gb"], capacityTypes=["spot"], pools=["gpu-a"],
               backends=["node-pool"], maxGpusPerGang=32)
    assert evaluate([p], "team-a", {}, body["spec"], 0).admitted
    assert json.loads(spec.to_json())["nodes"] == 4
    assert not evaluate([p], "team-a", {}, {**body["spec"], "nodes": 5}, 0).admitted
