"""Waiting for a resized gang: the Node watch decides, the cloud is checked on the side.

Contract: :func:`wait_gang` blocks on a :class:`~kfp_gpu.cluster.gang.GangTracker`'s condition until the gang
is Ready in the planned zones or the deadline passes, and never lets a slow cloud read delay that moment;
the resize operations and the watched pools' instance groups are read on a thread of their own, and the
first failure they show is returned as ``(zone, classified error)`` for the failover table to decide
(:func:`stockout`: a stockout blocks the zone, a quota refusal is QuotaExceeded). No kube writes here.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence

from kfp_gpu import rehearsal_seam
from kfp_gpu.cluster.gang import GangTracker
from kfp_gpu.errors import CapacityUnavailable, KfpGpuError, PermissionDenied, QuotaExceeded
from kfp_gpu.providers.base import CapacityProvider, Operation, PoolRef

log = logging.getLogger(__name__)


def wait_gang(tracker: GangTracker, gang: int, zones: tuple[str, ...], deadline: float,
              provider: CapacityProvider, ops: list[tuple[PoolRef, Operation]], watched: Sequence[PoolRef] = (),
              since: float = 0.0) -> tuple[str, KfpGpuError | None]:
    """Block on the Node watch until ``gang`` nodes are Ready in ``zones`` or the deadline passes;
    check the cloud operations, and the ``watched`` pools' instance groups (stockouts since ``since``),
    meanwhile, on a thread of their own (:class:`_CloudChecks`): a cloud read in flight never delays the
    moment the watch shows the gang Ready. A failure is returned as (zone, error)."""
    next_progress = 0.0
    checks = _CloudChecks(tracker, provider, ops, watched, since).start()
    try:
        with tracker.cond:
            while True:
                if tracker.watch_error is not None:  # a refused Node watch never heals: fail now, in one line
                    from kfp_gpu.cluster.apierrors import api_refusal

                    raise api_refusal(tracker.watch_error) or PermissionDenied(
                        f"the Kubernetes API refused the Node watch: {tracker.watch_error}",
                        remediation="grant list and watch on nodes in kfp_gpu/manifests/controller-rbac.yaml")
                if tracker.ready_count_locked(zones) >= gang:
                    _progress(tracker, gang)
                    return "", None
                if checks.failed is not None:
                    return checks.failed
                now = time.time()
                if now >= next_progress:
                    _progress(tracker, gang)
                    next_progress = now + 1.0
                if now >= deadline:
                    return "", None
                tracker.cond.wait(timeout=min(0.5, max(0.01, deadline - now)))
    finally:
        checks.stop()


class _CloudChecks:
    """The cloud side of :func:`wait_gang`: resize operations every 0.5 s, the watched instance groups'
    stockouts every 1 s (its own timer: resize ops must not starve it). The first failure is set as
    ``failed`` ((zone, error)) and the waiter is woken; a read that fails is retried at the next tick."""

    def __init__(self, tracker: GangTracker, provider: CapacityProvider, ops: list[tuple[PoolRef, Operation]],
                 watched: Sequence[PoolRef], since: float) -> None:
        self.tracker, self.provider, self.ops, self.watched, self.since = tracker, provider, ops, watched, since
        self.failed: tuple[str, KfpGpuError] | None = None
        self._stop = threading.Event()

    def start(self) -> _CloudChecks:
        if self.ops or self.watched:
            threading.Thread(target=self._run, name="kfp-gpu-cloud-checks", daemon=True).start()
        return self

    def stop(self) -> None:
        self._stop.set()  # a read in flight finishes on its own; its answer is then ignored

    def _run(self) -> None:
        next_op = next_activity = 0.0
        while not self._stop.is_set() and (self.ops or self.watched):
            now = time.time()
            failed = None
            if self.ops and now >= next_op:
                next_op = now + 0.5
                self.ops, failed = _refresh(self.provider, self.ops)
            if failed is None and self.watched and now >= next_activity:
                next_activity = now + 1.0
                failed = stockout(self.provider, self.watched, self.since)
            if failed is not None:
                with self.tracker.cond:
                    if not self._stop.is_set():
                        self.failed = failed
                    self.tracker.cond.notify_all()
                return
            due = min([t for t, on in ((next_op, bool(self.ops)), (next_activity, bool(self.watched))) if on] or [now])
            self._stop.wait(max(0.01, due - time.time()))


def stockout(provider: CapacityProvider, watched: Sequence[PoolRef], since: float
             ) -> tuple[str, KfpGpuError] | None:
    """The first watched pool whose instance group hit a stockout or a quota refusal at or after ``since``, as
    (zone, error): a quota error blocks the region (QuotaExceeded), a stockout the zone."""
    for ref in watched:
        try:
            act = provider.pool_activity(ref, since)
        except KfpGpuError as exc:  # a read that failed after retries: look again next time
            log.debug("pool activity of %s: %s", ref.pool, exc)
            continue
        if act.running >= act.target:
            continue
        quota = [e for e in act.errors if e.quota]
        if quota:
            return ref.zone, QuotaExceeded(
                f"node pool {ref.pool} ({ref.zone}) cannot create its VMs: {quota[-1].code}: {quota[-1].message}",
                remediation="request more quota for the metric the message names, or choose a region with free quota",
                zone=ref.zone, region=ref.region, pool=ref.pool, running=act.running, target=act.target)
        hits = [e for e in act.errors if e.stockout]
        if hits:
            return ref.zone, CapacityUnavailable(
                f"node pool {ref.pool} ({ref.zone}) cannot create its VMs: {hits[-1].code}: {hits[-1].message}",
                remediation="the zone is out of stock; kfp-gpu fails over to the next candidate zone",
                zone=ref.zone, pool=ref.pool, running=act.running, target=act.target)
    return None


def _progress(tracker: GangTracker, gang: int) -> None:
    """One line for long waits: nodes Ready x/N and an ETA from the observed boot latencies."""
    from kfp_gpu.report.terminal import progress_from_timeline

    line = progress_from_timeline(tracker.timeline, gang, time.time(), rehearsal_seam.world_time_scale())
    print(f"[scale-up] {line}", flush=True)


def _refresh(provider: CapacityProvider, ops: list[tuple[PoolRef, Operation]]
             ) -> tuple[list[tuple[PoolRef, Operation]], tuple[str, KfpGpuError] | None]:
    pending = []
    for ref, op in ops:
        try:
            cur = provider.operation(op)
        except KfpGpuError:
            pending.append((ref, op))
            continue
        if cur.error is not None:
            err = cur.error if isinstance(cur.error, KfpGpuError) else KfpGpuError(str(cur.error))
            return pending, (ref.zone, err)
        if not cur.done:
            pending.append((ref, cur))
    return pending, None


__all__ = ["wait_gang", "stockout"]
