"""Pure parts of the dev cluster's cluster-autoscaler profile: node groups, templates, flags, the CRD rename."""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path

import pytest
import yaml

from kfp_gpu import accelerators
from kfp_gpu_rehearsal.devcluster import autoscaler, ca_profile, provreq_crd
from kfp_gpu_rehearsal.devcluster.ca_profile import NODE_GROUPS, TAINT


def test_node_groups_as_the_lead_tests_expect() -> None:
    rows = {(g.name, g.zone, g.accelerator, g.gpus, g.max_size, g.spot) for g in NODE_GROUPS}
    assert rows == {
        ("ca-a100-a", "us-central1-a", "a100-80gb", 8, 4, False),
        ("ca-a100-b", "us-central1-b", "a100-80gb", 8, 4, False),
        ("ca-a100-spot-a", "us-central1-a", "a100-80gb", 8, 4, True),
        ("ca-l4-a", "us-central1-a", "l4", 8, 2, False),
        ("ca-a100-bench", "us-central1-c", "a100-80gb", 8, 512, False),  # the bench's only, its own taint
    }
    assert ca_profile.default_gpus("l4") == max(m.gpus for m in accelerators.get("l4").gce_machines)
    with pytest.raises(dataclasses.FrozenInstanceError):
        NODE_GROUPS[0].max_size = 9  # type: ignore[misc]


@pytest.mark.parametrize("g", NODE_GROUPS, ids=lambda g: g.name)
def test_template_looks_like_a_gke_gpu_node_of_its_group(g: ca_profile.NodeGroup) -> None:
    node = ca_profile.template_node(g)
    labels, notes = node["metadata"]["labels"], node["metadata"]["annotations"]
    acc = accelerators.get(g.accelerator)
    assert labels["cloud.google.com/gke-nodepool"] == g.name
    assert labels["cloud.google.com/gke-accelerator"] == acc.gke_label
    assert labels["topology.kubernetes.io/zone"] == g.zone
    assert labels["topology.kubernetes.io/region"] == "us-central1"
    assert labels["node.kubernetes.io/instance-type"] == acc.gce_machine_for(g.gpus).name
    assert labels.get("cloud.google.com/gke-spot") == ("true" if g.spot else None)
    assert labels[ca_profile.CLUSTER_LABEL] == ca_profile.CLUSTER == "ca"
    assert labels[ca_profile.GROUP_LABEL] == g.name
    assert "kubernetes.io/hostname" not in labels  # every CA node is a copy: no shared hostname
    assert notes["kwok.x-k8s.io/node"] == "fake"  # our KWOK manages it
    assert notes["cluster-autoscaler.kwok.nodegroup/max-count"] == str(g.max_size)
    if g.name == ca_profile.BENCH_GROUP:  # the bench's injector draws each node's boot (bench/burst.py)
        assert labels["kfp-gpu.io/boot-injection"] == "pending" and "kfp-gpu.io/boot-delay" not in notes
    else:
        assert notes["kfp-gpu.io/boot-delay"] == f"{ca_profile.BOOT_DELAY_S:g}s"
        assert "kfp-gpu.io/boot-injection" not in labels
    assert "kfp-gpu.io/ready-at" not in notes  # an absolute time would be copied to every node
    for key in ("capacity", "allocatable"):
        assert node["status"][key]["nvidia.com/gpu"] == str(g.gpus)
        assert {"cpu", "memory", "pods"} <= set(node["status"][key])
    taints = {(t["key"], t.get("value"), t["effect"]) for t in node["spec"]["taints"]}
    own = {tuple(ca_profile.taint_dict(t).values()) for t in g.taints}  # the bench group's fence
    assert taints == {("nvidia.com/gpu", "present", "NoSchedule"),
                      ("kfp-gpu.io/dedicated", "training", "NoSchedule")} | own


def test_taint_and_toleration_parse_the_one_constant() -> None:
    assert TAINT == "kfp-gpu.io/dedicated=training:NoSchedule"
    assert ca_profile.toleration() == {"key": "kfp-gpu.io/dedicated", "operator": "Equal", "value": "training",
                                       "effect": "NoSchedule"}
    with pytest.raises(ValueError, match="key=value:Effect"):
        ca_profile.taint_dict("no-effect=x")


def test_provider_config_reads_our_templates_by_our_label() -> None:
    cfg = yaml.safe_load(ca_profile.provider_config())
    assert cfg["readNodesFrom"] == "configmap"
    assert cfg["nodegroups"] == {"fromNodeLabelKey": ca_profile.GROUP_LABEL}
    assert cfg["configmap"] == {"name": ca_profile.TEMPLATES_CM}
    assert cfg["nodes"]["gpuConfig"]["gpuLabelKey"] == "cloud.google.com/gke-accelerator"
    assert set(cfg["nodes"]["gpuConfig"]["availableGPUTypes"]) == {"nvidia-a100-80gb", "nvidia-l4"}
    assert cfg["nodes"]["skipTaint"] is True
    # the benchmark's CA keeps the provider's default ConfigMap names, so the two never share a config
    assert {ca_profile.CONFIG_CM, ca_profile.TEMPLATES_CM}.isdisjoint({autoscaler.CONFIG_CM, autoscaler.TEMPLATES_CM})


def test_config_digest_follows_the_node_groups(monkeypatch: pytest.MonkeyPatch) -> None:
    before = ca_profile.config_digest()
    assert before == ca_profile.config_digest()
    bigger = tuple(ca_profile.NodeGroup(g.name, g.zone, g.accelerator, g.gpus, g.max_size + 1, g.spot)
                   for g in NODE_GROUPS)
    monkeypatch.setattr(ca_profile, "NODE_GROUPS", bigger)
    assert ca_profile.config_digest() != before


def test_flags_serve_provisioning_requests_and_keep_the_status_configmap() -> None:
    flags = set(ca_profile.FLAGS)
    assert {"--enable-provisioning-requests", "--kube-api-content-type=application/json", "--scan-interval=1s",
            "--write-status-configmap=true", "--status-config-map-name=cluster-autoscaler-status"} <= flags
    argv = autoscaler.base_argv(autoscaler.binary(), Path("/k"), 1234)
    assert "--cloud-provider=kwok" in argv and "--address=127.0.0.1:1234" in argv
    bench = autoscaler.Autoscaler(Path("/k")).argv()
    assert f"--status-config-map-name={autoscaler.BENCH_STATUS_CM}" in bench
    assert autoscaler.BENCH_STATUS_CM != ca_profile.STATUS_CM


def test_empty_node_scale_down_runs_at_the_real_rate_per_world_minute() -> None:
    """A real CA (10 s loop, 10 deletions at once, 5 s taint delay) removes 60 empty nodes a real minute; a loop here
    is 120 world seconds, so it may start 120 deletions, each 5 s / TIME_SCALE after its taint."""
    from kfp_gpu_rehearsal.devcluster.worldtime import TIME_SCALE

    flags = set(ca_profile.FLAGS)
    assert "--max-scale-down-parallelism=120" in flags and "--node-delete-delay-after-taint=42ms" in flags
    real_per_world_s = 10 / 10.0  # CA defaults: nodes started per real second
    loop_world_s = 1.0 * TIME_SCALE  # --scan-interval=1s here, in world seconds
    assert ca_profile.SCALE_DOWN_PARALLELISM == round(real_per_world_s * loop_world_s)
    assert abs(ca_profile.DELETE_DELAY_AFTER_TAINT_MS / 1000 * TIME_SCALE - 5.0) < 0.1


UPSTREAM = {
    "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
    "metadata": {"name": "provisioningrequests.autoscaling.x-k8s.io", "annotations": {"a": "b"},
                 "creationTimestamp": None},
    "spec": {"group": "autoscaling.x-k8s.io", "names": {"kind": "ProvisioningRequest"}, "scope": "Namespaced",
             "versions": [{"name": "v1beta1", "served": True, "storage": True,
                           "schema": {"openAPIV3Schema": {"type": "object"}}, "subresources": {"status": {}}}]},
    "status": {"acceptedNames": {}},
}


def test_crd_rename_keeps_the_schema() -> None:
    before = copy.deepcopy(UPSTREAM)
    out = provreq_crd.as_v1(UPSTREAM)
    assert UPSTREAM == before  # not mutated
    (v,) = out["spec"]["versions"]
    assert (v["name"], v["served"], v["storage"]) == ("v1", True, True)
    assert v["schema"] == UPSTREAM["spec"]["versions"][0]["schema"]
    assert v["subresources"] == {"status": {}}
    assert out["metadata"] == {"name": "provisioningrequests.autoscaling.x-k8s.io", "annotations": {"a": "b"}}
    assert "status" not in out
    assert provreq_crd.as_v1(out) == out  # idempotent


@pytest.mark.parametrize("mutate", [
    lambda d: d["spec"]["versions"].append({"name": "v1"}),
    lambda d: d["spec"]["versions"][0].update(name="v2"),
    lambda d: d["metadata"].update(name="other.x-k8s.io"),
])
def test_crd_rename_refuses_an_unexpected_upstream(mutate: object) -> None:
    doc = copy.deepcopy(UPSTREAM)
    mutate(doc)  # type: ignore[operator]
    with pytest.raises(provreq_crd.CrdError):
        provreq_crd.as_v1(doc)


def _taints(g: ca_profile.NodeGroup) -> list[str]:
    return [f"{t['key']}={t['value']}:{t['effect']}" for t in ca_profile.template_node(g)["spec"]["taints"]]


def test_bench_group_needs_its_own_toleration() -> None:
    g = next(g for g in ca_profile.NODE_GROUPS if g.name == ca_profile.BENCH_GROUP)
    node = ca_profile.template_node(g)
    assert node["metadata"]["annotations"]["cluster-autoscaler.kwok.nodegroup/max-count"] == "512"
    assert ca_profile.BENCH_TAINT in _taints(g) and ca_profile.TAINT in _taints(g)
    assert g.zone not in {o.zone for o in ca_profile.NODE_GROUPS if o.name != ca_profile.BENCH_GROUP}


def test_test_groups_unchanged() -> None:
    others = {g.name: g for g in ca_profile.NODE_GROUPS if g.name != ca_profile.BENCH_GROUP}
    assert set(others) == {"ca-a100-a", "ca-a100-b", "ca-a100-spot-a", "ca-l4-a"}
    assert [others[n].max_size for n in ("ca-a100-a", "ca-a100-b", "ca-a100-spot-a", "ca-l4-a")] == [4, 4, 4, 2]
    assert all(ca_profile.BENCH_TAINT not in _taints(g) for g in others.values())
