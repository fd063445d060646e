"""Quota arithmetic and placement ranking: pure functions over observed rows."""

from __future__ import annotations

from kfp_gpu.plan.placement import candidate_zones, plan_placements, rank, zone_region
from kfp_gpu.plan.quota import QuotaCheck, Verdict, evaluate, needs, worst
from kfp_gpu.providers.base import PoolRef, PoolState, QuotaAmount
from kfp_gpu.spec import ProvisioningSpec, Target, TargetKind

GKE = Target(kind=TargetKind.GKE, region="us-central1")
EKS = Target(kind=TargetKind.EKS, region="us-east-1")


def row(metric: str, loc: str, limit: float | None, usage: float | None = 0, **kw: object) -> QuotaAmount:
    return QuotaAmount(metric, loc, limit, usage, **kw)  # type: ignore[arg-type]


def pool(name: str, zone: str, size: int = 0, max_size: int = 8, acc: str = "a100-80gb", spot: bool = False) -> PoolState:
    return PoolState(PoolRef(name, zone, zone_region(zone)), size, max_size, acc, 8, "m", spot)


def test_gcp_needs_gpus_regional_and_global() -> None:
    spec = ProvisioningSpec("a100-80gb", nodes=2, target=GKE)
    ns = needs(spec, "us-central1")
    assert [(n.metrics[0], n.location, n.amount, n.unit) for n in ns] == [
        ("NVIDIA_A100_80GB_GPUS", "us-central1", 16.0, "gpus"),
        ("GPUS_ALL_REGIONS", "global", 16.0, "gpus"),
        ("CPUS", "us-central1", 192.0, "vcpus"),  # 2 x a2-ultragpu-8g, 96 vCPUs each
    ]


def test_gcp_vcpus_are_checked_when_the_region_lists_them() -> None:
    """GCE checks the machine type's vCPUs per VM (CPUS; PREEMPTIBLE_CPUS for Spot when the project has it)."""
    spec = ProvisioningSpec("a100-80gb", nodes=2, target=GKE)
    gpus = [row("NVIDIA_A100_80GB_GPUS", "us-central1", 64), row("GPUS_ALL_REGIONS", "global", 64)]
    assert [c.metric for c in evaluate(spec, "us-central1", gpus)] == ["NVIDIA_A100_80GB_GPUS", "GPUS_ALL_REGIONS"]
    short = evaluate(spec, "us-central1", [*gpus, row("CPUS", "us-central1", 150, unit="vcpus")])[2]
    assert (short.metric, short.verdict, short.short_by, short.unit) == ("CPUS", Verdict.SHORT, 42.0, "vcpus")
    spot = ProvisioningSpec("a100-80gb", nodes=2, capacity="spot", target=GKE)  # type: ignore[arg-type]
    none = [*gpus, row("PREEMPTIBLE_CPUS", "us-central1", 0), row("CPUS", "us-central1", 500)]
    assert evaluate(spot, "us-central1", none)[2].metric == "CPUS"  # no preemptible CPU quota: standard quota
    some = [*gpus, row("PREEMPTIBLE_CPUS", "us-central1", 100), row("CPUS", "us-central1", 500)]
    assert evaluate(spot, "us-central1", some)[2].verdict is Verdict.SHORT


def test_gcp_spot_prefers_preemptible_metric_and_falls_back() -> None:
    spec = ProvisioningSpec("a100-80gb", nodes=1, capacity="spot", target=GKE)  # type: ignore[arg-type]
    checks = evaluate(spec, "us-central1", [row("NVIDIA_A100_80GB_GPUS", "us-central1", 8), row("GPUS_ALL_REGIONS", "global", 8)])
    assert checks[0].metric == "NVIDIA_A100_80GB_GPUS" and checks[0].verdict is Verdict.FITS
    checks = evaluate(spec, "us-central1", [
        row("PREEMPTIBLE_NVIDIA_A100_80GB_GPUS", "us-central1", 4), row("NVIDIA_A100_80GB_GPUS", "us-central1", 64),
        row("GPUS_ALL_REGIONS", "global", 64),
    ])
    assert checks[0].metric == "PREEMPTIBLE_NVIDIA_A100_80GB_GPUS"
    assert checks[0].verdict is Verdict.SHORT and checks[0].short_by == 4.0


def test_h100_family_quota_is_accepted() -> None:
    spec = ProvisioningSpec("h100-80gb", nodes=1, target=GKE)
    checks = evaluate(spec, "us-central1", [row("NVIDIA_H100", "us-central1", 16), row("GPUS_ALL_REGIONS", "global", 16)])
    assert [c.verdict for c in checks] == [Verdict.FITS, Verdict.FITS]


def test_aws_needs_vcpus_of_instances() -> None:
    spec = ProvisioningSpec("h100-80gb", nodes=2, target=EKS)
    assert [(n.metric, n.amount, n.unit) for n in needs(spec, "us-east-1")] == [("L-417A185B", 384.0, "vcpus")]
    spot = ProvisioningSpec("l4", nodes=3, gpus_per_node=4, capacity="spot", target=EKS)  # type: ignore[arg-type]
    assert [(n.metric, n.amount) for n in needs(spot, "us-east-1")] == [("L-3819A6DF", 144.0)]


def test_unknown_never_counts_as_ok() -> None:
    spec = ProvisioningSpec("a100-80gb", nodes=1, target=GKE)
    checks = evaluate(spec, "us-central1", [
        row("NVIDIA_A100_80GB_GPUS", "us-central1", None, None, status="unknown", reason="403 on regions.get"),
    ])
    assert [c.verdict for c in checks] == [Verdict.UNKNOWN, Verdict.UNKNOWN]
    assert "403" in checks[0].reason and "no quota row" in checks[1].reason
    assert worst(c.verdict for c in checks) is Verdict.UNKNOWN
    assert worst([]) is Verdict.UNKNOWN
    assert worst([Verdict.FITS, Verdict.SHORT, Verdict.UNKNOWN]) is Verdict.SHORT


def test_quota_check_round_trips() -> None:
    c = QuotaCheck("M", "r", "gpus", 8, Verdict.SHORT, 4, 0, 4, "short by 4", "path", 2.0)
    assert QuotaCheck.from_dict(c.to_dict()) == c


def test_candidate_zones_explicit_then_pools_then_region() -> None:
    spec = ProvisioningSpec("a100-80gb", nodes=1, target=GKE, zones=("us-central1-c", "us-central1-a"))
    assert candidate_zones(spec, "us-central1", []) == ["us-central1-c", "us-central1-a"]
    spec2 = spec.replace(zones=())
    pools = [pool("p", "us-central1-b"), pool("p", "us-central1-a"), pool("q", "us-central1-f", acc="l4")]
    assert candidate_zones(spec2, "us-central1", pools) == ["us-central1-a", "us-central1-b"]
    assert candidate_zones(spec2, "us-west1", pools) == [""]


def test_placements_rank_fitting_first_then_headroom() -> None:
    spec = ProvisioningSpec("a100-80gb", nodes=2, target=GKE)
    ok = [row("NVIDIA_A100_80GB_GPUS", "us-central1", 64), row("GPUS_ALL_REGIONS", "global", 512)]
    roomy = [row("NVIDIA_A100_80GB_GPUS", "us-west1", 256), row("GPUS_ALL_REGIONS", "global", 512)]
    tight = [row("NVIDIA_A100_80GB_GPUS", "europe-west4", 8), row("GPUS_ALL_REGIONS", "global", 512)]
    pools = {
        "us-central1": [pool("p", "us-central1-a"), pool("p", "us-central1-b", max_size=1)],
        "us-west1": [pool("p", "us-west1-a")],
        "europe-west4": [pool("p", "europe-west4-a")],
    }
    ranked = plan_placements(
        spec,
        {r: evaluate(spec, r, rows) for r, rows in
         (("europe-west4", tight), ("us-central1", ok), ("us-west1", roomy))},
        pools,
    )
    assert [(p.label, p.verdict) for p in ranked] == [
        ("us-west1-a", Verdict.FITS), ("us-central1-a", Verdict.FITS),
        ("us-central1-b", Verdict.SHORT), ("europe-west4-a", Verdict.SHORT),
    ]
    assert "hold at most 1 of the 2 nodes" in " ".join(ranked[2].reasons)
    assert ranked[3].shortfalls[0].short_by == 8.0


def test_explicit_zone_priority_beats_headroom_and_pools_unknown() -> None:
    spec = ProvisioningSpec("a100-80gb", nodes=1, target=GKE, zones=("us-central1-b", "us-central1-a"))
    rows = [row("NVIDIA_A100_80GB_GPUS", "us-central1", 64), row("GPUS_ALL_REGIONS", "global", 64)]
    ranked = plan_placements(spec, {"us-central1": evaluate(spec, "us-central1", rows)}, {"us-central1": None})
    assert [(p.zone, p.verdict) for p in ranked] == [("us-central1-b", Verdict.UNKNOWN), ("us-central1-a", Verdict.UNKNOWN)]
    assert "node pools could not be listed" in ranked[0].reasons
    assert rank(ranked, by_headroom=False) == ranked


def test_a_backend_that_launches_without_pools_is_judged_on_quota_alone() -> None:
    # EKS with Karpenter alone launching p4d nodes: no managed node group matches, which bounds nothing
    spec = ProvisioningSpec("a100-40gb", nodes=4, capacity="spot", target=EKS, zones=("us-east-1a",))  # type: ignore[arg-type]
    quota = {"us-east-1": evaluate(spec, "us-east-1", [row("L-7212CCBC", "us-east-1", 4 * 96)])}
    bound = plan_placements(spec, quota, {"us-east-1": []})
    assert [p.verdict for p in bound] == [Verdict.SHORT] and "hold at most 0 of the 4 nodes" in bound[0].reasons[0]
    free = plan_placements(spec, quota, {"us-east-1": []}, pool_bound=False)
    assert [(p.zone, p.verdict, p.pool_capacity_nodes, p.reasons) for p in free] == [("us-east-1a", Verdict.FITS,
                                                                                      None, ())]
    short = {"us-east-1": evaluate(spec, "us-east-1", [row("L-7212CCBC", "us-east-1", 3 * 96)])}
    assert [p.verdict for p in plan_placements(spec, short, {"us-east-1": []}, pool_bound=False)] == [Verdict.SHORT]
