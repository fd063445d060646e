"""The ``training`` key of a scenario: how the world's simulated ranks train, and which of them misbehave.

::

    training:
      step_s: 1.0                       # world seconds per training step (opted-in pods may override it)
      hang: {rank: 1, after_s: 120}     # rank 1 stops making progress 120 s after it started; its pod stays Running
                                        # (sticky: true: a bad node; later incarnations hang on the rank there)
      slow: {rank: 2, factor: 1.5}      # rank 2's steps take 1.5 x as long (sticky: true: the node is slow, for
                                        # whichever rank runs there, until it leaves the gang)
      checkpoint_every: 50              # the gang saves a checkpoint every 50 steps (omit: the world saves none)

Only pods that opt in (annotation ``kfp-gpu.io/sim-step-seconds``, :mod:`kfp_gpu_rehearsal.sim.progress`) train; without the
key the world writes no progress at all. ``hang.times`` (default 1) is how many incarnations of a job hang (the
gang a supervisor restarts runs clean after that). Durations are real-world seconds, compressed by
:data:`kfp_gpu_rehearsal.devcluster.worldtime.TIME_SCALE`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kfp_gpu.errors import InvalidSpec
from kfp_gpu_rehearsal.sim.worldspec import num, obj


@dataclass(frozen=True)
class RankFault:
    rank: int
    after_s: float = 0.0  # world seconds after the rank started running (hang)
    factor: float = 1.0  # step time multiplier (slow)
    times: int = 1  # incarnations of a job that hang
    sticky: bool = False  # the fault is the node's: later incarnations hang (or run slow) on whichever rank runs there


@dataclass(frozen=True)
class TrainingSpec:
    step_s: float = 1.0
    hang: RankFault | None = None
    slow: RankFault | None = None
    checkpoint_every: int = 0  # steps between the gang's checkpoints; 0: the world writes none


def _rank(data: Any, f: str, keys: set[str]) -> dict[str, Any]:
    d = obj(data, f, keys | {"rank"})
    r = d.get("rank")
    if isinstance(r, bool) or not isinstance(r, int) or r < 0:
        raise InvalidSpec(f"{f}.rank", r, "must be a rank number >= 0 (0 is the Master)")
    return d


def parse_training(data: Any) -> TrainingSpec | None:
    """None when the scenario has no ``training`` key. Raises: InvalidSpec naming the field."""
    if data is None:
        return None
    d = obj(data, "training", {"step_s", "hang", "slow", "checkpoint_every"})
    hang = slow = None
    if d.get("hang") is not None:
        h = _rank(d["hang"], "training.hang", {"after_s", "times", "sticky"})
        sticky = h.get("sticky", False)
        if not isinstance(sticky, bool):
            raise InvalidSpec("training.hang.sticky", sticky, "must be true or false")
        hang = RankFault(int(h["rank"]), after_s=num(h.get("after_s", 0.0), "training.hang.after_s", 0.0),
                         times=int(num(h.get("times", 1), "training.hang.times", 1)), sticky=sticky)
    if d.get("slow") is not None:
        s = _rank(d["slow"], "training.slow", {"factor", "sticky"})
        if not isinstance(s.get("sticky", False), bool):
            raise InvalidSpec("training.slow.sticky", s["sticky"], "must be true or false")
        slow = RankFault(int(s["rank"]), factor=num(s.get("factor", 1.0), "training.slow.factor", 1.0),
                         sticky=bool(s.get("sticky", False)))
    every = d.get("checkpoint_every", 0)
    if isinstance(every, bool) or not isinstance(every, int) or every < 0:
        raise InvalidSpec("training.checkpoint_every", every,
                          "must be a whole number of steps (0 or omitted: the world saves no checkpoint)")
    return TrainingSpec(num(d.get("step_s", 1.0), "training.step_s", 0.001), hang, slow, every)
