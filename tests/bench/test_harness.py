"""The burst harness's own parts that need no cluster: the bench CA's flags, the per-phase wall clock, the bulk
node delete's guard."""

from __future__ import annotations

import pytest

from bench import sideprocs
from bench.common import Phases, delete_nodes
from kfp_gpu_rehearsal.devcluster import ca_profile


def test_the_bench_ca_scales_down_as_the_profile_and_serves_no_provisioning_request() -> None:
    flags = sideprocs.bench_ca_flags(ca_profile.FLAGS)
    for f in ("--scan-interval=1s", "--scale-down-unneeded-time=5s",
              f"--max-scale-down-parallelism={ca_profile.SCALE_DOWN_PARALLELISM}",
              f"--node-delete-delay-after-taint={ca_profile.DELETE_DELAY_AFTER_TAINT_MS}ms"):
        assert f in flags
    assert not [f for f in flags if "provisioning-request" in f or "status-config" in f]
    assert len(flags) == len(ca_profile.FLAGS) - 5


def test_the_phase_clock_splits_the_side_run_and_adds_up_repeated_phases(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [100.0]
    monkeypatch.setattr("bench.common.time.time", lambda: now[0])
    clock = Phases()
    for name, dt in (("quiesce", 3.0), ("setup", 1.25), ("cleanup_objects", 0.5), ("setup", 0.25)):
        now[0] += dt
        clock.lap(name)
    assert clock.laps == {"quiesce": 3.0, "setup": 1.5, "cleanup_objects": 0.5}
    assert sum(clock.laps.values()) == now[0] - 100.0


def test_the_bulk_node_delete_refuses_an_empty_selector() -> None:
    with pytest.raises(ValueError, match="every node"):
        delete_nodes(None, " ")  # refused before any API call


def test_the_report_states_each_cas_scale_down_rate_from_the_flags_the_run_recorded() -> None:
    from bench import report
    from bench.world import scale_down_flags

    real = scale_down_flags(ca_profile.FLAGS)
    assert real == {"scan-interval": "1s", "scale-down-unneeded-time": "5s", "max-scale-down-parallelism": "120",
                    "node-delete-delay-after-taint": "42ms"}
    old = scale_down_flags(["--cloud-provider=kwok", "--scan-interval=1s", "--scale-down-unneeded-time=5s"])
    assert old["max-scale-down-parallelism"] == old["node-delete-delay-after-taint"] == "default"
    text = report._ca_scale_down({"bench_ca": real, "ca_profile": old})
    assert "the bench CA (cluster_autoscaler) at the real rate" in text
    assert "the CA profile (the ProvisioningRequest sides) removed empty nodes at the defaults'" in text
    assert "the CA profile (the ProvisioningRequest sides) at the real rate" in report._ca_scale_down(
        {"bench_ca": real, "ca_profile": real})
    assert "not running" in report._ca_scale_down({"bench_ca": real, "ca_profile": "not running"})
    assert "did not record" in report._ca_scale_down(None)


def test_the_wall_breakdown_sums_each_phase_over_every_side_run() -> None:
    from bench import report

    out = {"stage_wall_s": {"burst": 600.0, "recovery": 120.0},
           "burst": {"4": {"runs": [{"wall_phases_s": {"gang": 30.0, "after_job": 6.0}},
                                    {"wall_phases_s": {"gang": 12.0, "after_job": 60.0}}, {"error": "x"}]},
                     "512": {"runs": [{"wall_phases_s": {"quiesce": 18.0}}]}}}
    text = report._where_the_wall_went(out)
    assert "burst 10.0, recovery 2.0" in text
    assert "after_job 1.1, gang 0.7, quiesce 0.3." in text  # summed, largest first
    assert report._where_the_wall_went({"burst": {}}) == ""


def test_the_full_matrix_is_every_side_with_its_repeats_and_the_estimate_counts_each_run() -> None:
    from bench.run import _modes, burst_matrix, estimate_wall_s
    from bench.sides import SIDES

    full = _modes()["full"]
    m = burst_matrix(full)
    assert {(n, r) for n, _, r in m} == {(4, 5), (16, 5), (64, 5), (128, 3), (512, 3)}
    assert [n for n, side, _ in m if side == "sequential"] == [4]
    per_n = {n: sorted(side for k, side, _ in m if k == n) for n in (4, 512)}
    assert per_n[512] == sorted(set(SIDES) - {"sequential"})
    assert per_n[4] == sorted(SIDES)
    walls = {(side, n): 10.0 for n, side, _ in m if side != "karpenter"}
    est, missing = estimate_wall_s(full, walls, other_s=100.0)
    assert missing == ["karpenter@4", "karpenter@16", "karpenter@64", "karpenter@128", "karpenter@512"]
    assert est == 100.0 + 10.0 * (5 * (8 + 7 + 7) + 3 * (7 + 7))  # runs per N, without karpenter


def test_a_development_run_gets_no_verdict_against_the_full_runs_120_minutes() -> None:
    from bench import report

    full = {"mode": "full", "wall_s": 600.0, "command": "python -m bench.run --full"}
    assert ": met." in report._wall(full)
    assert "**missed**" in report._wall({**full, "wall_s": 7300.0})
    for cmd in ("python -m bench.run --full --only burst --out /tmp/x.json",
                "python -m bench.run --full --sides naive --n 512 --out /tmp/x.json"):
        text = report._wall({**full, "command": cmd})
        assert "no verdict" in text and "met" not in text
