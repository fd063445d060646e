"""The train step's queue: which Kueue LocalQueue the job goes to, and the wait for its admission.

On a Kueue-gated namespace the job is created suspended with the LocalQueue's label; until Kueue admits its
Workload there are no pods, which is not a gang failure: the step waits, with ``[queue] ...`` progress lines and
its own deadline (``queue_timeout_s``) instead of the no-pods watchdog, and records the admission (timeline event
``job-admitted`` with the wait; the ledger's ``admission`` and ``admissions``). A retried train pod re-attaches to
a job still waiting and keeps the first try's start of the wait. The decisions are in :mod:`kfp_gpu.plan.admission`.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from kfp_gpu.errors import InvalidSpec, QueueTimeout
from kfp_gpu.plan.admission import QueueState, progress_due
from kfp_gpu.plan.recovery import Cause, Verdict, classify

if TYPE_CHECKING:
    from kfp_gpu.steps.train_state import TrainState

PROGRESS_EVERY_S = 30.0
FIRST_PROGRESS_S = 2.0  # no line for a wait shorter than this with no Workload yet


def check_timeout(queue_timeout_s: float) -> None:
    """Raises: InvalidSpec when ``queue_timeout_s`` is not a positive number of seconds."""
    if not isinstance(queue_timeout_s, (int, float)) or isinstance(queue_timeout_s, bool) or not (
            0 < queue_timeout_s < float("inf")):
        raise InvalidSpec("queue_timeout_s", queue_timeout_s, "a positive number of seconds (default 3600)",
                          remediation="pass how long the job may wait for admission in its Kueue queue")


def resolve_queue(st: TrainState) -> str:
    """The run's LocalQueue: the one an earlier try of this step recorded, else resolved now from
    ``target.queue`` and the namespace's LocalQueues ("" when Kueue does not gate the namespace). Recorded in
    the ledger (``kueue``).

    Raises: InvalidSpec (target.queue names no LocalQueue, or several and none chosen), CrdMissing, ApiException.
    """
    rec = st.ledger.get("kueue")
    if isinstance(rec, dict) and "queue" in rec:
        return str(rec["queue"])
    from kfp_gpu.cluster.kueue import resolve_local_queue

    lq = resolve_local_queue(st.api, st.namespace, st.spec.target.queue)
    st.ledger["kueue"] = {"queue": lq.name if lq else "", "cluster_queue": lq.cluster_queue if lq else ""}
    return lq.name if lq else ""


def wait_admitted(st: TrainState, timeout_s: float, *, progress_every_s: float = PROGRESS_EVERY_S) -> Verdict | None:
    """Block while the attempt's job waits for admission. None once it is admitted (or was never queued);
    a verdict when a gang node was lost (PREEMPTION) or Kueue evicted the Workload (QUEUE_EVICTION) meanwhile.

    Raises: QueueTimeout (a GangPlacementFailed): still not admitted ``timeout_s`` after the wait began (the queue and the
        Workload's status in one line; the caller deletes the job).
    """
    w = st.watch
    rec: dict[str, Any] = st.ledger.get("admission") or {}
    if rec.get("job_uid") != w.uid:  # a new job (or the first look at a re-attached one)
        rec = {"job_uid": w.uid, "attempt": st.attempt, "queue": st.queue, "waiting_since": w.created_at}
    since = float(rec["waiting_since"])
    last: float | None = None
    while True:
        now = time.time()
        adm = w.admission(now, waiting_since=since, timeout_s=timeout_s)
        evicted = adm.state is QueueState.EVICTED
        verdict = classify(w.gang, w.incidents, (), now=now, queue_evicted=adm.reason if evicted else "",
                           queue_evicted_at=adm.at if evicted else None)
        if verdict.cause in (Cause.PREEMPTION, Cause.QUEUE_EVICTION):
            w.decided_at = now
            return verdict
        if adm.state is not QueueState.WAITING:
            if "admitted_at" not in rec and (st.queue or rec.get("state") == "waiting"):
                _admitted(st, rec, w.admitted_at or now)
            return None
        if rec.get("state") != "waiting":
            rec["state"] = "waiting"
            st.ledger["admission"] = rec
            st.save_ledger()
        if adm.expired:
            wl = w.workload
            raise QueueTimeout(
                f"job {st.job}: {adm.expired}",
                remediation=f"free quota in the ClusterQueue behind LocalQueue {st.queue or '(none)'}, raise "
                "queue_timeout_s, or submit to another queue (target.queue)",
                job=st.job, queue=st.queue, workload=wl.name if wl else "", waited_s=round(now - since, 1))
        quiet_until = since + min(progress_every_s, FIRST_PROGRESS_S)  # Kueue makes the Workload within a moment
        if (w.workload is not None and w.workload.pending or now >= quiet_until) and (last is None or progress_due(last, now,
                                                                                             progress_every_s)):
            print(f"[queue] job {st.job} waiting for admission in LocalQueue {st.queue or '(none)'} for "
                  f"{now - since:.0f}s (deadline in {(adm.next_deadline or now) - now:.0f}s): {adm.reason}", flush=True)
            last = now
        nxt = min(adm.next_deadline or now, quiet_until if last is None else last + progress_every_s)
        w.wait(max(0.0, min(nxt - now, 5.0)))


def _admitted(st: TrainState, rec: dict[str, Any], at: float) -> None:
    wl = st.watch.workload
    wait_s = round(max(0.0, at - float(rec["waiting_since"])), 3)
    rec.update(state="admitted", admitted_at=at, wait_s=wait_s, workload=wl.name if wl else "",
               cluster_queue=wl.cluster_queue if wl else "")
    st.ledger["admission"] = rec
    st.ledger.setdefault("admissions", []).append(dict(rec))
    st.timeline.event("job-admitted", at, job=st.job, attempt=st.attempt, queue=st.queue, wait_s=wait_s,
                      workload=rec["workload"], cluster_queue=rec["cluster_queue"])
    print(f"[queue] job {st.job} admitted by LocalQueue {st.queue or '(none)'} after {wait_s:.1f}s"
          + (f" (workload {rec['workload']}, ClusterQueue {rec['cluster_queue']})" if wl else ""), flush=True)
    st.save_ledger()
