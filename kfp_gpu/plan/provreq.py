"""ProvisioningRequest decisions, pure: conditions -> state -> error, the request's shape, and which
provisioner backend a cluster should get.

The conditions are the API (as in cluster-autoscaler's ProvisioningRequest processors): a request is read
only through its ``status.conditions`` (type/status/reason/message), never through side channels.

Condition precedence (a request can carry several): CapacityRevoked=True > BookingExpired=True >
Failed=True > Provisioned=True > Provisioned=False (the autoscaler answered "not now", e.g.
``CapacityIsNotFound``, and retries) > Accepted=True > nothing yet. A condition whose ``observedGeneration``
is older than the request's generation still counts: the spec is immutable.
"""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kfp_gpu.errors import CapacityUnavailable, KfpGpuError, Preempted, ProvisioningTimeout, Scope

GROUP, VERSION, PLURAL, KIND = "autoscaling.x-k8s.io", "v1", "provisioningrequests", "ProvisioningRequest"
CRD_NAME = f"{PLURAL}.{GROUP}"
ATOMIC = "best-effort-atomic-scale-up.autoscaling.x-k8s.io"
CHECK_CAPACITY = "check-capacity.autoscaling.x-k8s.io"
QUEUED = "queued-provisioning.gke.io"  # GKE Dynamic Workload Scheduler (flex-start, queued provisioning)
CONSUME_ANNOTATION = "autoscaling.x-k8s.io/consume-provisioning-request"
CLASS_ANNOTATION = "autoscaling.x-k8s.io/provisioning-class-name"
BOOKING_S = 600.0  # cluster-autoscaler and GKE hold provisioned capacity for 10 minutes for its pods
MAX_PODSETS = 32


class ReqState(str, enum.Enum):
    PENDING = "Pending"  # no condition yet (not picked up)
    ACCEPTED = "Accepted"
    WAITING = "Waiting"  # Provisioned=False: the autoscaler found no capacity now and retries
    PROVISIONED = "Provisioned"
    FAILED = "Failed"
    BOOKING_EXPIRED = "BookingExpired"
    REVOKED = "CapacityRevoked"


@dataclass(frozen=True)
class Observed:
    state: ReqState
    reason: str = ""
    message: str = ""


def tried(zone: str, request: str, obs: Observed, at: float) -> dict[str, Any]:
    """One entry of the failover history (CapacityUnavailable's ``failover_history``, the step's ledger): a request
    given up in ``zone`` at ``at``, and why."""
    return {"zone": zone, "request": request, "state": obs.state.value, "reason": obs.reason,
            "message": obs.message, "at": at}


def read_state(conditions: Sequence[Mapping[str, Any]] | None) -> Observed:
    """The request's state from its conditions (precedence in the module docstring)."""
    by_type = {str(c.get("type", "")): c for c in conditions or []}

    def true(t: str) -> Mapping[str, Any] | None:
        c = by_type.get(t)
        return c if c is not None and str(c.get("status")) == "True" else None

    for t, state in (("CapacityRevoked", ReqState.REVOKED), ("BookingExpired", ReqState.BOOKING_EXPIRED),
                     ("Failed", ReqState.FAILED), ("Provisioned", ReqState.PROVISIONED)):
        c = true(t)
        if c is not None:
            return Observed(state, str(c.get("reason", "")), str(c.get("message", "")))
    prov = by_type.get("Provisioned")
    if prov is not None and str(prov.get("status")) == "False":
        return Observed(ReqState.WAITING, str(prov.get("reason", "")), str(prov.get("message", "")))
    acc = true("Accepted")
    if acc is not None:
        return Observed(ReqState.ACCEPTED, str(acc.get("reason", "")), str(acc.get("message", "")))
    return Observed(ReqState.PENDING)


def error_for(obs: Observed, *, request: str, klass: str, zone: str = "", pools: Sequence[str] = ()) -> KfpGpuError:
    """The error a terminal (or revoked) request raises, with its remediation.

    FAILED -> CapacityUnavailable scoped to the zone the request was pinned to (or the region): failover moves
    to the next zone. BOOKING_EXPIRED -> CapacityUnavailable with no scope (transient: request again).
    REVOKED -> Preempted (spot recovery takes over). Anything else -> ProvisioningTimeout.
    """
    where = f" in {zone}" if zone else ""
    what = f"ProvisioningRequest {request} ({klass}){where}"
    detail = f": {obs.reason}" + (f": {obs.message}" if obs.message else "") if obs.reason or obs.message else ""
    pool_txt = f" ({', '.join(pools)})" if pools else ""
    if obs.state is ReqState.FAILED:
        fix = ("kfp-gpu fails over to the next candidate zone; otherwise raise the node pools' autoscaling max"
               f"{pool_txt}, add zones, or request quota" if klass != QUEUED else
               "DWS could not obtain the capacity before the request's timeout: retry later, add zones or pools "
               "with queued provisioning, or use capacity='on-demand'/'spot'")
        return CapacityUnavailable(f"{what} failed{detail}", remediation=fix,
                                   scope=Scope.ZONE if zone else Scope.REGION, zone=zone, request=request)
    if obs.state is ReqState.BOOKING_EXPIRED:
        return CapacityUnavailable(
            f"{what}: the booking expired before the job's pods were scheduled{detail}",
            remediation="kfp-gpu requests the capacity again; if this repeats, start the train step sooner after "
            "scale-up (the autoscaler holds provisioned capacity for 10 minutes)",
            scope=Scope.NONE, request=request)
    if obs.state is ReqState.REVOKED:
        return Preempted(f"{what}: capacity revoked{detail}",
                         remediation="kfp-gpu recovers from the newest checkpoint on new capacity (spot recovery)",
                         request=request)
    return ProvisioningTimeout(f"{what} not provisioned in time (last state {obs.state.value}{detail})",
                               remediation="raise scale_up_deadline_s, add zones, or use a warm pool",
                               request=request)


def request_name(run_id: str, step: str, attempt: int = 0, rebook: int = 0) -> str:
    """A DNS-1123 name, stable per (run, step, attempt, rebook), <= 63 chars (PodTemplate and request share it)."""
    base = "".join(c if c.isalnum() else "-" for c in f"{run_id}-{step}".lower()).strip("-")
    key = f"{run_id}|{step}|{attempt}" + (f"|rebook-{rebook}" if rebook else "")
    digest = hashlib.sha256(key.encode()).hexdigest()[:8]
    return f"kfpgpu-{base[:44].strip('-')}-{digest}"


CAPACITY_IS_FOUND = "CapacityIsFound"  # cluster-autoscaler: Provisioned on nodes that exist, no scale-up made
MAX_REBOOKS = 2  # fresh requests per zone after a booking on nodes that went away
BOOKING_LOST_GRACE_S = 5.0  # no node claimed or seen for this long after the loss: the booking holds nothing


def booking_lost(obs: Observed, *, lost_nodes: int, have: int, count: int) -> bool:
    """Whether a Provisioned request's booking holds nodes that are gone, so that no node will come for it.

    cluster-autoscaler sets Provisioned=True with reason ``CapacityIsFound`` when the request's pods fit the
    nodes it already has, and makes no scale-up for it (``besteffortatomic/provisioning_class.go``; ``CapacityIs
    Provisioned`` is the scale-up's reason). When a node that fitted the request is then deleted or tainted
    ``ToBeDeletedByClusterAutoscaler`` (a scale-down already under way books the request on the nodes it is
    removing: seen in 2 of 8 back-to-back runs of tests/integration/test_provreq_backend.py) while the gang is
    short (``have`` < ``count``), the request is spent: the caller requests the whole gang again, at most
    :data:`MAX_REBOOKS` times per zone, instead of waiting for nodes until its deadline."""
    return obs.state is ReqState.PROVISIONED and obs.reason == CAPACITY_IS_FOUND and lost_nodes > 0 and have < count


def request_class(capacity: str) -> str:
    """flex-start is GKE's DWS (queued provisioning); every other capacity type asks for an atomic scale-up."""
    return QUEUED if capacity == "flex-start" else ATOMIC


def parameters(klass: str, *, max_run_duration_s: float = 0.0, no_retry: bool = False) -> dict[str, str]:
    """The request's ``spec.parameters`` (strings, <= 255 chars each)."""
    out: dict[str, str] = {}
    if klass == QUEUED and max_run_duration_s:
        out["maxRunDurationSeconds"] = str(int(max_run_duration_s))
    if klass == CHECK_CAPACITY and no_retry:
        out["noRetry"] = "true"
    return out


@dataclass(frozen=True)
class BackendChoice:
    name: str  # "node-pool" | "provisioning-request"
    reason: str


def choose_backend(requested: str, *, capacity: str, crd: bool, autoscaler: bool, autoscaled_pools: Sequence[str],
                   queued_pools: Sequence[str]) -> BackendChoice:
    """Which provisioner backend serves this run, and why (shown in the preflight report).

    ``crd``: the cluster serves the ProvisioningRequest API; ``autoscaler``: an autoscaler that processes
    requests serves ``autoscaled_pools`` (the matching pools it manages); ``queued_pools``: matching pools with
    GKE queued provisioning. An explicit choice is kept (it is checked at run time).
    """
    if requested != "auto":
        return BackendChoice(requested, f"target.provisioner={requested!r} in the spec")
    if capacity == "flex-start":
        if crd and queued_pools:
            return BackendChoice("provisioning-request",
                                 f"capacity='flex-start' and {', '.join(queued_pools)} use queued provisioning (DWS)")
        return BackendChoice("node-pool", "capacity='flex-start' but no matching pool has queued provisioning"
                             + ("" if crd else " and the cluster lacks the ProvisioningRequest API")
                             + ": flex-start VMs through a direct resize")
    if crd and autoscaler and autoscaled_pools:
        return BackendChoice("provisioning-request",
                             f"the cluster autoscaler serves ProvisioningRequests and manages "
                             f"{', '.join(autoscaled_pools)}: ask it for the gang instead of resizing its pools")
    why = ("no ProvisioningRequest API" if not crd else
           "no cluster autoscaler serves ProvisioningRequests for the matching pools")
    return BackendChoice("node-pool", f"{why}: resize the matching pools directly")
