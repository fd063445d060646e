"""Admission through a Kueue queue: the state of a queued job, its wait deadline, and evictions, in virtual time.

On a Kueue-managed namespace the job is created suspended with a ``kueue.x-k8s.io/queue-name`` label; Kueue
makes a Workload for it, reserves quota (``QuotaReserved``), runs the admission checks (``Admitted``) and then
unsuspends the job. Kueue can take the quota back later: the Workload gets ``Evicted=True`` (reasons
``Preempted``, ``PodsReadyTimeout``, ``InactiveWorkload``, ...) and the job is suspended again, which deletes its
pods. Nothing here does I/O or reads a clock: the caller passes the facts its watches built and ``now``.

States (:func:`admission`):

* ``NONE``: not queued (no queue, job never suspended): the placement watchdog applies as before;
* ``WAITING``: suspended, or the Workload not admitted yet: no pods are expected; the queue deadline applies;
* ``ADMITTED``: the Workload is admitted and the job runs;
* ``EVICTED``: the Workload is evicted, or the job was suspended again after it had been admitted or running.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

ADMITTED, QUOTA_RESERVED, EVICTED, FINISHED = "Admitted", "QuotaReserved", "Evicted", "Finished"
NO_WORKLOAD_HINT = ("Kueue made no Workload for the job: check that the kubeflow.org/pytorchjob integration is "
                    "enabled in Kueue's configuration")


@dataclass(frozen=True)
class WorkloadFact:
    """One Kueue Workload, as a watch last saw it."""

    name: str
    at: float  # when the watch received this version
    owner_uid: str = ""  # the job it belongs to (owner reference / kueue.x-k8s.io/job-uid)
    quota_reserved: bool = False
    admitted: bool = False
    evicted: str = ""  # reason of Evicted=True ("" when not evicted)
    evicted_message: str = ""
    pending: str = ""  # why it is not admitted yet (QuotaReserved=False message, admission checks)
    cluster_queue: str = ""  # status.admission.clusterQueue once quota is reserved
    finished: bool = False
    deleted: bool = False


class QueueState(str, enum.Enum):
    NONE = "none"
    WAITING = "waiting"
    ADMITTED = "admitted"
    EVICTED = "evicted"


@dataclass(frozen=True)
class Admission:
    state: QueueState
    reason: str = ""  # WAITING: why; EVICTED: "<reason>: <message>"
    at: float = 0.0  # EVICTED: time of the evidence
    expired: str = ""  # WAITING past the deadline: the one-line error
    next_deadline: float | None = None  # WAITING: when the queue deadline ends


def admission(
    *, queue: str, suspended: bool, workload: WorkloadFact | None, admitted_at: float | None, running: bool,
    waiting_since: float, now: float, timeout_s: float, suspended_at: float | None = None,
) -> Admission:
    """The queue state of the current attempt's job.

    ``queue``: the LocalQueue the job was labelled with ("" when the namespace is not Kueue-gated);
    ``suspended``: the job's ``spec.runPolicy.suspend``; ``workload``: the job's Workload (None when none seen);
    ``admitted_at``: when this attempt was seen admitted (None before); ``running``: the gang ran in this
    attempt; ``waiting_since``: when the wait began (job creation, or an earlier try's record on re-attach).
    """
    wl = workload if workload is not None and not workload.deleted else None
    if wl is not None and wl.evicted:
        return Admission(QueueState.EVICTED, f"workload {wl.name} evicted: {wl.evicted}"
                         + (f": {wl.evicted_message}" if wl.evicted_message else ""), wl.at)
    if suspended and (admitted_at is not None or running):
        at = suspended_at if suspended_at is not None else now
        return Admission(QueueState.EVICTED, "job suspended again after admission"
                         + (f" (LocalQueue {queue})" if queue else ""), at)
    waiting = suspended or (bool(queue) and (wl is None or not wl.admitted) and admitted_at is None and not running)
    if not waiting:
        return Admission(QueueState.ADMITTED if queue or admitted_at is not None else QueueState.NONE)
    deadline = waiting_since + timeout_s
    why = waiting_reason(queue, wl)
    if now >= deadline:
        return Admission(QueueState.WAITING, why, expired=(
            f"not admitted by Kueue LocalQueue {queue or '(none)'} within {timeout_s:g}s: {why}"))
    return Admission(QueueState.WAITING, why, next_deadline=deadline)


def waiting_reason(queue: str, wl: WorkloadFact | None) -> str:
    """Why the job still waits, for progress lines and the timeout error."""
    if wl is None:
        return NO_WORKLOAD_HINT if queue else "job suspended (no queue label)"
    cq = f" (ClusterQueue {wl.cluster_queue})" if wl.cluster_queue else ""
    if wl.admitted:
        return f"workload {wl.name} admitted{cq}; waiting for the job to be unsuspended"
    if wl.quota_reserved:
        return f"workload {wl.name} has quota{cq}, waiting for admission checks" + (
            f": {wl.pending}" if wl.pending else "")
    return f"workload {wl.name} pending: {wl.pending or 'no status yet'}"


def progress_due(last_at: float | None, now: float, every_s: float) -> bool:
    """True when a progress line is due (first one at once, then every ``every_s``)."""
    return last_at is None or now - last_at >= every_s
