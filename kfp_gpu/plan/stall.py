"""Stall and straggler detection over per-rank progress: a pure function, virtual time, no I/O.

Input: each rank's recent progress samples (the step it had reached, its reported step time, and when the observer
first saw that step: the observer's clock, so a writer's clock skew does not matter), the ranks expected, when the
attempt started, and ``now``. Output (:func:`assess`): healthy, or stalled (the ranks that stopped first: the lowest
step, and among those the earliest last progress; a rank behind a stalled one counts even before its own timeout),
plus the stragglers.

- **Stall**: a rank made no progress for the stall timeout. ``timeout_s=None`` ("auto") is
  ``max(floor_s, multiple * median step time)``, the median over the ranks' newest reported step times; with no step
  time reported yet, the floor. A rank that never reported, while others did, counts from the attempt's start with
  ``startup_s`` (the first step includes model load, data loading and the process-group rendezvous). A gang where no
  rank ever reported is never judged: its trainer does not use the progress API.
- **Straggler**: a rank whose reported step time stayed above the median of the others by more than ``margin``
  (0.2 = 20 % slower) in every sample of the last ``window_s``, the samples spanning the whole window.

Defaults (:class:`StallPolicy`): torch's NCCL process-group timeout is 10 minutes (pytorch PR #110947), so the
floor (2 minutes) detects a hung collective well before the peers' own timeout; 10 x the step time leaves room
for a checkpoint save inside a step of a short-step job.
"""

from __future__ import annotations

import enum
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

DEFAULT_MULTIPLE = 10.0
DEFAULT_FLOOR_S = 120.0
DEFAULT_STARTUP_S = 600.0
DEFAULT_MARGIN = 0.2
DEFAULT_WINDOW_S = 300.0


@dataclass(frozen=True)
class Sample:
    """One observation of one rank: ``step`` reached, ``step_time_s`` as the rank reported it, ``at`` when the
    observer first saw this step (seconds, any one clock)."""

    step: int
    step_time_s: float | None
    at: float


@dataclass(frozen=True)
class StallPolicy:
    timeout_s: float | None = None  # None: auto (multiple x median step time, at least floor_s)
    multiple: float = DEFAULT_MULTIPLE
    floor_s: float = DEFAULT_FLOOR_S
    startup_s: float = DEFAULT_STARTUP_S
    margin: float = DEFAULT_MARGIN
    window_s: float = DEFAULT_WINDOW_S


class State(str, enum.Enum):
    HEALTHY = "healthy"
    STALLED = "stalled"


@dataclass(frozen=True)
class Assessment:
    state: State
    timeout_s: float  # the stall timeout applied
    median_step_s: float | None
    stalled: tuple[int, ...] = ()  # every rank past the timeout
    first_stopped: tuple[int, ...] = ()  # of those, the ones that stopped first
    stopped_at: float | None = None  # when the first of them last made progress
    stragglers: tuple[int, ...] = ()
    reason: str = ""


def timeout_for(policy: StallPolicy, median_step_s: float | None) -> float:
    """The stall timeout: the explicit one, else ``max(floor, multiple x median step time)``."""
    if policy.timeout_s is not None:
        return policy.timeout_s
    if median_step_s is None:
        return policy.floor_s
    return max(policy.floor_s, policy.multiple * median_step_s)


def last_progress(samples: Sequence[Sample]) -> Sample:
    """The first sample at the newest step (when that step was first seen)."""
    top = max(s.step for s in samples)
    return min((s for s in samples if s.step == top), key=lambda s: s.at)


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


@dataclass(frozen=True)
class TrainerStatus:
    """Kubeflow Trainer v2's alpha ``TrainJob.status.trainerStatus``: gang-level, whole percent."""

    progress_percentage: int | None
    remaining_s: int | None
    updated_at: str  # lastUpdatedTime as written (RFC 3339)
    metrics: tuple[tuple[str, str], ...] = ()


def trainer_status(job: Mapping[str, Any]) -> TrainerStatus | None:
    """The ``status.trainerStatus`` of a TrainJob object, or None when absent (not served, the feature gate off, or
    nothing reported yet). Malformed numbers read as None."""
    ts = ((job.get("status") or {}).get("trainerStatus")) or None
    if not isinstance(ts, Mapping):
        return None

    def whole(v: Any) -> int | None:
        return v if isinstance(v, int) and not isinstance(v, bool) else None

    metrics = tuple((str(m.get("name", "")), str(m.get("value", ""))) for m in ts.get("metrics") or []
                    if isinstance(m, Mapping))
    return TrainerStatus(whole(ts.get("progressPercentage")), whole(ts.get("estimatedRemainingSeconds")),
                         str(ts.get("lastUpdatedTime") or ""), metrics)


def assess(history: Mapping[int, Sequence[Sample]], *, ranks: int, started_at: float, now: float,
           policy: StallPolicy = StallPolicy(), gang: Sequence[Sample] = ()) -> Assessment:
    """Judge a gang of ``ranks`` ranks (0..ranks-1) at ``now`` from each rank's samples (oldest first; a rank with
    no entry has not reported yet). ``gang``: gang-level samples (a new sample per change of the TrainJob's
    ``trainerStatus``), judged only when no rank reports progress of its own; it cannot say which rank stopped."""
    latest = {r: s[-1] for r, s in history.items() if s}
    if not latest and gang:
        timeout = timeout_for(policy, None)
        last = last_progress(gang)
        if now - last.at > timeout:
            return Assessment(State.STALLED, timeout, None, stopped_at=last.at,
                              reason=f"the TrainJob's trainerStatus did not change for {now - last.at:.0f} s "
                                     f"(stall timeout {timeout:.0f} s)")
        return Assessment(State.HEALTHY, timeout, None)
    median = _median([s.step_time_s for s in latest.values() if s.step_time_s is not None and s.step_time_s > 0])
    timeout = timeout_for(policy, median)
    since: dict[int, tuple[int, float]] = {}  # rank -> (step, last progress at) for the ranks past their timeout
    for rank in range(ranks):
        samples = history.get(rank) or ()
        if not samples:  # counts only once another rank reported: a trainer without the progress API is never judged
            if latest and now - started_at > max(policy.startup_s, timeout):
                since[rank] = (-1, started_at)
            continue
        last = last_progress(samples)
        if now - last.at > timeout:
            since[rank] = (last.step, last.at)
    stragglers = _stragglers(history, now, policy)
    if not since:
        return Assessment(State.HEALTHY, timeout, median, stragglers=stragglers)
    # In a synchronous gang a rank behind a stalled one is stalled too (its peers wait for it in the next
    # collective), even when its own newest step was seen a little later: a throttled writer's last step can reach
    # the store after its peers' next one (seen in the rehearsal: ranks 2, 3 at step 121 past the timeout while the
    # hung rank 1's step 120 came one write interval later, and the peers were blamed). It is the one to blame.
    top = min(step for step, _ in since.values())
    behind = {r: (s.step, s.at) for r, s in ((r, last_progress(h)) for r, h in history.items() if h and r < ranks)
              if r not in since and s.step < top}
    culprits = {**since, **behind}
    low = min(step for step, _ in culprits.values())
    at = min(t for step, t in culprits.values() if step == low)
    slack = median if median is not None else 0.0  # ranks that stopped within one step of the first
    first = tuple(sorted(r for r, (step, t) in culprits.items() if step == low and t <= at + slack))
    what = "never reported a step" if low < 0 else f"at step {low}"
    reason = (f"rank{'s' if len(first) > 1 else ''} {', '.join(map(str, first))} made no progress for "
              f"{now - at:.0f} s ({what}; stall timeout {timeout:.0f} s)")
    return Assessment(State.STALLED, timeout, median, tuple(sorted(since)), first, at, stragglers, reason)


def _stragglers(history: Mapping[int, Sequence[Sample]], now: float, policy: StallPolicy) -> tuple[int, ...]:
    """Ranks slower than the others' median by more than ``margin`` in every sample of the window."""
    start = now - policy.window_s
    windows: dict[int, list[Sample]] = {}
    for rank, samples in history.items():
        if not samples or samples[0].at > start:  # the samples do not span the window yet
            continue
        inside = [s for s in samples if s.at >= start and s.step_time_s is not None]
        before = [s for s in samples if s.at < start and s.step_time_s is not None]
        windows[rank] = before[-1:] + inside  # the value in force when the window began, then every change
    out = []
    for rank, samples in windows.items():
        if not samples:
            continue
        for s in samples:
            peers = [p.step_time_s for r, ps in history.items() if r != rank and ps
                     for p in ps[-1:] if p.step_time_s is not None]
            peer_median = _median([float(p) for p in peers])
            if peer_median is None or s.step_time_s is None or s.step_time_s <= peer_median * (1 + policy.margin):
                break
        else:
            out.append(rank)
    return tuple(sorted(out))
