"""Stall and straggler detection (kfp_gpu.plan.stall) in virtual time: no sleeps, no I/O."""

from __future__ import annotations

from kfp_gpu.plan.recovery import Budget, Cause, Verdict, decide
from kfp_gpu.plan.stall import Sample, StallPolicy, State, assess, timeout_for
from kfp_gpu.spec import Recovery


def _run(ranks: int, steps: int, step_s: float, *, slow: dict[int, float] | None = None,
         stop: dict[int, int] | None = None) -> dict[int, list[Sample]]:
    """Each rank reports every step; ``slow[r]`` multiplies rank r's step time; ``stop[r]`` is the last step r
    reports (a hang). Times: rank r's step k is seen at k * step time."""
    out: dict[int, list[Sample]] = {}
    for r in range(ranks):
        dt = step_s * (slow or {}).get(r, 1.0)
        last = (stop or {}).get(r, steps)
        out[r] = [Sample(k, dt, k * dt) for k in range(1, last + 1)]
    return out


def test_auto_timeout_is_a_multiple_of_the_median_step_time_with_a_floor() -> None:
    p = StallPolicy()
    assert timeout_for(p, None) == p.floor_s == 120.0  # nothing measured yet
    assert timeout_for(p, 2.0) == 120.0  # 10 x 2 s is under the floor
    assert timeout_for(p, 30.0) == 300.0
    assert timeout_for(StallPolicy(timeout_s=45.0), 30.0) == 45.0  # an explicit timeout wins


def test_a_progressing_gang_is_healthy() -> None:
    h = _run(4, 100, 1.0)
    a = assess(h, ranks=4, started_at=0.0, now=101.0)
    assert a.state is State.HEALTHY and a.median_step_s == 1.0 and a.stragglers == ()


def test_a_hung_rank_is_a_stall_once_the_timeout_passes_and_it_stopped_first() -> None:
    # rank 2 hangs after step 50; its peers block one step later (the next collective)
    h = _run(4, 51, 1.0, stop={2: 50})
    p = StallPolicy(floor_s=20.0)
    assert assess(h, ranks=4, started_at=0.0, now=69.0, policy=p).state is State.HEALTHY
    a = assess(h, ranks=4, started_at=0.0, now=70.5, policy=p)
    assert a.state is State.STALLED
    assert a.first_stopped == (2,) and a.stalled == (2,) and a.stopped_at == 50.0
    a = assess(h, ranks=4, started_at=0.0, now=80.0, policy=p)
    assert a.stalled == (0, 1, 2, 3) and a.first_stopped == (2,)
    assert "rank 2 made no progress for 30 s (at step 50; stall timeout 20 s)" in a.reason


def test_the_hung_rank_is_blamed_even_when_its_last_step_was_seen_after_its_peers_next() -> None:
    # a throttled writer: rank 1 hung after step 120 but its trailing write came 0.5 s after its peers wrote 121
    h = _run(4, 121, 1.0, stop={1: 120})
    h[1][-1] = Sample(120, 1.0, 121.5)
    a = assess(h, ranks=4, started_at=0.0, now=141.2, policy=StallPolicy(floor_s=20.0))
    assert a.state is State.STALLED and a.stalled == (0, 2, 3)  # rank 1 is not past its own timeout yet
    assert a.first_stopped == (1,) and a.stopped_at == 121.5
    assert "rank 1 made no progress for 20 s (at step 120" in a.reason


def test_ranks_that_stop_together_are_all_first() -> None:
    h = _run(2, 30, 1.0)
    a = assess(h, ranks=2, started_at=0.0, now=200.0)
    assert a.state is State.STALLED and a.first_stopped == (0, 1)


def test_a_rank_that_never_reports_is_a_stall_after_the_startup_bound() -> None:
    h = _run(3, 10, 1.0)
    del h[1]
    p = StallPolicy(floor_s=5.0, startup_s=60.0)
    assert assess(h, ranks=3, started_at=0.0, now=9.0, policy=p).state is State.HEALTHY
    assert assess(h, ranks=3, started_at=0.0, now=59.0, policy=p).stalled == (0, 2)  # the others stopped too
    a = assess(h, ranks=3, started_at=0.0, now=61.0, policy=p)
    assert a.first_stopped == (1,) and "never reported a step" in a.reason
    # a trainer that does not use the progress API at all is never judged
    assert assess({}, ranks=3, started_at=0.0, now=1e6, policy=p).state is State.HEALTHY


def test_a_slow_rank_over_the_window_is_a_straggler_and_a_brief_slowdown_is_not() -> None:
    p = StallPolicy(margin=0.2, window_s=60.0)
    h = _run(4, 200, 1.0, slow={3: 1.5})
    for r in (0, 1, 2):
        h[r] = [s for s in h[r] if s.at <= 200.0]
    h[3] = [s for s in h[3] if s.at <= 200.0]
    a = assess(h, ranks=4, started_at=0.0, now=200.0, policy=p)
    assert a.state is State.HEALTHY and a.stragglers == (3,)
    # 10 % slower is inside the margin
    assert assess(_run(4, 200, 1.0, slow={3: 1.1}), ranks=4, started_at=0.0, now=200.0, policy=p).stragglers == ()
    # slow only in the last 30 s of the 60 s window: not yet
    h = _run(4, 200, 1.0)
    h[3] = [Sample(s.step, 1.0 if s.at < 170 else 2.0, s.at) for s in h[3]]
    assert assess(h, ranks=4, started_at=0.0, now=200.0, policy=p).stragglers == ()
    # samples that do not span the window yet: not yet
    assert assess(_run(4, 30, 1.0, slow={3: 2.0}), ranks=4, started_at=0.0, now=30.0, policy=p).stragglers == ()


def test_a_stall_restart_is_counted_against_the_restart_budget() -> None:
    v = Verdict(Cause.STALL, 10.0, (), "stall")
    d = decide(Recovery(max_preemptions=1), spot=True, budget=Budget(), verdict=v)
    assert d.action.value == "resume" and d.budget.preemptions == 1
    d = decide(Recovery(max_preemptions=1), spot=True, budget=d.budget, verdict=v)
    assert d.action.value == "exhausted" and "stall" in d.message


def test_trainer_status_is_read_and_judges_the_gang_only_without_rank_progress() -> None:
    from kfp_gpu.plan.stall import trainer_status

    job = {"status": {"trainerStatus": {"progressPercentage": 42, "estimatedRemainingSeconds": 600,
                                        "lastUpdatedTime": "2026-12-05T06:00:00Z",
                                        "metrics": [{"name": "loss", "value": "1.25"}]}}}
    ts = trainer_status(job)
    assert ts is not None and (ts.progress_percentage, ts.remaining_s, ts.metrics) == (42, 600, (("loss", "1.25"),))
    assert trainer_status({"status": {}}) is None and trainer_status({}) is None
    assert trainer_status({"status": {"trainerStatus": {"progressPercentage": "x", "lastUpdatedTime": "t"}}}) \
        == type(ts)(None, None, "t", ())
    p = StallPolicy(floor_s=30.0)
    gang = [Sample(1, None, 0.0), Sample(2, None, 10.0)]
    assert assess({}, ranks=2, started_at=0.0, now=39.0, policy=p, gang=gang).state is State.HEALTHY
    a = assess({}, ranks=2, started_at=0.0, now=41.0, policy=p, gang=gang)
    assert a.state is State.STALLED and a.first_stopped == () and "trainerStatus did not change for 31 s" in a.reason
    # rank progress, when there is any, is the signal: the stale trainerStatus is not judged
    assert assess(_run(2, 41, 1.0), ranks=2, started_at=0.0, now=41.0, policy=p, gang=gang).state is State.HEALTHY
