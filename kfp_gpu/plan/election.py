"""Leader election on a ``coordination.k8s.io/v1`` Lease: the pure decision of one round, in virtual time.

The semantics are client-go's ``tools/leaderelection`` (``tryAcquireOrRenew``), which controller-runtime, the
Training Operator, Kueue, Karpenter and cluster-autoscaler all use:

- The Lease record is ``holderIdentity``, ``leaseDurationSeconds``, ``acquireTime``, ``renewTime`` and
  ``leaseTransitions``. Writes are conditional: an update carries the ``resourceVersion`` that was read, so of two
  candidates writing the same record, one gets 409 Conflict (the I/O side, :mod:`kfp_gpu.controller.election`).
- A candidate acquires a Lease that is **free** (no holder: its holder released it) or **expired**. Expiry is judged
  as client-go judges it, on this replica's own clock: the record has not changed for ``leaseDurationSeconds``
  (the record's own duration) since this replica first saw it in that form ("measured against the time of last
  observed renewTime", LeaseSpec API reference). Clock skew between replicas then does not matter; a new candidate
  waits a full duration before taking over a holder it never saw renew (client-go's doc.go says the same).
- The holder renews (writes ``renewTime``) every ``retry_period_s``; when no renewal has succeeded for
  ``renew_deadline_s`` it steps down. ``renew_deadline_s < lease_duration_s``, so it has stopped acting before any
  other replica may take the Lease over. It also steps down at once when it reads another holder or no Lease at all.
- Defaults: 15 s / 10 s / 2 s, those of controller-runtime's manager and of kube-controller-manager's
  ``--leader-elect-lease-duration/-renew-deadline/-retry-period``.

:func:`observe` keeps the local time at which the current record was first seen; :func:`decide` says what one
round does; :func:`must_step_down` is the renew deadline alone (checked even when the API does not answer).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace

JITTER = 1.2  # client-go's JitterFactor: a candidate retries every retry_period_s * [1, 1 + JITTER)


@dataclass(frozen=True)
class Timings:
    """The election's three durations, in seconds (the Lease's ``leaseDurationSeconds`` is a whole number)."""

    lease_duration_s: int = 15
    renew_deadline_s: float = 10.0
    retry_period_s: float = 2.0

    def problem(self) -> str:
        """One line naming the flag, its value and the fix when the timings cannot work; "" when they can
        (client-go's NewLeaderElector checks the same: leaseDuration > renewDeadline > JitterFactor * retryPeriod)."""
        if self.lease_duration_s < 1:
            return (f"--leader-elect-lease-duration={self.lease_duration_s}: the Lease's leaseDurationSeconds must "
                    "be a whole number of seconds >= 1; use the default 15")
        if self.retry_period_s <= 0:
            return f"--leader-elect-retry-period={self.retry_period_s}: must be > 0; use the default 2"
        if not self.renew_deadline_s < self.lease_duration_s:
            return (f"--leader-elect-renew-deadline={self.renew_deadline_s} must be shorter than "
                    f"--leader-elect-lease-duration={self.lease_duration_s}: the leader must stop before another "
                    "replica may take the Lease; e.g. 10 and 15 (the defaults)")
        if not self.renew_deadline_s > JITTER * self.retry_period_s:
            return (f"--leader-elect-renew-deadline={self.renew_deadline_s} must be longer than {JITTER} x "
                    f"--leader-elect-retry-period={self.retry_period_s}: the leader needs more than one try to "
                    "renew; e.g. 10 and 2 (the defaults)")
        return ""


DEFAULT = Timings()


@dataclass(frozen=True)
class Record:
    """A Lease's spec as the election reads and writes it. Times are wall-clock seconds (the API's MicroTime)."""

    holder: str = ""
    lease_duration_s: int = 0
    acquire_time: float | None = None
    renew_time: float | None = None
    transitions: int = 0


@dataclass(frozen=True)
class Observation:
    """The record this replica last read (None: there was no Lease) and when it first read it so (local clock)."""

    record: Record | None
    since: float


class Do(str, enum.Enum):
    CREATE = "create"  # no Lease: create it holding it (the API refuses a second create: 409)
    ACQUIRE = "acquire"  # free or expired: update it to hold it (conditional on the resourceVersion read)
    RENEW = "renew"  # ours: update renewTime (conditional)
    WAIT = "wait"  # another replica holds it and it has not expired
    STEP_DOWN = "step down"  # we were leading and the Lease is no longer ours


@dataclass(frozen=True)
class Decision:
    do: Do
    reason: str
    record: Record | None = None  # what to write (CREATE, ACQUIRE, RENEW)
    expires_in_s: float = 0.0  # WAIT: when the holder's lease runs out, as this replica sees it


def observe(prev: Observation | None, record: Record | None, now: float) -> Observation:
    """The observation after reading ``record`` at local time ``now``: its clock restarts only when the record
    changed (client-go's ``observedTime``)."""
    if prev is not None and prev.record == record:
        return prev
    return Observation(record, now)


def decide(obs: Observation, me: str, leading: bool, now: float, wall: float, timings: Timings) -> Decision:
    """One round of the election for replica ``me`` (``leading``: it holds the lease as far as it knows) at local
    time ``now`` and wall time ``wall`` (what it would write as acquireTime/renewTime)."""
    rec = obs.record
    if rec is None:
        if leading:
            return Decision(Do.STEP_DOWN, "the Lease is gone (deleted): another replica may create it")
        return Decision(Do.CREATE, "no Lease yet", Record(me, timings.lease_duration_s, wall, wall, 0))
    if rec.holder == me:
        return Decision(Do.RENEW, "ours", replace(rec, lease_duration_s=timings.lease_duration_s, renew_time=wall))
    if leading:
        return Decision(Do.STEP_DOWN, f"the Lease is now held by {rec.holder or 'nobody'}")
    if rec.holder:
        left = obs.since + rec.lease_duration_s - now
        if left > 0:
            return Decision(Do.WAIT, f"held by {rec.holder}", expires_in_s=left)
        why = f"{rec.holder}'s lease expired (not renewed for {rec.lease_duration_s}s)"
    else:
        why = "released by its last holder"
    return Decision(Do.ACQUIRE, why, Record(me, timings.lease_duration_s, wall, wall, rec.transitions + 1))


def must_step_down(last_renew: float | None, now: float, timings: Timings) -> bool:
    """True when the leader's last successful renewal (local time it was sent) is ``renew_deadline_s`` or more ago:
    it must stop every work unit now, while the Lease still keeps the others out."""
    return last_renew is not None and now - last_renew >= timings.renew_deadline_s


def released(rec: Record, wall: float) -> Record:
    """The record a leader writes when it exits cleanly (client-go's ``release``): no holder, so a standby takes
    over at its next round instead of waiting out the duration."""
    return Record("", 1, wall, wall, rec.transitions)
