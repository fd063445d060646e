"""docs/benchmarks.md against the bench JSON, and the harness's pure parts (no cluster, no timing)."""

from __future__ import annotations

import json
import re
from datetime import datetime, timezone
from pathlib import Path

import pytest

from bench import report, report_targets
from bench.common import ROOT
from bench.critical_path import analyse
from bench.observe import NodeRec, PodRec, measure, pods_before_ready
from bench.run import summarize


def test_the_doc_is_the_json_rendered() -> None:
    src = report.source()
    data = json.loads(src.read_text())
    expected = report.render(data, str(src.relative_to(ROOT)), report.RESULTS)
    assert report.DOC.read_text() == expected, (
        f"docs/benchmarks.md disagrees with {src.name}: run `python -m bench.report` (or the bench) to regenerate")


def test_the_json_records_the_commit_it_ran_on() -> None:
    data = json.loads(report.source().read_text())
    assert data["schema"] == 2
    assert re.fullmatch(r"[0-9a-f]{40}", data["git"]["commit"]) and isinstance(data["git"]["dirty"], bool)
    assert data["targets"] == report_targets.targets(data), "targets in the JSON are not the ones its numbers give"


def _row(side: str, overhead: float, **kw: object) -> dict:
    return {"side": side, "n": 4, "repeat": 0, "seed": 4000, "total_s": overhead + 2.0, "limit_s": 2.0,
            "overhead_s": overhead, "nodes_ready_s": 2.5, "idle_before_gpu_min": 1.0, "idle_after_gpu_min": 2.0,
            "api_requests_per_node": 3.0, "peak_rss_mib": 100.0, **kw}


def _out(rows: list[dict], not_run: dict[str, str] | None = None) -> dict:
    return {"schema": 2, "mode": "quick", "sides": ["naive", "cluster_autoscaler", "ours_node_pool"], "repeats": 1,
            "git": {"commit": "0" * 40, "dirty": False}, "machine": {"cpus": 2}, "world": {},
            "burst": {"4": {"runs": rows, "summary": summarize(rows), "not_run": not_run or {}}}}


def test_a_miss_is_printed_with_its_profile_and_a_not_run_side_with_its_reason() -> None:
    calls = [[0.05, 0.15, "GET .../c/nodePools"], [0.5, 0.6, "POST .../nodePools/p:setSize"]]
    rows = [_row("naive", 0.3), _row("ours_node_pool", 0.9, profile_ours_s={"first_requested": 0.6},
                                     cloud_calls_ours_s=calls)]
    out = _out(rows, {"cluster_autoscaler": "the bench's cluster-autoscaler did not start: boom"})
    out["targets"] = report_targets.targets(out)
    t = [x for x in out["targets"] if x["name"] == "burst_n4_ours_node_pool_lowest_overhead"][0]
    assert t["met"] is False and "naive 0.30" in t["value"] and "first_requested 0.60 s" in t["profile"]
    assert "setSize) left at 0.50 s, after 1 cloud call(s) (GET .../c/nodePools 0.05-0.15 s)" in t["profile"]
    doc = report.render(out)
    assert "**target missed**" in doc and "first_requested 0.60 s" in doc
    assert "not run: the bench's cluster-autoscaler did not start: boom" in doc
    out2 = _out([_row("naive", 0.3), _row("ours_node_pool", 0.2)])  # lower, but one run each: no range, no claim
    t2 = [x for x in report_targets.targets(out2) if x["name"].startswith("burst_n4")]
    assert [(x["met"], x.get("undecided")) for x in t2] == [(None, "one run: no range")]


def test_a_multi_line_not_run_reason_stays_in_its_table_row() -> None:
    why = "KWOKNodeClass default: (404)\nReason: Not Found\nHTTP response headers: {'a': 'b|c'}"
    doc = report.render(_out([_row("naive", 0.3)], {"cluster_autoscaler": why}))
    row = [line for line in doc.splitlines() if line.startswith("| cluster_autoscaler | 0 |")]
    assert row == ["| cluster_autoscaler | 0 | not run: KWOKNodeClass default: (404) Reason: Not Found HTTP response "
                   "headers: {'a': 'b\\|c'} | | | | | | | | |"]
    assert "\nReason" not in doc and "Reason: Not Found\n" not in doc
    out = _out([_row("naive", 0.3)])
    out["targets"] = [report_targets.row("control_plane_512", "control plane", "the stage failed: boom\nat x|y", False)]
    assert "| control plane | the stage failed: boom at x\\|y | **target missed** |" in report.render(out).splitlines()


def _runs(side: str, overheads: list[float]) -> list[dict]:
    return [_row(side, o, repeat=i) for i, o in enumerate(overheads)]


@pytest.mark.parametrize(("ours", "naive", "met", "undecided"), [
    ([0.2, 0.25, 0.3], [0.31, 0.4, 0.5], True, None),  # ours' max below the peer's min: claimed
    ([0.2, 0.25, 0.35], [0.3, 0.4, 0.5], None, "ranges overlap"),  # ours' median lower, ranges overlap: no claim
    ([0.6, 0.7, 0.8], [0.3, 0.4, 0.5], False, None),  # the peer's whole range below ours: missed
])
def test_lowest_is_claimed_only_where_ranges_do_not_overlap(ours: list[float], naive: list[float], met: object,
                                                           undecided: object) -> None:
    out = _out(_runs("naive", naive) + _runs("ours_node_pool", ours))
    out["targets"] = report_targets.targets(out)
    t = {x["name"]: x for x in out["targets"]}["burst_n4_ours_node_pool_lowest_overhead"]
    assert (t["met"], t.get("undecided")) == (met, undecided)
    doc = report.render(out)
    if undecided:  # the burst rows only: the doc also carries the recovery rows of bench/results/recovery.json
        burst = [ln for ln in doc.splitlines() if "ours_node_pool" in ln and "lowest" in ln]
        assert burst and all("no claim (ranges overlap)" in ln and "**target missed**" not in ln for ln in burst), burst
    assert f"({min(ours):.2f}-{max(ours):.2f}, 3 runs)" in t["value"]


def test_the_burst_table_shows_the_worlds_last_node_ready_beside_the_total() -> None:
    rows = _runs("naive", [0.3, 0.4]) + _runs("ours_node_pool", [0.2, 0.25])
    for r, ready in zip(rows, (2.9, 3.1, 2.6, 2.7), strict=True):
        r.update(nodes_ready_s=ready, machine_lag_s=ready - r["limit_s"])
    out = _out(rows)
    out["burst_repeats"] = {"4": 2}
    doc = report.render(out)
    assert "| side | runs | total | world: last node Ready | limit | overhead | machine lag |" in doc
    assert "| naive | 2 | 2.35 (2.30-2.40) | 3.00 (2.90-3.10) | 2.00 (2.00-2.00) | **0.35 (0.30-0.40)** | " \
           "1.00 (0.90-1.10) |" in doc
    assert "Repeats per N (interleaved): N=4: 2." in doc


def test_a_failed_run_is_loud() -> None:
    rows = [_row("naive", 0.3), {"side": "ours_node_pool", "n": 4, "repeat": 0, "seed": 1, "error": "RuntimeError: x"}]
    out = _out(rows)
    s = out["burst"]["4"]["summary"]["ours_node_pool"]
    assert s["runs"] == 0 and s["failed"] == ["RuntimeError: x"]
    assert "Failed run, ours_node_pool: RuntimeError: x" in report.render(out)
    t = {x["name"]: x for x in report_targets.targets(out)}["burst_n4_ours_node_pool_lowest_overhead"]
    assert t["met"] is False and t["value"] == "every run failed (1): RuntimeError: x"  # never "not run"


def test_a_failed_stage_is_named_failed_once() -> None:
    out = _out([_row("naive", 0.3)])
    out["control_plane"] = {"error": "FAILED: ProvisioningTimeout: only 63/64"}  # as bench.run stores a stage error
    t = {x["name"]: x for x in report_targets.targets(out)}["control_plane_512"]
    assert t["met"] is False and t["value"] == "the stage failed: ProvisioningTimeout: only 63/64"
    assert "| FAILED: ProvisioningTimeout: only 63/64 | | | | | | |" in report.render(out)


def test_measure_reads_the_limit_per_node_from_the_worlds_draws() -> None:
    a = NodeRec("a", added=10.5, annotations={"kfp-gpu.io/boot-sample": "1.5"}, ready=12.0, gone=20.0)
    b = NodeRec("b", added=10.6, annotations={"kfp-gpu.io/boot-sample": "1.75"}, ready=12.5, gone=None)
    k = NodeRec("k", added=10.7, annotations={"kfp-gpu.io/boot-sample": "1.25"}, ready=12.1, gone=19.0)
    m = measure([a, b, k], t0=10.0, t_job=13.0, t_end=18.0, t_cap=21.0, gpus=8, plugin_s=0.75)
    # the limit: b's draw (request -> registration) + the world's device-plugin delay, not a configured constant
    assert m.total_s == 3.0 and m.limit_s == 2.5 and m.overhead_s == 0.5 and m.nodes_ready_s == 2.5
    assert m.detail["undrawn_nodes"] == 0 and m.detail["drawn_boot_min_s"] == 2.0
    # stand-in nodes (no ready-at): the world made them Ready at registration + device plugin; b was 1.15 s late
    assert m.detail["machine_lag_s"] == pytest.approx(1.15)
    at = datetime.fromtimestamp(12.4, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    inj = NodeRec("i", added=10.2, annotations={"kfp-gpu.io/boot-sample": "1.2", "kfp-gpu.io/ready-at": at}, ready=12.6)
    assert measure([inj], 10.0, 13.0, 18.0, 21.0, 8, plugin_s=0.75).detail["machine_lag_s"] == pytest.approx(0.2)
    assert m.idle_before_gpu_s == pytest.approx((1.0 + 0.5 + 0.9) * 8)
    assert m.idle_after_gpu_s == pytest.approx((2.0 + 3.0 + 1.0) * 8) and m.after_capped  # b never went: counted to the cap
    fixed = NodeRec("f", added=10.6, annotations={"kfp-gpu.io/boot-delay": "9s"}, ready=12.5)  # not the world's
    m2 = measure([a, fixed], t0=10.0, t_job=13.0, t_end=18.0, t_cap=21.0, gpus=8, plugin_s=0.75)
    assert m2.limit_s == 2.25 and m2.detail["undrawn_nodes"] == 1  # the harness fails such a run
    # the world's image pull starts once the node is Ready with GPUs: the limit adds it once, not per node
    assert measure([a, b, k], 10.0, 13.0, 18.0, 21.0, 8, plugin_s=0.75, pull_s=0.68).limit_s == pytest.approx(3.18)


def test_a_pod_running_before_its_node_booted_is_counted() -> None:
    nodes = {"a": NodeRec("a", added=1.0, ready=5.0), "b": NodeRec("b", added=1.0, ready=None)}
    pods = [PodRec("1", "w0", "ns", "t", 2.0, node="a", running=5.02),  # within the watch streams' slack
            PodRec("2", "w1", "ns", "t", 2.0, node="a", running=3.76),  # Karpenter's first run: before Ready
            PodRec("3", "w2", "ns", "t", 2.0, node="b", running=4.0),  # the node was never Ready
            PodRec("4", "w3", "ns", "t", 2.0, node="a", running=None)]
    assert pods_before_ready(pods, nodes) == 2


def test_critical_path_is_read_from_the_dag() -> None:
    ir = {"root": {"dag": {"tasks": {"exit-handler-1": {}}}}, "components": {"comp-exit-handler-1": {"dag": {"tasks": {
        "quota-preflight": {}, "reserve-warm-pool": {"dependentTasks": ["quota-preflight"]},
        "burst-scale-up": {"dependentTasks": ["reserve-warm-pool"]}, "prepare-data": {},
        "train-pytorchjob": {"dependentTasks": ["burst-scale-up", "prepare-data"]}}}}}}
    got = analyse(ir)
    assert got["data_prep_parallel_to_provisioning"] is True and got["longest_chain_tasks"] == 4
    ir["components"]["comp-exit-handler-1"]["dag"]["tasks"]["prepare-data"]["dependentTasks"] = ["burst-scale-up"]
    assert analyse(ir)["data_prep_parallel_to_provisioning"] is False


def test_recovery_targets_cover_one_and_two_overlapping_preemptions(monkeypatch: pytest.MonkeyPatch,
                                                                    tmp_path: Path) -> None:
    from bench import report_recovery

    monkeypatch.setattr(report_recovery, "RECOVERY_JSON", tmp_path / "none.json")  # render this JSON's recovery
    out = _out([_row("naive", 0.3)])
    out["recovery"] = {"recovery": {"ratio_vs_training_operator": 1.1, "stats": {}}}
    out["recovery_overlap"] = {"recovery_2x": {"ratio_vs_training_operator": 1.79, "stats": {},
                                               "phases_ours_median_from_t0_s": {"decided": 0.01}}}
    got = {t["name"]: t for t in report_targets.targets(out)}
    assert got["recovery_vs_best_peer"]["met"] is True
    assert got["recovery_2x_vs_best_peer"]["met"] is False and "decided" in got["recovery_2x_vs_best_peer"]["profile"]
    out["recovery_overlap"] = {"not_run": "not run in --quick"}
    t = {t["name"]: t for t in report_targets.targets(out)}["recovery_2x_vs_best_peer"]
    assert t["met"] is None and t["value"] == "not run in --quick"
    assert "Two overlapping preemptions (0.1 s apart): not run in --quick" in report.render(out)


def test_a_side_process_that_writes_much_to_stderr_is_not_blocked() -> None:
    import sys
    import time

    from bench.sideprocs import Child

    # 300 KB of stderr before READY: a pipe nobody reads holds 64 KB, then the writer blocks
    code = "import sys; sys.stderr.write('x' * 300_000 + '\\nlast words\\n'); print('RUN r-1'); print('READY', flush=True)"
    child = Child({}, cmd=[sys.executable, "-c", code])
    try:
        assert child.expect("READY", 20.0) == "READY"
        assert child.run_id == "r-1"
        child.p.wait(10)
        end = time.time() + 5.0
        while not child.stderr_tail().endswith("last words") and time.time() < end:
            time.sleep(0.05)
        assert child.stderr_tail().endswith("last words")
    finally:
        child.close()


def test_a_control_plane_miss_names_the_worlds_floor() -> None:
    out = _out([_row("naive", 0.3)])
    st = {k: {"median": v, "min": v, "max": v, "n": 3} for k, v in
          (("total", 3.1), ("preflight", 0.1), ("warm_pool", 1.0), ("scale_up", 1.9), ("job_launch", 0.1),
           ("world_nodes_ready", 2.2))}
    out["control_plane"] = {"512": {"gpus": 512, "nodes": 64, "samples": {}, "stats": st}}
    t = {x["name"]: x for x in report_targets.targets(out)}["control_plane_512"]
    assert t["met"] is False and "last node was Ready 2.20 s after warm pool began" in t["profile"]
    assert "| 512 | PyTorchJob | 3.10 (3.10-3.10) | 0.10 (0.10-0.10) | 1.00 (1.00-1.00) | 1.90 (1.90-1.90) | 0.10 (0.10-0.10) | " \
           "2.20 (2.20-2.20) |" in report.render(out)


def test_a_gang_is_running_only_while_all_its_pods_live_at_once() -> None:
    from kubernetes import client

    from bench.observe import Observer, PodRec

    obs = Observer(client.ApiClient())  # its watches are never started: the records are set by hand
    obs.pods = {"a": PodRec("a", "g-w0", "ns", "g", 1.0, running=2.0),
                "b": PodRec("b", "g-w1", "ns", "g", 1.0, running=3.0, gone=3.5),  # evicted as it started
                "c": PodRec("c", "g-w2", "ns", "g", 1.0, running=4.0)}
    assert obs.gang_running_at("g", 3) is None  # three ran, never all at once
    assert obs.gang_running_at("g", 2) == 3.0
    obs.pods["d"] = PodRec("d", "g-w3", "ns", "g", 1.0, running=5.0)
    assert obs.gang_running_at("g", 3) == 5.0


def test_the_doc_states_the_gang_rule_its_json_was_measured_with() -> None:
    out = _out([_row("naive", 0.3)])
    assert "all N pods Running at once" not in report.render(out)  # a run from before the rule
    out["gang_running"] = "simultaneous"
    assert "the whole gang Running (all N pods Running at once: a pod evicted meanwhile does not count)" \
        in report.render(out)
