"""Long-running operations of GkeProvider: GKE (container) and Compute zone operations, polled and classified.

Contract: :func:`poll` takes an :class:`~kfp_gpu.providers.base.Operation` this provider returned and gives its
current state; a FAILED one carries its classified error (from error, statusMessage and node-pool conditions,
not only status), and a resize that finished DONE is checked against its instance group's listErrors, so a
stockout or a per-VM quota refusal after setSize comes back as a DONE Operation whose ``error`` says so
(partial success). :func:`gke_op` maps one raw GKE operation. Ids: ``gke:<location>:<name>`` (container),
``<kind>:<zone>:<name>`` (Compute), ``noop:...`` (nothing was called).

https://cloud.google.com/kubernetes-engine/docs/reference/rest/v1/projects.locations.operations/get
https://cloud.google.com/compute/docs/reference/rest/v1/zoneOperations/get
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kfp_gpu.providers.base import Operation, OpStatus, PoolRef
from kfp_gpu.providers.gke import activity
from kfp_gpu.providers.gke import classify as cl
from kfp_gpu.providers.gke import reservations as res_mod

if TYPE_CHECKING:
    from kfp_gpu.providers.gke.provider import GkeProvider

__all__ = ["gke_op", "poll"]


def poll(p: GkeProvider, op: Operation) -> Operation:
    """The current state of ``op`` (see the module docstring); a resize's new state replaces the cached one.

    Raises: RateLimited, TransientCloudError, PermissionDenied.
    """
    if op.done or op.id.startswith("noop:"):
        return op
    kind, loc, name = op.id.split(":", 2)
    if kind == "gke":
        raw = p._call("container", "get_operation",
                      name=f"projects/{p.project}/locations/{loc}/operations/{name}")
        zone = op.target.split("/", 1)[1] if "/" in op.target else ""
        new = gke_op(p, raw, op.target, zone, zone.rsplit("-", 1)[0])
        if new.status is OpStatus.DONE and new.error is None and zone:
            ref = PoolRef(op.target.split("/", 1)[0], zone, zone.rsplit("-", 1)[0])
            err = activity.creation_failure(p, ref, activity.unix(str(raw.start_time)), _target(p, op))
            if err is not None:
                new = Operation(new.id, new.kind, new.target, OpStatus.DONE, err)
        with p._lock:
            for key, (size, cached, owner) in list(p._resizes.items()):
                if cached.id == op.id:
                    p._resizes[key] = (size, new, owner)
        return new
    raw = p._call("zone_ops", "get", at_zone=loc, project=p.project, zone=loc, operation=name)
    return res_mod.compute_op(raw, op.kind, op.target, loc)


def _target(p: GkeProvider, op: Operation) -> int:
    """The size the resize behind ``op`` asked for (-1 when this provider did not issue it)."""
    with p._lock:
        return next((size for size, cached, _ in p._resizes.values() if cached.id == op.id), -1)


def gke_op(p: GkeProvider, raw: Any, target: str, zone: str, region: str) -> Operation:
    """One raw GKE operation as an Operation; DONE with a fault is FAILED with the classified error."""
    loc = str(raw.location or raw.zone or p.location)
    status = _enum(raw.status)
    fault = cl.fault_from_gke_operation(raw)
    if fault is not None and status == "DONE":
        err = cl.classify_fault(fault, zone=zone, region=region)
        return Operation(f"gke:{loc}:{raw.name}", "resize", target, OpStatus.FAILED, err)
    mapped = {"DONE": OpStatus.DONE, "RUNNING": OpStatus.RUNNING, "ABORTING": OpStatus.RUNNING}
    return Operation(f"gke:{loc}:{raw.name}", "resize", target, mapped.get(status, OpStatus.PENDING))


def _enum(value: Any) -> str:
    return str(getattr(value, "name", value))
