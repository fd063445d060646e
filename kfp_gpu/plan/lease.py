"""When may the janitor release a run? Pure decisions over observed leases and owners, in virtual time.

A run is released only when **both** hold:

1. every lease it has expired: each ``coordination.k8s.io`` Lease's ``renewTime + leaseDurationSeconds``
   and each ``kfp-gpu.io/lease-expires`` label on its objects is in the past (a run without Lease objects,
   written before heartbeats existed, is judged by its labels alone; an object without the label holds no
   lease, a label that is not a number never expires, and a run with no lease at all is kept);
2. no live owner is found: every owner recorded on a Lease that is still held (non-empty holderIdentity) is
   gone. An owner is a step pod, an Argo Workflow, or a ``local:<host>:<pid>`` process. A check that could not
   be made (API error) counts as alive: the janitor keeps what it cannot prove dead.

A Lease whose holder released it (the step ended normally) has no owner to check: its expiry alone decides,
which covers the gap between one step ending and the next one starting.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

POD_OWNER, WORKFLOW_OWNER, LOCAL_OWNER, HEARTBEAT_OWNER = "pod", "workflow", "local", "heartbeat"
FINISHED_POD_PHASES = ("Succeeded", "Failed")
FINISHED_WORKFLOW_PHASES = ("Succeeded", "Failed", "Error")


class OwnerState(str, enum.Enum):
    LIVE = "live"
    GONE = "gone"
    UNKNOWN = "unknown"  # could not be checked: treated as live


@dataclass(frozen=True)
class OwnerRef:
    """One recorded owner: kind ``pod`` / ``workflow`` (``ref`` = "namespace/name") or ``local``
    (``ref`` = "local:<host>:<pid>"). ``uid`` pins a pod when the recorder knew it."""

    kind: str
    ref: str
    uid: str = ""

    def __str__(self) -> str:
        return self.ref if self.kind == LOCAL_OWNER else f"{self.kind} {self.ref}"


@dataclass(frozen=True)
class LeaseRecord:
    """What the janitor read from one run Lease object."""

    name: str
    holder: str  # "" once the holder released it
    renew_time: float | None  # unix seconds
    duration_s: float | None
    owners: tuple[OwnerRef, ...] = ()

    @property
    def expires_at(self) -> float:
        """renewTime + leaseDurationSeconds; -inf when either is missing (an unrenewed lease holds nothing)."""
        if self.renew_time is None or self.duration_s is None:
            return -math.inf
        return self.renew_time + self.duration_s


@dataclass(frozen=True)
class Verdict:
    release: bool
    reason: str


def label_expiry(value: str | None) -> float | None:
    """A ``kfp-gpu.io/lease-expires`` label value as unix seconds: None when the object has no such label (it
    holds no lease), +inf when the value is not a number (never expires: the janitor keeps what it cannot read)."""
    if value is None:
        return None
    try:
        return float(value)
    except ValueError:
        return math.inf


def run_expiry(leases: Iterable[LeaseRecord], label_expiries: Iterable[float]) -> float:
    """When the last lease of the run ends (the latest of Lease objects and labels); -inf with none."""
    return max([lease.expires_at for lease in leases] + list(label_expiries), default=-math.inf)


def owners_to_check(leases: Iterable[LeaseRecord]) -> list[OwnerRef]:
    """The owners of the Leases that are still held, without repeats."""
    out: list[OwnerRef] = []
    for lease in leases:
        if lease.holder:
            out += [o for o in lease.owners if o not in out]
    return out


def decide(leases: Iterable[LeaseRecord], label_expiries: Iterable[float],
           owner_states: Mapping[OwnerRef, OwnerState], now: float) -> Verdict:
    """Release the run, or keep it and say why. ``owner_states`` holds a state for each owner of
    :func:`owners_to_check` (a missing entry counts as UNKNOWN, so as alive)."""
    leases, label_expiries = list(leases), list(label_expiries)
    if not leases and not label_expiries:
        return Verdict(False, "no lease recorded on any of its objects")
    expiry = run_expiry(leases, label_expiries)
    if expiry == math.inf:
        return Verdict(False, "an object carries no readable lease-expires label")
    if expiry >= now:
        return Verdict(False, f"lease valid for {expiry - now:.0f}s more")
    ago = f"lease expired {now - expiry:.0f}s ago"
    owners = owners_to_check(leases)
    for owner in owners:
        state = owner_states.get(owner, OwnerState.UNKNOWN)
        if state is OwnerState.LIVE:
            return Verdict(False, f"{ago} but its owner {owner} is alive")
        if state is OwnerState.UNKNOWN:
            return Verdict(False, f"{ago} but its owner {owner} could not be checked")
    gone = ", ".join(f"{o} gone" for o in owners)
    return Verdict(True, f"{ago}; " + (gone if gone else "no step holds it"))


def pod_state(exists: bool, phase: str | None, uid: str = "", want_uid: str = "") -> OwnerState:
    """A recorded step pod: alive unless deleted, Succeeded/Failed, or replaced by a pod with another uid."""
    if not exists or (phase or "") in FINISHED_POD_PHASES or (want_uid and uid and uid != want_uid):
        return OwnerState.GONE
    return OwnerState.LIVE


def workflow_state(exists: bool, phase: str | None, finished_at: str | None, completed_label: str | None,
                   ) -> OwnerState:
    """A recorded Argo Workflow: alive while it exists and has not finished (phase Succeeded/Failed/Error,
    ``status.finishedAt`` set, or the ``workflows.argoproj.io/completed=true`` label)."""
    if not exists or (phase or "") in FINISHED_WORKFLOW_PHASES or finished_at or completed_label == "true":
        return OwnerState.GONE
    return OwnerState.LIVE


def local_state(ref: str, hostname: str, pid_alive: Callable[[int], bool]) -> OwnerState:
    """A ``local:<host>:<pid>`` owner: alive when it is on this host and its pid runs. On another host it
    cannot be checked from here and counts as gone (the lease expiry protected it while it renewed)."""
    parts = ref.split(":")
    if len(parts) != 3 or parts[0] != LOCAL_OWNER or not parts[2].isdigit():
        return OwnerState.GONE
    if parts[1] != hostname:
        return OwnerState.GONE
    return OwnerState.LIVE if pid_alive(int(parts[2])) else OwnerState.GONE


def lock_free(holder: str, renew_time: float | None, duration_s: float | None, me: str, now: float) -> bool:
    """May ``me`` take the janitor lock? When nobody holds it, it is already ours, or its holder stopped
    renewing it (renewTime + leaseDurationSeconds passed)."""
    if not holder or holder == me:
        return True
    if renew_time is None or duration_s is None:
        return True
    return renew_time + duration_s < now


def heartbeat_state(last_beat: float | None, created: float | None, ttl_s: float, now: float) -> OwnerState:
    """An owner the controller cannot observe (a Vertex AI pipeline, a laptop): its steps beat on the gang while they
    run. Gone once neither a beat nor the gang's creation is within ``ttl_s`` (the spec's ``lease_ttl_s``, which must
    cover the longest gap between two kfp-gpu steps, when no step of the run is running to beat)."""
    latest = max((t for t in (last_beat, created) if t is not None), default=None)
    if latest is None:
        return OwnerState.UNKNOWN
    return OwnerState.GONE if now - latest > ttl_s else OwnerState.LIVE
