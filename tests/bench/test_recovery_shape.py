"""Smoke test of the recovery scenario's JSON shape and table section (no cluster, no timing)."""

from __future__ import annotations

from bench.common import Result
from bench.recovery import BASELINE, K, offset_for
from bench.run import table


def _out(*results: Result) -> dict:
    return {"mode": "quick", "started": "x", "wall_s": 1.0, "machine": {"cpus": 2}, "command": "c",
            "scenarios": {r.name: r.to_json() for r in results}}


def _fake() -> tuple[Result, Result, Result]:
    det = Result("recovery_detect", "d", baselines=(BASELINE,))
    res = Result("recovery", "r", baselines=(BASELINE,))
    lost = Result("recovery_steps_lost", "l", unit="steps",
                  baselines=(f"{BASELINE}_from_scratch", f"{BASELINE}_own_checkpoint"))
    lost.extra["checkpoint_every"] = K
    for ours_d, op_d, ours_r, op_r, off in [(0.04, 0.08, 1.0, 0.15, 3), (0.05, 0.07, 1.2, 0.14, 7)]:
        det.add("ours", ours_d)
        det.add(BASELINE, op_d)
        res.add("ours", ours_r)
        res.add(BASELINE, op_r)
        res.add("ours_incl_boot", ours_r + 1.0)
        res.add(f"{BASELINE}_incl_boot", op_r + 1.0)
        lost.add("ours", off)
        lost.add(f"{BASELINE}_from_scratch", 2 * K + off)
        lost.add(f"{BASELINE}_own_checkpoint", off)
    return det, res, lost


def test_recovery_json_has_the_bench_shape() -> None:
    det, res, lost = _fake()
    r = _out(det, res, lost)["scenarios"]["recovery"]
    for key in ("ours", BASELINE, "unit", f"ratio_vs_{BASELINE}", "stats", "samples"):
        assert key in r, key
    assert r["unit"] == "s" and r["stats"]["ours"]["n"] == 2 and r["stats"]["ours"]["max"] == 1.2
    sl = _out(lost)["scenarios"]["recovery_steps_lost"]
    assert sl["unit"] == "steps" and sl[f"ratio_vs_{BASELINE}_own_checkpoint"] == 1.0


def test_recovery_table_section() -> None:
    text = table(_out(*_fake()))
    sec = text.split("### 4. Recovery", 1)[1].split("### 5.", 1)[0]
    assert "detection latency" in sec and "Training Operator restart" in sec and "0.04 (0.04-0.05)" in sec
    assert f"Checkpoint interval {K} steps" in sec


def test_recovery_failures_are_loud() -> None:
    det, res, lost = _fake()
    res.sides.pop(BASELINE)
    res.errors[BASELINE] = "FAILED: RuntimeError: boom"
    sec = table(_out(det, res, lost)).split("### 4. Recovery", 1)[1]
    assert "**FAILED**: FAILED: RuntimeError: boom" in sec
    nothing = Result("recovery", "r")
    nothing.errors["ours"] = "FAILED: whole stage"
    assert "FAILED: whole stage" in table(_out(nothing))


def test_preemption_offsets_stay_inside_the_interval() -> None:
    offs = [offset_for(r) for r in range(5)]
    assert all(0 < o < K for o in offs) and len(set(offs)) == 5
