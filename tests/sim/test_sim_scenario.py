"""Scenario schema validation: every failure names the offending field."""

from __future__ import annotations

from typing import Any

import pytest

from kfp_gpu.errors import InvalidSpec
from kfp_gpu_rehearsal.sim import load
from kfp_gpu_rehearsal.sim.scenario import BootLatency, from_dict
from tests.sim._helpers import scenario


def _pool(**kw: Any) -> dict[str, Any]:
    base = {"name": "p1", "zone": "us-central1-a", "accelerator": "a100-80gb", "gpus_per_node": 8, "max_nodes": 4}
    base.update(kw)
    return base


def test_default_scenario_loads() -> None:
    sc = load()
    assert sc.project == "local-project" and sc.cluster == "kfp-gpu-local"
    assert set(sc.regions["us-central1"].zones) == {f"us-central1-{z}" for z in "abcf"}
    accs = {(p.accelerator, p.spot) for p in sc.pools}
    assert accs == {(a, s) for a in ("a100-80gb", "h100-80gb", "l4") for s in (False, True)}
    assert sc.pool("a100-80gb-spot-a").quota_metric == "PREEMPTIBLE_NVIDIA_A100_80GB_GPUS"


def test_load_file(tmp_path: Any) -> None:
    f = tmp_path / "s.yaml"
    f.write_text("project: p\nregions: {us-east1: {zones: [us-east1-b]}}\npools: []\n")
    assert load(f).regions["us-east1"].zones == ("us-east1-b",)
    with pytest.raises(InvalidSpec, match="scenario"):
        load(tmp_path / "missing.yaml")
    (tmp_path / "bad.yaml").write_text("a: [")
    with pytest.raises(InvalidSpec, match="not valid YAML"):
        load(tmp_path / "bad.yaml")


@pytest.mark.parametrize(("overrides", "field"), [
    ({"preemptions": [{"at_s": 1, "pool": "nope"}]}, "preemptions[0].pool"),
    ({"api_latency_ms": -5}, "api_latency_ms"),
    ({"pools": [_pool(boot={"dist": "lognormal", "median_s": -1})]}, "pools[0].boot.median_s"),
    ({"pools": [_pool(boot={"dist": "weibull"})]}, "pools[0].boot.dist"),
    ({"pools": [_pool(zone="us-east1-b")]}, "pools[0].zone"),
    ({"pools": [_pool(accelerator="tpu")]}, "pools[0].accelerator"),
    ({"pools": [_pool(gpus_per_node=3)]}, "pools[0].gpus_per_node"),
    ({"pools": [_pool(initial_size=5)]}, "pools[0].initial_size"),
    ({"pools": [_pool(), _pool()]}, "pools.name"),
    ({"pools": [_pool(colour="red")]}, "pools[0].colour"),
    ({"stockouts": [{"zone": "us-central1-z"}]}, "stockouts[0].zone"),
    ({"stockouts": [{"zone": "us-central1-a", "window": "sometimes"}]}, "stockouts[0].window"),
    ({"faults": [{"path": "(", "status": 429}]}, "faults[0].path"),
    ({"faults": [{"path": "x", "status": 200}]}, "faults[0].status"),
    ({"global_quotas": {"GPUS_ALL_REGIONS": {"limit": 8, "usage": 16}}}, "global_quotas.GPUS_ALL_REGIONS.limit"),
    ({"regions": {"us-central1": {"zones": ["us-central1-a"],
                                   "quotas": {"NVIDIA_L4_GPUS": {"limit": 1, "usage": 2}}}}},
     "regions.us-central1.quotas.NVIDIA_L4_GPUS.limit"),
    ({"regions": {"us-central1": {"zones": ["us-east1-a"]}}}, "regions.us-central1.zones"),
    ({"unknown_key": 1}, "scenario.unknown_key"),
    ({"cloud": "azure"}, "cloud"),
    ({"operations": {"pending_s": -1}}, "operations.pending_s"),
    ({"operations": {"resize_s": 1}}, "operations.resize_s"),
    ({"preemption": {"notice_s": "soon"}}, "preemption.notice_s"),
    ({"device_plugin_s": -1}, "device_plugin_s"),
    ({"mig_retry_s": 0}, "mig_retry_s"),
    ({"pools": [_pool(autoscaling={"max_nodes": 9})]}, "pools[0].autoscaling.max_nodes"),
    ({"pools": [_pool(autoscaling={"enabled": "yes"})]}, "pools[0].autoscaling.enabled"),
    ({"pools": [_pool(autoscaling={"min_nodes": 3, "max_nodes": 2})]}, "pools[0].autoscaling.max_nodes"),
    ({"pools": [_pool(boot={"dist": "lognormal", "min_s": -1})]}, "pools[0].boot.min_s"),
])
def test_invalid_scenarios_name_the_field(overrides: dict[str, Any], field: str) -> None:
    data = scenario(pools=[], stockouts=[], faults=[], preemptions=[])
    data.update(overrides)
    with pytest.raises(InvalidSpec) as info:
        from_dict(data)
    assert info.value.fields["field"] == field, info.value


def test_quota_below_initial_pool_usage_is_rejected() -> None:
    data = scenario(pools=[_pool(initial_size=4)])
    data["regions"]["us-central1"]["quotas"]["NVIDIA_A100_80GB_GPUS"] = {"limit": 16}
    with pytest.raises(InvalidSpec) as info:
        from_dict(data)
    assert info.value.fields["field"] == "regions.us-central1.quotas.NVIDIA_A100_80GB_GPUS.limit"


def test_stockout_windows() -> None:
    sc = from_dict(scenario(stockouts=[
        {"zone": "us-central1-b", "window": "always"},
        {"zone": "us-central1-c", "start_s": 10, "end_s": 20, "accelerator": "nvidia-h100-80gb"},
    ]))
    always, window = sc.stockouts
    assert always.active(0, "l4") and always.active(1e9, "a100-80gb")
    assert not window.active(5, "h100-80gb") and window.active(15, "h100-80gb")
    assert not window.active(25, "h100-80gb") and not window.active(15, "l4")


def test_boot_latency_is_seeded() -> None:
    b = BootLatency("lognormal", 2.0, 0.5, seed=7)
    first = [b.sample(r) for r in [b.sampler()] for _ in range(5)]
    rng = b.sampler()
    assert [b.sample(rng) for _ in range(5)] == first
    assert all(x > 0 for x in first) and len(set(first)) == 5
    assert BootLatency("fixed", 1.5).sample(BootLatency().sampler()) == 1.5


def test_world_timing_defaults_and_overrides() -> None:
    sc = from_dict(scenario(cloud="aws", preemption={}, operations={"set_size_s": 60}))
    assert sc.world.cloud == "aws" and sc.world.notice_s == 120.0  # the EC2 two-minute notice
    assert sc.world.operations.set_size_s == 60.0 and sc.world.operations.pending_s == 3.0
    pool = from_dict(scenario(pools=[_pool()])).pools[0]
    assert pool.boot.dist == "lognormal" and pool.boot.median_s == 210.0  # a100 default, real-world s
    assert not pool.autoscaling.enabled
    auto = from_dict(scenario(pools=[_pool(autoscaling={"min_nodes": 1})])).pools[0].autoscaling
    assert (auto.enabled, auto.min_nodes, auto.max_nodes) == (True, 1, 4)  # max defaults to the pool's


def test_cpu_quota_below_the_initial_pools_vcpus_and_bad_stockout_capacity_are_named() -> None:
    data = scenario(pools=[{"name": "l4-a", "zone": "us-central1-a", "accelerator": "l4", "gpus_per_node": 1,
                            "initial_size": 3}])
    data["regions"]["us-central1"]["quotas"]["CPUS"] = {"limit": 11, "usage": 0}  # 3 x g2-standard-4 = 12 vCPUs
    with pytest.raises(InvalidSpec, match=r"regions\.us-central1\.quotas\.CPUS\.limit.*12 vCPUs"):
        from_dict(data)
    data["regions"]["us-central1"]["quotas"]["CPUS"] = {"limit": 12, "usage": 0}
    assert from_dict(data).pools[0].initial_size == 3
    for bad in (-1, 1.5, True):
        with pytest.raises(InvalidSpec, match=r"stockouts\[0\]\.capacity"):
            from_dict(scenario(stockouts=[{"zone": "us-central1-a", "capacity": bad}]))
