"""Compute zonal reservations owned by kfp-gpu runs.

A reservation is created with ``specificReservationRequired=false``: matching VMs (zone, machine type,
accelerators) of node pools whose reservation affinity is ANY - GKE's default - consume it automatically, so
the VMs a scale-up adds in that zone are the reservation's VMs, not a second set paid on top of it
(https://cloud.google.com/compute/docs/instances/reservations-consume).

Compute v1 reservations carry no ``labels`` field, so ownership travels in two places: the
deterministic name (``kfpgpu-<run>-<step>-<zone>``, derived when the request names none) and the
description, which holds the owner's cloud labels as JSON after :data:`OWNER_PREFIX`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import uuid
from typing import TYPE_CHECKING, Any

from kfp_gpu import accelerators
from kfp_gpu.errors import InvalidSpec, KfpGpuError, NotFound
from kfp_gpu.ownership import Owner, label_safe
from kfp_gpu.providers.base import Operation, OpStatus, OwnedResource, ReservationRequest
from kfp_gpu.providers.gke import classify as cl

if TYPE_CHECKING:
    from kfp_gpu.providers.gke.provider import GkeProvider

log = logging.getLogger(__name__)
OWNER_PREFIX = "kfp-gpu owner "
_NAME_RE = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")


def reservation_name(req: ReservationRequest, owner: Owner) -> str:
    """``req.name`` if set, else a deterministic name from (run id, step, zone)."""
    if req.name:
        if not _NAME_RE.match(req.name):
            raise InvalidSpec("reservation.name", req.name, "must be a lowercase RFC 1035 name (<= 63 chars)")
        return req.name
    digest = hashlib.sha1(f"{owner.run_id}/{owner.step}/{req.zone}".encode()).hexdigest()[:6]
    stem = re.sub(r"[^a-z0-9-]+", "-", f"kfpgpu-{label_safe(owner.run_id)}-{label_safe(owner.step)}")[:48]
    return f"{stem.rstrip('-')}-{req.zone.rsplit('-', 1)[-1]}-{digest}"


def owner_of(description: str) -> dict[str, str] | None:
    if not description.startswith(OWNER_PREFIX):
        return None
    try:
        data = json.loads(description[len(OWNER_PREFIX):])
    except ValueError:
        return None
    return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else None


def compute_op(raw: Any, kind: str, target: str, zone: str) -> Operation:
    """A compute_v1.Operation as an Operation; errors come from ``error.errors[]``, not status."""
    op_id = f"compute:{zone}:{raw.name}"
    fault = cl.fault_from_compute_operation(raw)
    if fault is not None:
        return Operation(op_id, kind, target, OpStatus.FAILED,
                         cl.classify_fault(fault, zone=zone, region=zone.rsplit("-", 1)[0]))
    status = str(getattr(raw.status, "name", raw.status))
    mapped = {"DONE": OpStatus.DONE, "RUNNING": OpStatus.RUNNING, "PENDING": OpStatus.PENDING}
    return Operation(op_id, kind, target, mapped.get(status, OpStatus.PENDING))


def reserve(p: GkeProvider, req: ReservationRequest, owner: Owner) -> Operation:
    """Create or re-attach; see GkeProvider.reserve.

    Raises: QuotaExceeded, CapacityUnavailable, PermissionDenied, InvalidSpec (name taken by
    another run / bad shape), CloudError.
    """
    acc = accelerators.get(req.accelerator)
    machine = acc.gce_machine_for(req.gpus_per_node)
    if req.count < 1:
        raise InvalidSpec("reservation.count", req.count, "must be >= 1")
    name = reservation_name(req, owner)
    region = req.zone.rsplit("-", 1)[0]
    target = f"{req.zone}/{name}"
    try:
        existing = p._call("reservations", "get", at_zone=req.zone, project=p.project, zone=req.zone,
                           reservation=name)
    except NotFound:
        existing = None
    if existing is not None:
        labels = owner_of(str(existing.description)) or {}
        mine = owner.cloud_labels()
        if labels.get("run_id") != mine["run_id"]:
            raise InvalidSpec("reservation.name", name,
                              f"already exists and is owned by run {labels.get('run_id', '<not kfp-gpu>')!r}",
                              remediation="pick another reservation name or release the other run's reservation")
        return Operation(f"reattach:{req.zone}:{name}", "reserve", target, OpStatus.DONE)
    from google.cloud import compute_v1

    body = compute_v1.Reservation(
        name=name,
        description=OWNER_PREFIX + json.dumps(owner.cloud_labels(), sort_keys=True),
        specific_reservation_required=False,  # consumed by the matching VMs of ANY-affinity pools (GKE's default)
        specific_reservation=compute_v1.AllocationSpecificSKUReservation(
            count=req.count,
            instance_properties=compute_v1.AllocationSpecificSKUAllocationReservedInstanceProperties(
                machine_type=req.machine_type or machine.name,  # VMs consume it only when the types match
                guest_accelerators=[compute_v1.AcceleratorConfig(
                    accelerator_count=req.gpus_per_node, accelerator_type=acc.gke_label)],
            ),
        ),
    )
    raw = p._call("reservations", "insert_unary", at_zone=req.zone, at_region=region,  # a retry dedups on requestId
                  request=compute_v1.InsertReservationRequest(project=p.project, zone=req.zone,
                                                              reservation_resource=body, request_id=str(uuid.uuid4())))
    op = compute_op(raw, "reserve", target, req.zone)
    if op.status is OpStatus.FAILED and op.error is not None:
        raise op.error
    return op


def list_owned(p: GkeProvider, run_id: str | None) -> list[OwnedResource]:
    """kfp-gpu reservations across zones (aggregatedList), for ``run_id`` or every run.

    Raises: PermissionDenied, TransientCloudError.
    """
    pager = p._call("reservations", "aggregated_list", project=p.project)
    want = label_safe(run_id) if run_id is not None else None
    out = []
    for _scope, scoped in pager:
        for r in scoped.reservations:
            labels = owner_of(str(r.description))
            if labels is None or labels.get("managed") != "true":
                continue
            if want is not None and labels.get("run_id") != want:
                continue
            zone = str(r.zone).rsplit("/", 1)[-1]
            out.append(OwnedResource("reservation", str(r.name), zone, labels))
    return out


def release(p: GkeProvider, run_id: str) -> list[str]:
    """Delete the run's reservations; already-gone ones are skipped.

    Raises: PermissionDenied, TransientCloudError, CloudError.
    """
    deleted = []
    for res in list_owned(p, run_id):
        try:
            from google.cloud import compute_v1

            raw = p._call("reservations", "delete_unary", at_zone=res.location,
                          request=compute_v1.DeleteReservationRequest(project=p.project, zone=res.location,
                                                                      reservation=res.name, request_id=str(uuid.uuid4())))
        except NotFound:
            continue
        op = compute_op(raw, "release", f"{res.location}/{res.name}", res.location)
        if op.status is OpStatus.FAILED and isinstance(op.error, KfpGpuError):
            raise op.error
        deleted.append(res.name)
    return deleted
