"""The controller's leader election: the I/O around :mod:`kfp_gpu.plan.election` (one Lease, client-go semantics).

:class:`LeaderElector` reads the Lease, asks :func:`~kfp_gpu.plan.election.decide`, and writes: a create, or an
update carrying the ``resourceVersion`` it read (optimistic concurrency: of two replicas writing at once the API
server takes one and answers the other 409 Conflict). Errors go through the one classifier
(:func:`kfp_gpu.cluster.apierrors.classify`): a transient one (429, 5xx, no answer) or a conflict is retried at the
next round (a candidate never sooner than the server's Retry-After); a refusal (403: the RBAC lacks a verb) stops a
candidate with one line naming the permission; a leader that cannot renew steps down at the renew deadline.

- :meth:`LeaderElector.acquire` blocks until this replica leads (every ``retry_period_s``, jittered as client-go's
  ``JitterFactor`` 1.2).
- :meth:`LeaderElector.keep` renews in a thread and calls ``on_lost`` once, as soon as the Lease names another
  holder or no renewal succeeded within ``renew_deadline_s``; ``on_lost`` must stop all work (the controller kills
  its work units and exits, as controller-runtime exits on "leader election lost").
- ``on_renew(deadline)`` after every successful write: the local time this replica may act until (send time +
  ``renew_deadline_s``). The controller shares it with its work units (:func:`kfp_gpu.controller.work.hold_until`),
  which stop by themselves at it: a leader frozen whole (SIGSTOP, a paused VM) cannot run ``on_lost``, and its
  units, children of the forkserver, would otherwise keep acting after the Lease passed to the standby.
- :meth:`LeaderElector.release` hands the Lease back on a clean exit (client-go's ``ReleaseOnCancel``): the standby
  takes over at its next round.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import random
import socket
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from kfp_gpu.cluster import apierrors, owned
from kfp_gpu.errors import KfpGpuError
from kfp_gpu.ownership import LABEL_MANAGED
from kfp_gpu.plan import election
from kfp_gpu.plan.election import Decision, Do, Observation, Record, Timings

log = logging.getLogger(__name__)
LEASE_NAME = "kfp-gpu-controller"  # --leader-elect-resource-name's default, the Role's resourceNames
Obj = dict[str, Any]


def identity() -> str:
    """This replica's holderIdentity: its pod's name (``POD_NAME``) or host, and a fresh uuid per process, as
    controller-runtime names its holder: a restarted container is a new candidate, never the old holder."""
    return f"{os.environ.get('POD_NAME') or socket.gethostname()}_{uuid.uuid4()}"


def _micro(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _ts(value: Any) -> float | None:
    return dt.datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp() if value else None


def to_record(lease: Obj) -> Record:
    spec = lease.get("spec") or {}
    return Record(str(spec.get("holderIdentity") or ""), int(spec.get("leaseDurationSeconds") or 0),
                  _ts(spec.get("acquireTime")), _ts(spec.get("renewTime")), int(spec.get("leaseTransitions") or 0))


def to_spec(rec: Record) -> Obj:
    return {"holderIdentity": rec.holder or None, "leaseDurationSeconds": rec.lease_duration_s,
            "acquireTime": _micro(rec.acquire_time) if rec.acquire_time is not None else None,
            "renewTime": _micro(rec.renew_time) if rec.renew_time is not None else None,
            "leaseTransitions": rec.transitions}


class LeaderElector:
    """One replica's candidacy for the Lease ``namespace/name``."""

    def __init__(self, api: Any, namespace: str, name: str = LEASE_NAME, me: str = "",
                 timings: Timings = election.DEFAULT, *, clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time, on_renew: Callable[[float], None] | None = None) -> None:
        problem = timings.problem()
        if problem:
            raise KfpGpuError(problem)
        self.api, self.namespace, self.name, self.timings = api, namespace, name, timings
        self.me = me or identity()
        self._clock, self._wall = clock, wall
        self.on_renew = on_renew  # called with the local time (clock) this replica may act until, after each write
        self.obs: Observation | None = None
        self._lease: Obj | None = None  # the Lease as last read (its resourceVersion conditions our update)
        self.leading = False
        self.last_renew: float | None = None  # local time the last successful write was sent
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def where(self) -> str:
        return f"Lease {self.namespace}/{self.name}"

    def _path(self, name: str = "") -> str:
        return owned.LEASE.path(self.namespace, name)

    # ---------------------------------------------------------------- one round
    def round(self) -> Decision:
        """Read, decide, write: one ``tryAcquireOrRenew``. Raises: KfpGpuError on a refusal (403/401)."""
        sent = self._clock()
        timeout = self._timeout(sent)
        try:
            self._lease = owned.request(self.api, "GET", self._path(self.name), timeout_s=timeout)
        except Exception as exc:  # noqa: BLE001 - classified below; a bug re-raises
            if not isinstance(self._verdict(exc, "read"), apierrors.NotFound):
                return Decision(Do.WAIT, f"could not read the {self.where}: {exc}")
            self._lease = None
        now = self._clock()
        self.obs = election.observe(self.obs, to_record(self._lease) if self._lease else None, now)
        d = election.decide(self.obs, self.me, self.leading, now, self._wall(), self.timings)
        if d.do in (Do.WAIT, Do.STEP_DOWN) or d.record is None:
            return d
        body: Obj = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "spec": to_spec(d.record),
                     "metadata": dict(owned.meta(self._lease)) if self._lease else
                     {"name": self.name, "labels": {LABEL_MANAGED: "true"}}}
        try:
            if d.do is Do.CREATE:
                wrote = owned.request(self.api, "POST", self._path(), body=body, timeout_s=timeout)
            else:  # metadata.resourceVersion as read: a write in between makes this one 409
                wrote = owned.request(self.api, "PUT", self._path(self.name), body=body, timeout_s=timeout)
        except Exception as exc:  # noqa: BLE001
            verdict = self._verdict(exc, "write")
            return Decision(Do.WAIT, f"{d.do.value} lost a race (409): re-reading" if isinstance(
                verdict, apierrors.Conflict) else f"{d.do.value} of the {self.where} failed: {exc}")
        self._lease = wrote
        self.obs = Observation(d.record, self._clock())
        self.leading, self.last_renew = True, sent
        if self.on_renew is not None:
            self.on_renew(sent + self.timings.renew_deadline_s)
        return d

    def _timeout(self, now: float) -> float:
        """A leader's request may not outlast its renew deadline; a candidate's is one renew deadline."""
        if self.leading and self.last_renew is not None:
            return max(0.2, self.last_renew + self.timings.renew_deadline_s - now)
        return self.timings.renew_deadline_s

    def _verdict(self, exc: Exception, what: str) -> apierrors.Verdict:
        verdict = apierrors.classify(exc)
        if verdict is None:
            raise exc
        if isinstance(verdict, apierrors.Permanent) and not self.leading:
            raise verdict.refusal or KfpGpuError(
                f"the {self.where}: {what} answered {verdict.status} {verdict.reason}",
                remediation="see kfp_gpu/manifests/controller-rbac.yaml (Role kfp-gpu-controller) and "
                "docs/operator-guide.md (High availability)")
        if isinstance(verdict, apierrors.Transient) and verdict.retry_after_s and not self.leading:
            self._stop.wait(min(verdict.retry_after_s, self.timings.lease_duration_s))
        return verdict

    # ---------------------------------------------------------------- the loops
    def acquire(self, stop: threading.Event | None = None) -> bool:
        """Block until this replica holds the Lease (True), or ``stop`` is set (False)."""
        stop = stop or self._stop
        log.info("%s: candidate %s, waiting to lead", self.where, self.me)
        while not stop.is_set():
            d = self.round()
            if self.leading:
                log.info("leader election: %s acquired the %s (%s)", self.me, self.where, d.reason)
                return True
            log.debug("%s: %s", self.where, d.reason)
            stop.wait(self.timings.retry_period_s * (1 + random.random() * election.JITTER))  # noqa: S311
        return False

    def keep(self, on_lost: Callable[[str], None]) -> threading.Thread:
        """Renew every ``retry_period_s`` in a thread; ``on_lost(reason)`` once when leadership is lost."""
        def loop() -> None:
            while not self._stop.wait(self.timings.retry_period_s):
                if election.must_step_down(self.last_renew, self._clock(), self.timings):  # before the round: a
                    # replica frozen past its deadline steps down even if it could still renew (client-go's
                    # renew loop times out the same way); its units already stopped at that deadline
                    reason = f"no renewal for {self.timings.renew_deadline_s}s (this process was paused or cut off)"
                else:
                    d = self.round()
                    if d.do is Do.STEP_DOWN:
                        reason = d.reason
                    elif election.must_step_down(self.last_renew, self._clock(), self.timings):
                        reason = f"no renewal succeeded for {self.timings.renew_deadline_s}s ({d.reason})"
                    else:
                        continue
                self.leading = False
                log.error("leader election lost: %s: %s", self.where, reason)
                on_lost(reason)
                return

        self._thread = threading.Thread(target=loop, daemon=True, name="kfp-gpu-leader-renew")
        self._thread.start()
        return self._thread

    def release(self) -> None:
        """Stop renewing and hand the Lease back if it is still ours (a failure leaves it to expire)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.timings.renew_deadline_s)
        if not self.leading or self._lease is None:
            return
        self.leading = False
        body = {**self._lease, "spec": to_spec(election.released(to_record(self._lease), self._wall()))}
        try:
            owned.request(self.api, "PUT", self._path(self.name), body=body, timeout_s=self.timings.retry_period_s)
            log.info("leader election: %s released the %s", self.me, self.where)
        except Exception as exc:  # noqa: BLE001 - it expires on its own
            log.warning("%s: release failed (%s); the standby takes over when it expires", self.where, exc)
