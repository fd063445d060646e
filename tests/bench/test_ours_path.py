"""The bench's ours path through the GpuGang: its pure parts (no cluster, no timing)."""

from __future__ import annotations

import json

import pytest

from bench import ours, report, report_targets
from bench.overhead import _inside
from bench.run import _only, main


def test_only_names_scenarios_and_a_partial_run_needs_its_own_file() -> None:
    assert _only("control-plane") == ("control_plane",)
    assert _only("burst, recovery") == ("burst", "recovery")
    with pytest.raises(ValueError, match="unknown scenario 'nope'"):
        _only("nope")
    with pytest.raises(SystemExit):  # never latest.json / quick.json / the doc
        main(["--full", "--only", "control-plane"])


def test_a_stage_is_split_into_dispatch_work_and_answer_by_the_controllers_events() -> None:
    events = [(100.30, "PolicyAdmitted", ""), (100.40, "PreflightStarted", ""), (101.40, "Preflighted", ""),
              (101.70, "WarmPoolStarted", ""), (102.00, "WarmPoolHeld", ""), (110.0, "JobStarted", "")]
    got = ours.stage_profile(events, {"preflight": 100.0, "warm_pool": 101.5, "train": 109.9},
                             {"preflight": 101.6, "warm_pool": 102.3})
    assert got == pytest.approx({"preflight_dispatch": 0.4, "preflight_work": 1.0, "preflight_answer": 0.2,
                                 "warm_pool_dispatch": 0.2, "warm_pool_work": 0.3, "warm_pool_answer": 0.3,
                                 "train_dispatch": 0.1})


def test_the_work_units_own_time_is_read_from_the_gangs_results_and_the_train_timeline() -> None:
    gang = {"status": {"results": {"Preflighted": {"metrics": {"preflight_seconds": 0.25}},
                                   "Provisioned": {"metrics": {"scale_up_seconds": 1.5}}}}}
    tl = {"events": [{"kind": "job-created", "t": 50.75}, {"kind": "job-running", "t": 51.5},
                     {"kind": "job-created", "t": 60.0}, {"kind": "old", "t": 10.0}]}
    got = _inside(gang, {"preflight_work": 0.5, "scale_up_work": 2.0}, json.dumps({"timeline": json.dumps(tl)}), 50.0)
    assert got == pytest.approx({"preflight_fn": 0.25, "preflight_unit": 0.25, "scale_up_fn": 1.5,
                                 "scale_up_unit": 0.5, "train_job-created": 0.75, "train_job-running": 1.5})


def _cp(above: float, gpus: int = 512) -> dict:
    st = {k: {"median": v, "min": v, "max": v, "n": 3} for k, v in
          (("total", 2.5), ("preflight", 0.2), ("warm_pool", 0.8), ("scale_up", 1.2), ("job_launch", 0.3),
           ("world_nodes_ready", 2.5 - above), ("above_world", above))}
    ps = {"scale_up_dispatch": {"median": 0.15, "min": 0.1, "max": 0.2, "n": 3}}
    return {str(gpus): {"gpus": gpus, "nodes": gpus // 8, "samples": {}, "stats": st, "profile_stats": ps}}


def _out(cp: dict) -> dict:
    return {"schema": 2, "mode": "full", "sides": [], "repeats": 1, "git": {"commit": "0" * 40, "dirty": False},
            "machine": {"cpus": 2}, "world": {}, "control_plane": cp, "controller": {"namespace": "x"}}


def test_above_world_is_a_target_with_its_profile_and_a_column() -> None:
    t = {x["name"]: x for x in report_targets.targets(_out(_cp(0.7)))}
    miss = t["control_plane_512_above_world"]
    assert miss["met"] is False and miss["value"] == "0.70 s"
    assert "world_nodes_ready 1.80 s" in miss["profile"] and "scale_up_dispatch 0.15 s" in miss["profile"]
    assert "control_plane_4096_above_world" not in t  # not measured: no row
    assert {x["name"]: x for x in report_targets.targets(_out(_cp(0.4)))}["control_plane_512_above_world"]["met"] is True
    doc = report.render(_out(_cp(0.7)))
    assert "| job launch | world: last node Ready | above world |" in doc and "| 0.70 (0.70-0.70) |" in doc
    assert "`kfp_gpu.gang.client.request` calls with the tenant's `kfp-gpu` token" in doc


def test_a_run_from_before_the_gang_path_renders_as_it_was() -> None:
    out = _out(_cp(0.7))
    del out["controller"]
    for st in out["control_plane"].values():
        del st["stats"]["above_world"]
    doc = report.render(out)
    assert "above world" not in doc and "`kfp_gpu.steps.scale_up.run` (provisioner `node-pool`)" in doc
    assert not [x for x in report_targets.targets(out) if x["name"].endswith("_above_world")]


def test_the_operator_alone_is_a_column_and_its_launch_window_a_profile_line() -> None:
    cp = _cp(0.7)
    st, ps = cp["512"]["stats"], cp["512"]["profile_stats"]
    st["launch_alone"] = {"median": 0.25, "min": 0.2, "max": 0.3, "n": 3}
    st["above_world_and_operator"] = {"median": 0.45, "min": 0.4, "max": 0.5, "n": 3}
    for prefix, busy in (("launch_", 0.6), ("alone_", 0.5)):
        ps.update({f"{prefix}{k}": {"median": v, "min": v, "max": v, "n": 3} for k, v in
                   (("cpu_capacity", 0.6), ("cpu_busy", busy), ("cpu_kube-apiserver", 0.3),
                    ("api_post_pods_s", 0.1), ("api_post_pods_n", 64.0))})
    doc = report.render(_out(cp))
    assert ("| above world | job launch, Training Operator alone | above world and the operator alone |" in doc
            and "| 0.70 (0.70-0.70) | 0.25 (0.20-0.30) | 0.45 (0.40-0.50) |" in doc)
    assert "* 512 GPUs, the Training Operator alone, job launch 0.25 (0.20-0.30) s: the machine was busy 0.5 of 0.6" \
        in doc
    del st["launch_alone"], st["above_world_and_operator"]  # a run from before: no such columns or line
    for k in [k for k in ps if k.startswith("alone_")]:
        del ps[k]
    old = report.render(_out(cp))
    assert "job launch, Training Operator alone" not in old and "the Training Operator alone, job launch" not in old
