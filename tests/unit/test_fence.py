"""The fence of a frozen leader (kfp_gpu/controller/work.py, election.py), in virtual time: a work unit stops by
itself at the leader's renew deadline, and a leader that was paused past it steps down even if it could renew."""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from typing import Any

import pytest

from kfp_gpu.controller import work
from kfp_gpu.controller.election import LeaderElector
from kfp_gpu.plan.election import Decision, Do, Timings


@dataclass
class Held:
    value: float


class VirtualTime:
    """A clock that only moves when the code under test waits; ``at`` runs a callback once the clock reaches it."""

    def __init__(self) -> None:
        self.now = 0.0
        self.waits: list[float] = []
        self.left_with: tuple[int, float] | None = None
        self.events: list[tuple[float, Any]] = []

    def clock(self) -> float:
        return self.now

    def wait(self, s: float) -> None:
        self.waits.append(s)
        self.now += s
        for t, fn in list(self.events):
            if self.now >= t:
                self.events.remove((t, fn))
                fn()

    def leave(self, code: int) -> None:
        self.left_with = (code, self.now)


def test_a_unit_stops_itself_exactly_at_the_renew_deadline() -> None:
    vt, held = VirtualTime(), Held(10.0)
    work.watch_fence(held, clock=vt.clock, wait=vt.wait, leave=vt.leave, every_s=0.2)
    assert vt.left_with == (work.FENCED_EXIT, pytest.approx(10.0))
    assert max(vt.waits) <= 0.2 + 1e-9  # it looked at least every 0.2 s


def test_each_renewal_moves_the_units_deadline() -> None:
    vt, held = VirtualTime(), Held(3.0)
    for t in (2.0, 4.0, 6.0):  # the leader renews every 2 s, each time good for 3 s more
        vt.events.append((t, lambda t=t: setattr(held, "value", t + 3.0)))
    work.watch_fence(held, clock=vt.clock, wait=vt.wait, leave=vt.leave, every_s=0.5)
    assert vt.left_with == (work.FENCED_EXIT, pytest.approx(9.0))  # 3 s after the last renewal, not before


def test_the_replica_is_fenced_from_its_deadline_on() -> None:
    try:
        assert not work.fenced(now=1e12)  # no election (standalone): never fenced by time
        work.hold_until(100.0)
        assert not work.fenced(now=99.9)
        assert work.fenced(now=100.0)
    finally:
        work.hold_until(math.inf)
    assert not work.fenced()


class _Paused(LeaderElector):
    """An elector whose last renewal is far behind its clock (the process was paused), and whose next round would
    renew: the round is recorded, not sent."""

    rounds = 0

    def round(self) -> Decision:
        self.rounds += 1
        return Decision(Do.RENEW, "ours")


def test_a_leader_paused_past_its_renew_deadline_steps_down_without_renewing() -> None:
    short = Timings(lease_duration_s=1, renew_deadline_s=0.2, retry_period_s=0.01)
    now = [0.0]
    el = _Paused(None, "ns", timings=short, clock=lambda: now[0], me="a")
    el.leading, el.last_renew = True, 0.0
    now[0] = 5.0  # resumed 5 s later
    lost: list[str] = []
    done = threading.Event()

    def on_lost(why: str) -> None:
        lost.append(why)
        done.set()

    el.keep(on_lost)
    assert done.wait(5)
    assert el.rounds == 0 and not el.leading  # it did not write first: its units already stopped at 0.2 s
    assert "paused" in lost[0]


def test_a_write_tells_the_units_how_long_they_may_act(monkeypatch: pytest.MonkeyPatch) -> None:
    from kubernetes.client.exceptions import ApiException

    from kfp_gpu.cluster import owned

    def request(api: Any, method: str, path: str, body: Any = None, **_: Any) -> Any:
        if method == "GET":
            raise ApiException(status=404, reason="Not Found")
        return {**body, "metadata": {**body["metadata"], "resourceVersion": "1"}}

    monkeypatch.setattr(owned, "request", request)  # the elector's one way to the API server
    got: list[float] = []
    el = LeaderElector(None, "ns", timings=Timings(), clock=lambda: 50.0, wall=lambda: 1e9, me="a",
                       on_renew=got.append)
    assert el.round().do is Do.CREATE and el.leading
    assert got == [60.0]  # sent at 50.0 + the 10 s renew deadline: 5 s before the 15 s Lease can pass on
