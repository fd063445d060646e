from __future__ import annotations

import json
import statistics

import pytest

from kfp_gpu.report.cost import cost_report
from kfp_gpu.spec import CostInputs, ProvisioningSpec
from kfp_gpu.timeline import NodeState, Timeline
from tests.report._timelines import T0, make_timeline


def _tl(latencies: list[float], *, up_for: float = 3600.0) -> Timeline:
    tl = Timeline(run_id="r")
    for i, lat in enumerate(latencies):
        n = tl.node(f"n{i}", gpus=8)
        n.advance(NodeState.REQUESTED, T0)
        n.advance(NodeState.REGISTERED, T0 + lat / 2)
        n.advance(NodeState.READY, T0 + lat)
        n.advance(NodeState.RELEASED, T0 + lat + up_for)
    return tl


def test_three_tiers_use_measured_jitter(spec: ProvisioningSpec) -> None:
    tl = _tl([100.0, 100.0, 100.0, 300.0])
    r = cost_report(spec, tl)
    assert r.base_usd == pytest.approx(32 * 4.0 * 2.0)
    assert r.jitter == pytest.approx((300 - 100) / 100)
    assert r.risk_usd == pytest.approx(r.base_usd * 2.0)
    assert r.expected_delay_s == pytest.approx(200.0)
    assert r.penalty_usd == pytest.approx(1000.0 * 200 / 3600)
    assert r.total_usd == pytest.approx(r.base_usd + r.risk_usd + r.penalty_usd)


def test_no_jitter_when_uniform(spec: ProvisioningSpec) -> None:
    r = cost_report(spec, _tl([120.0] * 4))
    assert r.jitter == 0 and r.risk_usd == 0 and r.penalty_usd == 0
    assert r.total_usd == pytest.approx(r.base_usd)


def test_gpu_hours_provisioned_used_idle(spec: ProvisioningSpec) -> None:
    tl = _tl([100.0] * 4, up_for=3600.0)  # 4 nodes x 8 GPUs x 1 h Ready
    tl.event("job-running", T0 + 100.0, gpus=32)
    tl.event("job-finished", T0 + 100.0 + 1800.0)
    r = cost_report(spec, tl)
    assert r.provisioned_gpu_hours == pytest.approx(32.0)
    assert r.used_gpu_hours == pytest.approx(16.0)
    assert r.idle_gpu_minutes == pytest.approx(16.0 * 60)
    assert r.utilisation == pytest.approx(0.5)


def test_preempted_node_stops_counting_at_preemption(spec: ProvisioningSpec) -> None:
    tl = make_timeline(4, preempt=1)
    r = cost_report(spec, tl)
    assert r.nodes_preempted == 1 and r.nodes_ready == 4
    pre = next(n for n in tl.nodes.values() if n.at(NodeState.PREEMPTED))
    ready_to_pre = (pre.times["preempted"] - pre.times["ready"]) / 3600 * 8
    others = sum((n.times["released"] - n.times["ready"]) / 3600 * 8 for n in tl.nodes.values() if n is not pre)
    assert r.provisioned_gpu_hours == pytest.approx(ready_to_pre + others, rel=1e-5)
    lat = tl.ready_latencies()
    assert r.expected_delay_s == pytest.approx(max(lat) - statistics.median(lat), abs=1e-3)


def test_catalog_price_and_notes_without_data() -> None:
    s = ProvisioningSpec(accelerator="a100-80gb", nodes=2, cost=CostInputs(expected_hours=1.0))
    r = cost_report(s, Timeline())
    assert r.price_per_gpu_hour == pytest.approx(5.07)
    assert r.jitter == 0 and r.provisioned_gpu_hours == 0 and r.utilisation is None
    assert any("fewer than two" in n for n in r.notes)
    assert any("job-running" in n for n in r.notes)


def test_renderings(spec: ProvisioningSpec) -> None:
    r = cost_report(spec, make_timeline(4))
    d = json.loads(json.dumps(r.to_dict()))
    assert d["total_usd"] == r.total_usd and "utilisation" in d
    md = r.to_markdown()
    assert md.count("\n|") >= 8 and "| total |" in md
    term = r.to_terminal(width=80)
    assert all(len(line) <= 80 for line in term.splitlines())
    assert "idle GPU-minutes" in term


def test_preflight_rows_from_quota_checks() -> None:
    from kfp_gpu.plan.quota import QuotaCheck, Verdict
    from kfp_gpu.report.html import preflight_table_html, rows_from_quota_checks

    checks = [
        QuotaCheck("NVIDIA_H100_GPUS", "us-central1", "gpus", 32, Verdict.SHORT, 64, 48, 16,
                   "short by 16 gpus", "console://quotas", 2.0),
        QuotaCheck("GPUS_ALL_REGIONS", "global", "gpus", 32, Verdict.FITS, 100, 0, 100),
        QuotaCheck("NVIDIA_H100", "us-central1", "gpus", 32, Verdict.UNKNOWN, reason="403"),
    ]
    rows = rows_from_quota_checks(checks)
    assert [r.status for r in rows] == ["short", "ok", "unknown"]
    assert rows[0].short == 16 and "console://quotas" in rows[0].remediation and rows[0].lead_time_days == 2.0
    html = preflight_table_html(rows)
    assert html.count("<tr class=") == 3 and "approval lead time 2 days" in html
