"""The supervisor's side of progress: read every rank's progress object, keep a short history, judge it.

:class:`StallWatch` lists ``_progress/`` beside the checkpoints (kfp_gpu.checkpoint.progress), timestamps each new
step with the observer's own clock (a writer's clock skew does not matter), and asks the pure
:func:`kfp_gpu.plan.stall.assess`. A store that cannot be read is logged and judged on what was seen before: the
timeout still runs, since the trainers write where they checkpoint, and a store down for longer than the stall
timeout stops a trainer's checkpoints too.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from kfp_gpu.checkpoint import progress as rank_progress
from kfp_gpu.checkpoint.backends import Backend, open_backend
from kfp_gpu.plan.stall import Assessment, Sample, StallPolicy, TrainerStatus, assess

log = logging.getLogger(__name__)


def policy_for(spec: Any, *, scale: float = 1.0) -> StallPolicy:
    """The spec's stall knobs (``stall_timeout``, ``straggler_margin``, ``straggler_window_s``) as a policy; times
    are divided by ``scale`` (the rehearsal world's time compression, 1 on a real cluster)."""
    base = StallPolicy()
    timeout = spec.stall_timeout_s
    return StallPolicy(None if timeout is None else timeout / scale, base.multiple, base.floor_s / scale,
                       base.startup_s / scale, float(spec.straggler_margin), float(spec.straggler_window_s) / scale)


class StallWatch:
    """Per-rank progress history of one attempt of a gang of ``ranks`` ranks."""

    def __init__(self, uri: str, ranks: int, policy: StallPolicy, *, backend: Backend | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.uri, self.ranks, self.policy, self.clock = uri, ranks, policy, clock
        self.backend = backend if backend is not None else open_backend(uri)
        self.history: dict[int, list[Sample]] = {}
        self.records: dict[int, rank_progress.Record] = {}
        self.gang: list[Sample] = []  # one sample per change of the TrainJob's trainerStatus
        self.trainer_status: TrainerStatus | None = None
        self.started_at = clock()

    def begin(self, *, clear: bool = True) -> None:
        """A new attempt: forget the history, and delete the old attempt's objects (``clear``) so they are not read
        as the new attempt's progress. A failed delete is logged."""
        self.history, self.records, self.gang, self.trainer_status = {}, {}, [], None
        self.started_at = self.clock()
        if clear:
            try:
                rank_progress.clear(self.backend)
            except Exception as exc:  # noqa: BLE001
                log.warning("could not clear old progress under %s: %s", self.uri, exc)

    def observe(self, records: dict[int, rank_progress.Record], now: float) -> None:
        """Fold newly read records into the history (a sample per new step or new step time)."""
        keep = now - max(self.policy.window_s * 2, 60.0)
        for rank, rec in records.items():
            if rank < 0 or rank >= self.ranks:
                continue
            self.records[rank] = rec
            samples = self.history.setdefault(rank, [])
            if samples and samples[-1].step == rec.step and samples[-1].step_time_s == rec.step_time_s:
                continue
            samples.append(Sample(rec.step, rec.step_time_s, now))
            while len(samples) > 2 and samples[1].at < keep:  # keep the one in force at the window's start
                samples.pop(0)

    def observe_trainer_status(self, ts: TrainerStatus | None, now: float) -> None:
        """Fold the TrainJob's ``trainerStatus`` in: a gang-level sample whenever it changes."""
        if ts is None:
            return
        if self.trainer_status is None or (ts.progress_percentage, ts.updated_at) != (
                self.trainer_status.progress_percentage, self.trainer_status.updated_at):
            self.gang.append(Sample(len(self.gang) + 1, None, now))
        self.trainer_status = ts

    def poll(self, now: float | None = None) -> Assessment:
        """Read the store once and judge. Never raises for storage errors (logged)."""
        now = self.clock() if now is None else now
        try:
            self.observe(rank_progress.read(self.backend), now)
        except Exception as exc:  # noqa: BLE001
            log.warning("progress under %s not readable: %s", self.uri, exc)
        return assess(self.history, ranks=self.ranks, started_at=self.started_at, now=now, policy=self.policy,
                      gang=self.gang)
