import json

import pytest

from kfp_gpu import accelerators
from kfp_gpu.errors import InvalidSpec, KfpGpuError, QuotaExceeded, Scope
from kfp_gpu.spec import CapacityType, CostInputs, ProvisioningSpec, Recovery, Target, WarmPool


def full_spec() -> ProvisioningSpec:
    return ProvisioningSpec(
        accelerator="nvidia-h100-80gb", nodes=16, gpus_per_node=8, capacity=CapacityType.SPOT,
        target=Target(kind="gke", cluster="train", project="p1", region="us-east5", pools=("h100-a", "h100-b")),
        zones=("us-east5-a", "us-east5-b"), scale_up_deadline_s=600.5, allow_zone_spread=True,
        warm_pool=WarmPool(nodes=2, ttl_s=600, cloud_reservation=False),
        recovery=Recovery(max_preemptions=5, on_demand_after=2, app_failure_retries=0),
        checkpoint_uri="gs://bucket/ckpt", cost=CostInputs(price_per_gpu_hour=9.5, expected_hours=3, sla_penalty_per_hour=100),
    )


def test_round_trip_is_lossless():
    s = full_spec()
    assert ProvisioningSpec.from_json(s.to_json()) == s
    assert ProvisioningSpec.from_json(s.to_json()).to_json() == s.to_json()
    assert s.accelerator == "h100-80gb"  # GKE label normalised to the catalog name
    assert s.total_gpus == 128


def test_spec_is_immutable():
    s = full_spec()
    with pytest.raises(AttributeError):
        s.nodes = 3  # type: ignore[misc]


@pytest.mark.parametrize(
    "changes, field, hint",
    [
        ({"nodes": 0}, "nodes", "[1, 4096]"),
        ({"accelerator": "x100"}, "accelerator", "a100-80gb"),
        ({"gpus_per_node": 3}, "gpus_per_node", "[1, 2, 4, 8]"),
        ({"zones": ("us-west1-a",)}, "zones", "not in target.region"),
        ({"scale_up_deadline_s": -5}, "scale_up_deadline_s", "must be in"),
        ({"capacity": "spot", "reservation": "res-1"}, "reservation", "spot capacity cannot consume"),
        ({"capacity": "bogus"}, "capacity", "'on-demand'"),
        ({"capacity": "reservation"}, "reservation", "needs a reservation name"),
        ({"nodes": 2, "warm_pool": WarmPool(nodes=3)}, "warm_pool.nodes", "<= nodes"),
        ({"checkpoint_uri": "ftp://x"}, "checkpoint_uri", "gs://"),
        ({"recovery": Recovery(on_demand_after=2)}, "recovery.on_demand_after", "capacity='spot'"),
        ({"nodes": True}, "nodes", "integer"),
        ({"zones": "us-central1-a"}, "zones", "must be a list, not one string (fix: write zones=('us-central1-a',))"),
        ({"checkpoint_uri": "s3://"}, "checkpoint_uri", "must be gs://BUCKET/..., s3://BUCKET/..."),
        ({"checkpoint_uri": "gs:///ckpt"}, "checkpoint_uri", "(fix: name the bucket"),
        ({"checkpoint_uri": "file://"}, "checkpoint_uri", "file://PATH"),
    ],
)
def test_bad_input_names_field_value_and_fix(changes, field, hint):
    kw = {"accelerator": "a100-80gb", "nodes": 4, **changes}
    with pytest.raises(InvalidSpec) as ei:
        ProvisioningSpec(**kw)
    err = ei.value
    assert err.field == field
    assert hint in str(err)
    assert err.remediation
    assert repr(err.value) in str(err) or str(err.value) in str(err)


def test_bad_target_fields():
    with pytest.raises(InvalidSpec, match="target.region"):
        Target(kind="eks", region="us-central1")
    with pytest.raises(InvalidSpec, match="target.kind"):
        Target(kind="azure")  # type: ignore[arg-type]
    with pytest.raises(InvalidSpec, match="target.pools"):
        Target(pools=("Bad_Pool",))
    with pytest.raises(InvalidSpec, match=r"invalid target.pools='pool-a': must be a list, not one string"):
        Target(pools="pool-a")  # type: ignore[arg-type]
    with pytest.raises(InvalidSpec, match=r"invalid target.tolerations=.*must be a list, not one string"):
        Target(tolerations="team=a:NoSchedule")  # type: ignore[arg-type]
    with pytest.raises(InvalidSpec, match=r"invalid fallback='spot': must be a list"):
        ProvisioningSpec(accelerator="a100-80gb", nodes=4, fallback="spot")  # type: ignore[arg-type]


def test_autoscaled_pools_option_defaults_validates_and_round_trips():
    assert Target().autoscaled_pools == "protect"
    with pytest.raises(InvalidSpec) as ei:
        Target(autoscaled_pools="ignore")
    assert ei.value.field == "target.autoscaled_pools"
    assert "'protect', 'refuse'" in str(ei.value) and "'ignore'" in str(ei.value)
    s = full_spec().replace(target=Target(kind="gke", cluster="train", region="us-east5", autoscaled_pools="refuse"))
    assert json.loads(s.to_json())["target"]["autoscaled_pools"] == "refuse"
    assert ProvisioningSpec.from_json(s.to_json()) == s
    bad = json.loads(s.to_json())
    bad["target"]["autoscaled_pools"] = "fight"
    with pytest.raises(InvalidSpec, match="target.autoscaled_pools"):
        ProvisioningSpec.from_dict(bad)


def test_eks_zones_and_instance_shapes():
    s = ProvisioningSpec("a100-80gb", 2, target=Target(kind="eks", region="us-east-1"), zones=("us-east-1a",))
    assert s.zones == ("us-east-1a",)
    with pytest.raises(InvalidSpec, match="EC2"):
        ProvisioningSpec("a100-80gb", 2, gpus_per_node=4, target=Target(kind="eks", region="us-east-1"))


@pytest.mark.parametrize(
    "text, field",
    [
        ("{not json", "spec_json"),
        ("[]", "spec"),
        ('{"accelerator": "a100-80gb", "nodes": 2, "colour": "red"}', "colour"),
        ('{"accelerator": "a100-80gb", "nodes": 2, "target": {"clutser": "x"}}', "target.clutser"),
        ('{"accelerator": "a100-80gb", "nodes": "two"}', "nodes"),
        ('{"accelerator": "a100-80gb", "nodes": 2, "version": 99}', "version"),
        ('{"nodes": 2}', "spec"),
    ],
)
def test_malformed_json_is_invalid_spec(text, field):
    with pytest.raises(InvalidSpec) as ei:
        ProvisioningSpec.from_json(text)
    assert ei.value.field == field


def test_price_defaults_and_override():
    s = ProvisioningSpec("l4", 1, gpus_per_node=1)
    assert s.price_per_gpu_hour() == accelerators.get("l4").price.on_demand
    assert s.replace(capacity="spot").price_per_gpu_hour() == accelerators.get("l4").price.spot
    assert s.replace(cost=CostInputs(price_per_gpu_hour=0.5)).price_per_gpu_hour() == 0.5


def test_catalog_has_required_rows():
    for name in ("a100-40gb", "a100-80gb", "h100-80gb", "h200", "l4", "t4"):
        acc = accelerators.get(name)
        assert acc.gke_label and acc.gce_machines and acc.aws_instances
        assert acc.gcp_quota_metric.endswith("_GPUS") and acc.gcp_preemptible_metric.startswith("PREEMPTIBLE_")
        assert acc.aws_quota_on_demand.startswith("L-") and acc.aws_quota_spot.startswith("L-")
        assert 0 < acc.price.spot < acc.price.on_demand
    assert accelerators.get("h100-80gb").gcp_gpu_family == "NVIDIA_H100"
    assert accelerators.get("a100-80gb").gcp_quota_metric == "NVIDIA_A100_80GB_GPUS"
    assert accelerators.PRICE_SOURCE and accelerators.PRICE_AS_OF


def test_error_round_trip_and_retry_semantics():
    err = QuotaExceeded("short 16 GPUs", remediation="raise NVIDIA_H100_GPUS", metric="NVIDIA_H100_GPUS", short=16)
    back = KfpGpuError.from_dict(json.loads(json.dumps(err.to_dict())))
    assert isinstance(back, QuotaExceeded) and back.fields["short"] == 16 and back.scope is Scope.REGION
    assert not back.transient
    inv = KfpGpuError.from_dict(InvalidSpec("nodes", 0, "must be >= 1").to_dict())
    assert isinstance(inv, InvalidSpec) and "nodes" in str(inv)


@pytest.mark.parametrize("changes, fix", [
    ({"nodes": 0}, "set nodes to a value in [1, 4096]"),
    ({"nodes": 1.5}, "set nodes to an integer in [1, 4096]"),
    ({"capacity": "spott"}, "set capacity to one of 'on-demand', 'spot', 'reservation', 'flex-start'"),
    ({"nodes": 2, "warm_pool": WarmPool(nodes=3)}, "set warm_pool.nodes to a value <= nodes (2)"),
    ({"gpus_per_node": 3}, "set gpus_per_node to one of [1, 2, 4, 8]"),
])
def test_the_fix_names_what_to_set_not_the_allowed_values_in_general(changes, fix):
    """Without a raiser's own remediation the fix is read from what is allowed (it said 'set nodes to one of the
    allowed values', naming none)."""
    with pytest.raises(InvalidSpec) as ei:
        ProvisioningSpec(**{"accelerator": "a100-80gb", "nodes": 4, **changes})
    assert ei.value.remediation == fix
