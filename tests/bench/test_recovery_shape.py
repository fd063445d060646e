"""Smoke test of the recovery scenario's JSON shape (no cluster, no timing)."""

from __future__ import annotations

from bench.common import Result
from bench.recovery import BASELINE, K, offset_for


def test_recovery_json_has_the_bench_shape() -> None:
    res = Result("recovery", "r", baselines=(BASELINE,))
    for ours, op in [(1.0, 0.15), (1.2, 0.14)]:
        res.add("ours", ours)
        res.add(BASELINE, op)
    r = res.to_json()
    for key in ("ours", BASELINE, "unit", f"ratio_vs_{BASELINE}", "stats", "samples"):
        assert key in r, key
    assert r["unit"] == "s" and r["stats"]["ours"]["n"] == 2 and r["stats"]["ours"]["max"] == 1.2
    assert r[f"ratio_vs_{BASELINE}"] == round(1.1 / 0.145, 4)


def test_preemption_offsets_stay_inside_the_interval() -> None:
    offs = [offset_for(r) for r in range(5)]
    assert all(0 < o < K for o in offs) and len(set(offs)) == 5
