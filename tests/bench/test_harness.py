"""The burst harness's own parts that need no cluster: the bench CA's flags, the per-phase wall clock, the bulk
node delete's guard."""

from __future__ import annotations

import pytest

from bench import burst
from bench.common import delete_nodes
from kfp_gpu_rehearsal.devcluster import ca_profile


def test_the_bench_ca_scales_down_as_the_profile_and_serves_no_provisioning_request() -> None:
    flags = burst.bench_ca_flags(ca_profile.FLAGS)
    for f in ("--scan-interval=1s", "--scale-down-unneeded-time=5s",
              f"--max-scale-down-parallelism={ca_profile.SCALE_DOWN_PARALLELISM}",
              f"--node-delete-delay-after-taint={ca_profile.DELETE_DELAY_AFTER_TAINT_MS}ms"):
        assert f in flags
    assert not [f for f in flags if "provisioning-request" in f or "status-config" in f]
    assert len(flags) == len(ca_profile.FLAGS) - 5


def test_the_phase_clock_splits_the_side_run_and_adds_up_repeated_phases(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [100.0]
    monkeypatch.setattr("bench.burst.time.time", lambda: now[0])
    clock = burst._Phases()
    for name, dt in (("quiesce", 3.0), ("setup", 1.25), ("cleanup_objects", 0.5), ("setup", 0.25)):
        now[0] += dt
        clock.lap(name)
    assert clock.laps == {"quiesce": 3.0, "setup": 1.5, "cleanup_objects": 0.5}
    assert sum(clock.laps.values()) == now[0] - 100.0


def test_the_bulk_node_delete_refuses_an_empty_selector() -> None:
    with pytest.raises(ValueError, match="every node"):
        delete_nodes(None, " ")  # refused before any API call
