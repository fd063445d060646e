"""The leader election's pure decision (kfp_gpu/plan/election.py), in virtual time: client-go's rules, and a
simulation of two replicas over one Lease (a store with resourceVersions) that never lets two lead at once."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from kfp_gpu.plan import election
from kfp_gpu.plan.election import Do, Observation, Record, Timings

T = Timings()  # 15 / 10 / 2, controller-runtime's defaults


def test_defaults_are_controller_runtimes() -> None:
    assert (T.lease_duration_s, T.renew_deadline_s, T.retry_period_s) == (15, 10.0, 2.0)
    assert T.problem() == ""


@pytest.mark.parametrize(("timings", "flag"), [
    (Timings(10, 10.0, 2.0), "--leader-elect-renew-deadline=10.0 must be shorter"),
    (Timings(15, 2.0, 2.0), "--leader-elect-renew-deadline=2.0 must be longer than 1.2 x"),
    (Timings(0, 0.5, 0.1), "--leader-elect-lease-duration=0"),
    (Timings(15, 10.0, 0.0), "--leader-elect-retry-period=0.0"),
])
def test_timings_that_cannot_work_are_refused_naming_the_flag(timings: Timings, flag: str) -> None:
    problem = timings.problem()
    assert problem.startswith(flag), problem
    assert "\n" not in problem and "default" in problem


def test_no_lease_is_created_holding_it() -> None:
    d = election.decide(Observation(None, 0.0), "a", False, 0.0, 1000.0, T)
    assert d.do is Do.CREATE
    assert d.record == Record("a", 15, 1000.0, 1000.0, 0)


def test_a_held_lease_is_waited_out_from_when_this_replica_first_saw_it() -> None:
    held = Record("b", 15, 900.0, 900.0, 3)  # renewTime long past on the wall clock: the local observation rules
    obs = election.observe(None, held, now=100.0)
    d = election.decide(obs, "a", False, 114.0, 2000.0, T)
    assert d.do is Do.WAIT and d.expires_in_s == pytest.approx(1.0)
    obs = election.observe(obs, held, now=115.5)  # unchanged: the clock keeps running from 100
    d = election.decide(obs, "a", False, 115.5, 2001.5, T)
    assert d.do is Do.ACQUIRE
    assert d.record == Record("a", 15, 2001.5, 2001.5, 4)  # a transition counted


def test_a_renewal_restarts_the_standbys_clock() -> None:
    obs = election.observe(None, Record("b", 15, 0.0, 0.0, 0), now=0.0)
    obs = election.observe(obs, Record("b", 15, 0.0, 14.0, 0), now=14.0)  # b renewed
    assert obs.since == 14.0
    assert election.decide(obs, "a", False, 20.0, 20.0, T).do is Do.WAIT


def test_a_released_lease_is_taken_at_once() -> None:
    rel = election.released(Record("b", 15, 0.0, 50.0, 2), wall=60.0)
    assert rel == Record("", 1, 60.0, 60.0, 2)
    d = election.decide(election.observe(None, rel, now=5.0), "a", False, 5.0, 61.0, T)
    assert d.do is Do.ACQUIRE and d.record is not None and d.record.transitions == 3


def test_the_holder_renews_keeping_acquire_time_and_transitions() -> None:
    mine = Record("a", 15, 10.0, 12.0, 2)
    d = election.decide(election.observe(None, mine, now=1.0), "a", True, 1.0, 14.0, T)
    assert d.do is Do.RENEW and d.record == Record("a", 15, 10.0, 14.0, 2)


@pytest.mark.parametrize(("record", "why"), [(Record("b", 15, 0.0, 0.0, 1), "held by b"),
                                              (Record("", 1, 0.0, 0.0, 1), "held by nobody"),
                                              (None, "gone")])
def test_a_leader_that_reads_another_holder_or_none_steps_down(record: Record | None, why: str) -> None:
    d = election.decide(Observation(record, 0.0), "a", True, 0.0, 0.0, T)
    assert d.do is Do.STEP_DOWN and why in d.reason


def test_the_renew_deadline() -> None:
    assert not election.must_step_down(None, 100.0, T)  # never renewed: not leading
    assert not election.must_step_down(90.5, 100.0, T)
    assert election.must_step_down(90.0, 100.0, T)


# ---- two replicas over one Lease, in virtual time ------------------------------------------------------------

@dataclass
class Store:
    """The API server's view of one Lease: a record and its resourceVersion; writes are conditional on it."""
    record: Record | None = None
    rv: int = 0
    writes: list[tuple[float, str]] = field(default_factory=list)

    def write(self, rec: Record, read_rv: int, create: bool, t: float) -> bool:
        if (create and self.record is not None) or (not create and read_rv != self.rv):
            return False  # 409
        self.record, self.rv = rec, self.rv + 1
        self.writes.append((t, rec.holder))
        return True


@dataclass
class Replica:
    me: str
    obs: Observation | None = None
    leading: bool = False
    last_renew: float | None = None
    next_round: float = 0.0
    cut_off: tuple[float, float] = (-1.0, -1.0)  # [from, to): its requests do not reach the API server
    dead_at: float = float("inf")
    lost_at: float | None = None

    def step(self, store: Store, t: float, timings: Timings) -> None:
        if t >= self.dead_at or t < self.next_round:
            return
        self.next_round = t + timings.retry_period_s
        if self.leading and election.must_step_down(self.last_renew, t, timings):
            self.leading, self.lost_at = False, t
            return
        if self.cut_off[0] <= t < self.cut_off[1]:
            return
        read_rv = store.rv
        self.obs = election.observe(self.obs, store.record, t)
        d = election.decide(self.obs, self.me, self.leading, t, 1e9 + t, timings)
        if d.do is Do.STEP_DOWN:
            self.leading, self.lost_at = False, t
        elif d.record is not None and store.write(d.record, read_rv, d.do is Do.CREATE, t):
            self.obs, self.leading, self.last_renew = Observation(d.record, t), True, t


def _run(replicas: list[Replica], until: float, timings: Timings, dt: float = 0.05) -> tuple[Store, list[float]]:
    store, both = Store(), []
    t = 0.0
    while t < until:
        for r in replicas:  # the same instant for both: a race on every start
            r.step(store, t, timings)
        if sum(r.leading and t < r.dead_at for r in replicas) > 1:
            both.append(t)
        t = round(t + dt, 6)
    return store, both


def test_two_replicas_started_at_the_same_instant_elect_one() -> None:
    a, b = Replica("a"), Replica("b")
    store, both = _run([a, b], 60.0, T)
    assert both == []
    assert [a.leading, b.leading] == [True, False]  # a wrote first; b's create was refused (409) and it waits
    assert store.record is not None and store.record.transitions == 0


def test_a_dead_leader_is_replaced_a_lease_duration_after_its_last_renewal() -> None:
    a, b = Replica("a", dead_at=20.0), Replica("b")
    store, both = _run([a, b], 60.0, T)
    assert both == [] and b.leading
    last_a = max(t for t, h in store.writes if h == "a")
    took = min(t for t, h in store.writes if h == "b")
    assert T.lease_duration_s <= took - last_a <= T.lease_duration_s + 2 * T.retry_period_s, (last_a, took)
    assert store.record is not None and store.record.transitions == 1


def test_a_cut_off_leader_stops_before_the_standby_may_take_over() -> None:
    """The leader loses the API server for 30 s while still running: it steps down at the renew deadline, at least
    lease duration - renew deadline (5 s) before the standby acquires."""
    a, b = Replica("a", cut_off=(20.0, 50.0)), Replica("b")
    store, both = _run([a, b], 60.0, T)
    assert both == []
    took = min(t for t, h in store.writes if h == "b")
    assert a.lost_at is not None and took - a.lost_at >= T.lease_duration_s - T.renew_deadline_s - T.retry_period_s
    assert b.leading and not a.leading  # back on the network, a reads b's lease and stays a standby


def test_short_test_timings_keep_the_same_guarantees() -> None:
    short = Timings(3, 2.0, 0.5)  # what tests/integration/test_controller_replicas.py runs
    a, b = Replica("a", cut_off=(5.0, 20.0)), Replica("b")
    _, both = _run([a, b], 25.0, short, dt=0.01)
    assert both == [] and b.leading


def test_kfp_gpu_controller_refuses_timings_that_cannot_work_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    from kfp_gpu.cli import main

    code = main(["controller", "--leader-elect-lease-duration", "15", "--leader-elect-renew-deadline", "20"])
    err = capsys.readouterr().err
    assert code != 0 and err.count("\n") == 1, err  # one line, no traceback, before any cluster call
    assert "--leader-elect-renew-deadline=20.0 must be shorter than --leader-elect-lease-duration=15" in err
