"""Smoke test of the bench harness's JSON shape (no cluster, no timing)."""

from __future__ import annotations

import json

from bench.common import Result, parse_go_duration, ratio
from bench.run import table, write


def _fake_run() -> dict:
    burst = Result("burst_n4", "burst", baselines=("cluster_autoscaler", "sequential"), target="t")
    for ours, ca, seq, lim in [(1.2, 3.0, 5.0, 1.1), (1.4, 2.0, 6.0, 1.3), (1.3, 4.0, 5.5, 1.2)]:
        burst.add("ours", ours)
        burst.add("cluster_autoscaler", ca)
        burst.add("sequential", seq)
        burst.add("limit", lim)
        burst.add("ours_over_limit", ours / lim)
    failed = Result("burst_n16", "burst", baselines=("cluster_autoscaler", "sequential"))
    failed.add("ours", 2.0)
    failed.add("limit", 1.8)
    failed.errors["cluster_autoscaler"] = "cluster-autoscaler FAILED to start: boom"
    pf = Result("preflight_6x3", "preflight", baselines=("sequential",))
    pf.add("ours", 0.4)
    pf.add("sequential", 8.0)
    pf.add("ours_round_trips", 2.0)
    rec = Result("recovery", "recovery")
    rec.errors["ours"] = "not measured"
    sc = {r.name: r.to_json() for r in (burst, failed, pf, rec)}
    return {"mode": "quick", "started": "x", "wall_s": 1.0, "machine": {"cpus": 2}, "command": "c", "scenarios": sc}


def test_scenario_objects_have_the_required_keys_and_same_run_ratios() -> None:
    out = _fake_run()
    b = out["scenarios"]["burst_n4"]
    for key in ("ours", "cluster_autoscaler", "sequential", "limit", "unit", "ratio_vs_cluster_autoscaler",
                "ratio_vs_sequential", "stats", "samples"):
        assert key in b, key
    assert b["unit"] == "s"
    assert b["ours"] == 1.3 and b["cluster_autoscaler"] == 3.0 and b["sequential"] == 5.5 and b["limit"] == 1.2
    # ratios are the medians of this run's own samples
    assert b["ratio_vs_cluster_autoscaler"] == ratio(b["ours"], b["cluster_autoscaler"])
    assert b["ratio_vs_sequential"] == ratio(b["ours"], b["sequential"])
    assert b["ratio_vs_limit"] == ratio(b["ours"], b["limit"])
    assert b["ratio_vs_cluster_autoscaler_per_repeat"] == [ratio(o, c) for o, c in zip(
        b["samples"]["ours"], b["samples"]["cluster_autoscaler"], strict=True)]
    assert b["stats"]["ours"] == {"median": 1.3, "min": 1.2, "max": 1.4, "n": 3}


def test_a_failed_baseline_is_loud_not_silent(tmp_path) -> None:
    out = _fake_run()
    f = out["scenarios"]["burst_n16"]
    assert f["cluster_autoscaler"] is None and f["ratio_vs_cluster_autoscaler"] is None
    assert "FAILED" in f["errors"]["cluster_autoscaler"]
    doc = tmp_path / "b.md"
    doc.write_text("head\n<!-- BEGIN RESULTS -->\nold\n<!-- END RESULTS -->\ntail\n")
    write(out, tmp_path / "latest.json", doc=doc)
    text = doc.read_text()
    assert "FAILED" in text and "old" not in text and text.startswith("head") and text.endswith("tail\n")
    assert json.loads((tmp_path / "latest.json").read_text())["scenarios"]["burst_n4"]["ours"] == 1.3
    assert "not measured" in table(out)


def test_go_durations() -> None:
    assert parse_go_duration("1.5s") == 1.5
    assert parse_go_duration("250ms") == 0.25
