"""The recovery bench's measures, as pure functions of what the one external pod watch saw (no I/O, no clock).

A job's ranks are its pods as the watch last saw them (:class:`Rank`). After a node is lost at ``t0`` a rank
*trains* when :func:`trains` says so, identically for every side:

* a pod created after ``t0`` trains while it is Running and not stalled (a replacement rank);
* a pod from before ``t0`` on a lost node never trains again (it is being killed);
* a pod from before ``t0`` on a surviving node trains again only after a re-rendezvous that followed the loss
  (``kfp-gpu.io/stalled-since`` >= ``t0`` and its ``kfp-gpu.io/resumes-at`` passed: torchrun elastic). A survivor
  that merely stays Running is hung in the collective (kfp_gpu_rehearsal/sim/ranks.py) or about to be, so Running is not
  enough.

A job trains when at least ``need`` ranks train: all ``n`` for a plain DDP job, ``minReplicas`` for an elastic one.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Rank:
    uid: str
    node: str
    seen: float  # when the watch first saw this pod
    running: bool  # live (no deletionTimestamp, not DELETED) and phase Running
    stalled_at: float | None = None  # kfp-gpu.io/stalled-since
    resumes_at: float | None = None  # kfp-gpu.io/resumes-at


def trains(r: Rank, now: float, t0: float | None = None, lost_nodes: frozenset[str] = frozenset()) -> bool:
    """Does rank ``r`` make progress at ``now``? ``t0`` None: before any loss."""
    if not r.running:
        return False
    if r.stalled_at is not None and (r.resumes_at is None or r.resumes_at < r.stalled_at or now < r.resumes_at):
        return False  # hung in the collective (a resume time older than the stall is an earlier rendezvous's), or
        # inside the re-rendezvous
    if t0 is None or r.seen > t0:
        return True
    if r.node in lost_nodes:
        return False
    return r.stalled_at is not None and r.stalled_at >= t0 and r.resumes_at is not None


def training_ranks(ranks: Iterable[Rank], now: float, t0: float | None = None,
                   lost_nodes: frozenset[str] = frozenset()) -> int:
    return sum(1 for r in ranks if trains(r, now, t0, lost_nodes))


def idle_gpu_s(*, t0: float, gpus_per_node: int, survivors: int, t_train: float, t_full: float,
               replacement_ready: Iterable[float]) -> float:
    """GPU-seconds held idle between the loss and training again: each surviving node's GPUs from ``t0`` until the
    job trains again (``t_train``); each replacement node's GPUs from its Ready until its rank trains (``t_full``:
    all ``n`` ranks training; for a plain job the same moment). A replacement Ready after ``t_full`` idles 0."""
    if t_train < t0 or t_full < t_train:
        raise ValueError(f"times out of order: t0 {t0}, t_train {t_train}, t_full {t_full}")
    held = survivors * (t_train - t0) + sum(max(0.0, t_full - max(t0, r)) for r in replacement_ready)
    return held * gpus_per_node


def steps_lost(progress: int, resume_step: int) -> int:
    """Steps trained before the loss that the job trains again: the step at the loss minus the step it resumed
    from. Raises ValueError when the resume step is ahead of the progress (the measurement is broken)."""
    if resume_step > progress or resume_step < 0:
        raise ValueError(f"resume step {resume_step} outside 0..{progress} (step at the loss)")
    return progress - resume_step


def best_baseline(medians: dict[str, float | None], realistic: Iterable[str]) -> str | None:
    """The realistic baseline with the lowest median (None when none has numbers)."""
    have = [(v, k) for k, v in medians.items() if k in set(realistic) and v is not None]
    return min(have)[1] if have else None


def lowest_without_overlap(samples: dict[str, list[float]]) -> str | None:
    """The side whose largest sample is below every other side's smallest: the only "lowest" the bench claims
    (None when ranges overlap, or fewer than two sides have samples)."""
    have = {k: v for k, v in samples.items() if v}
    if len(have) < 2:
        return None
    for side, xs in have.items():
        if all(max(xs) < min(ys) for other, ys in have.items() if other != side):
            return side
    return None
