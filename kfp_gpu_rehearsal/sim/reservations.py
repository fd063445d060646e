"""Compute zonal reservations in the stand-in, and how the VMs of node pools consume them.

A reservation is kept as the JSON Compute renders (``reservations.get``) plus private ``_`` keys. A VM of a
pool consumes one reserved VM when its machine type, accelerators and zone match and its pool's affinity
allows it (docs/sim.md, "Reservations"):

* ``ANY_RESERVATION`` (also when the pool sets none: Compute's default): a matching reservation whose
  ``specificReservationRequired`` is false and that has a VM free, else on-demand capacity;
* ``SPECIFIC_RESERVATION``: only the reservations it names; with none free the VM is not created (the group
  records the error in listErrors and retries, like a stockout) - reserved capacity needs no stock;
* ``NO_RESERVATION`` and Spot VMs: never.

A VM holds its reserved slot from the moment the group plans it (so quota is not counted twice while it is
being created) and is in use (``inUseCount``) once created; deleting the VM gives the slot back. Quota
counts each reservation's reserved GPUs plus the GPUs of VMs outside reservations: per reservation
max(reserved, used), never the sum.

Every function here runs with the state lock held.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from kfp_gpu import accelerators
from kfp_gpu_rehearsal.sim import shapes
from kfp_gpu_rehearsal.sim.worldspec import AFFINITY_TYPES, RESERVATION_NAME_KEY, ReservationSpec

if TYPE_CHECKING:
    from kfp_gpu_rehearsal.sim.mig import Instance, PoolRuntime
    from kfp_gpu_rehearsal.sim.scenario import PoolSpec

Key = tuple[str, str]  # (zone, name)
Book = dict[Key, dict[str, Any]]
EXHAUSTED_CODE = "RESOURCE_EXHAUSTED"  # the status of GKE's 429 answer carrying the message below


def make(project: str, zone: str, name: str, body: dict[str, Any], *, accelerator: str, gpus_per_vm: int,
         count: int, machine: str, specific: bool, in_use: int = 0) -> dict[str, Any]:
    """A reservation as Compute stores it (``body`` is the insert request) plus the private fields."""
    base = f"{shapes.COMPUTE}/projects/{project}/zones/{zone}"
    sr = dict(body.get("specificReservation") or {})
    res = dict(body)
    res.update({
        "kind": "compute#reservation", "id": shapes.next_id(), "name": name, "zone": base,
        "selfLink": f"{base}/reservations/{name}", "status": "READY", "creationTimestamp": shapes.now_rfc3339(),
        "specificReservationRequired": specific,
        "specificReservation": {**sr, "count": str(count), "inUseCount": str(in_use)},
        "_metric": accelerators.get(accelerator).gcp_quota_metric if accelerator else "",
        "_acc": accelerator, "_gpus_per_vm": gpus_per_vm, "_gpus": count * gpus_per_vm, "_machine": machine,
        "_count": count, "_external": in_use, "_held": set(), "_created": set(),
    })
    return res


def from_spec(project: str, r: ReservationSpec) -> dict[str, Any]:
    """A scenario reservation as it exists when the world starts."""
    acc = accelerators.get(r.accelerator)
    body = {"name": r.name, "specificReservation": {"instanceProperties": {
        "machineType": r.machine_type,
        "guestAccelerators": [{"acceleratorType": acc.gke_label, "acceleratorCount": r.gpus_per_node}]}}}
    return make(project, r.zone, r.name, body, accelerator=acc.name, gpus_per_vm=r.gpus_per_node, count=r.count,
                machine=r.machine_type, specific=r.specific, in_use=r.in_use)


def public(res: dict[str, Any]) -> dict[str, Any]:
    """The reservation as the API renders it (``inUseCount`` as of now)."""
    out = {k: v for k, v in res.items() if not k.startswith("_")}
    out["specificReservation"] = {**res["specificReservation"],
                                  "inUseCount": str(res["_external"] + len(res["_created"]))}
    return out


def free(res: dict[str, Any]) -> int:
    """Reserved VMs no VM holds yet (count - in use - planned)."""
    return int(res["_count"]) - int(res["_external"]) - len(res["_held"])


def matches(res: dict[str, Any], zone: str, pool: PoolSpec) -> bool:
    """A VM of ``pool`` has the reservation's properties (zone, machine type, accelerators); Spot VMs never
    consume reservations."""
    return (not pool.spot and zone == pool.zone and res["_machine"] == pool.machine_type
            and res["_acc"] == pool.accelerator and res["_gpus_per_vm"] == pool.gpus_per_node)


def candidates(book: Book, pool: PoolSpec) -> list[Key]:
    """The reservations a VM of ``pool`` may consume, in the order Compute tries them (by name)."""
    aff = pool.reservation_affinity
    kind = aff.effective
    if kind == "none" or pool.spot:
        return []
    keys = sorted(k for k, r in book.items() if matches(r, k[0], pool))
    if kind == "specific":
        return [k for k in keys if k[1] in aff.values]
    return [k for k in keys if not book[k]["specificReservationRequired"]]


def earmark(book: Book, pool: PoolSpec, inst: Instance) -> None:
    """Give ``inst`` a free slot of the first reservation it may consume (no-op when it has one or none is
    free)."""
    if inst.reservation is not None:
        return
    for key in candidates(book, pool):
        if free(book[key]) > 0:
            book[key]["_held"].add(inst.name)
            inst.reservation = key
            return


def created(book: Book, inst: Instance) -> None:
    """``inst``'s VM now exists: its slot counts in ``inUseCount``."""
    if inst.reservation is not None and inst.reservation in book:
        book[inst.reservation]["_created"].add(inst.name)


def release(book: Book, inst: Instance) -> None:
    """``inst``'s VM is gone (or is no longer planned): its slot is free again."""
    if inst.reservation is not None and inst.reservation in book:
        book[inst.reservation]["_held"].discard(inst.name)
        book[inst.reservation]["_created"].discard(inst.name)
    inst.reservation = None


def free_for(book: Book, pool: PoolSpec) -> int:
    """Free reserved VMs ``pool``'s new VMs may take (for the quota check of a resize)."""
    return sum(free(book[k]) for k in candidates(book, pool))


def adopt(book: Book, key: Key, pools: Iterable[PoolRuntime]) -> int:
    """A new automatic reservation is consumed at once by running VMs that match it and hold none (Compute:
    existing VMs with affinity ANY consume a matching reservation). Returns how many it took."""
    res, taken = book[key], 0
    if res["specificReservationRequired"]:
        return 0
    for p in pools:
        if p.spec.reservation_affinity.effective != "any" or not matches(res, key[0], p.spec):
            continue
        for inst in p.instances.values():
            if free(res) <= 0:
                return taken
            if inst.reservation is None and inst.state != "creating":
                inst.reservation = key
                res["_held"].add(inst.name)
                res["_created"].add(inst.name)
                taken += 1
    return taken


def forget(book: Book, key: Key, pools: Iterable[PoolRuntime]) -> None:
    """The reservation is deleted: the VMs that consumed it keep running, outside any reservation."""
    for p in pools:
        for inst in p.instances.values():
            if inst.reservation == key:
                inst.reservation = None
    book.pop(key, None)


def exhausted_item(pool: PoolSpec) -> dict[str, Any]:
    """The listErrors error of a VM of a SPECIFIC pool whose reservations have no VM free (GKE's wording,
    docs/sim.md "Reservations")."""
    names = ", ".join(pool.reservation_affinity.values)
    return {"code": EXHAUSTED_CODE, "message": (
        f'Reservation does not have enough resources for the request: specific reservation "{names}" is '
        f'insufficient for node pool "{pool.name}" at zone "{pool.zone}": required 1 and short of 1 VM count '
        f"of machine type {pool.machine_type}.")}


def affinity_json(pool: PoolSpec) -> dict[str, Any] | None:
    """nodePools.get ``config.reservationAffinity``; None (not rendered) when the pool sets none."""
    aff = pool.reservation_affinity
    if not aff.consume:
        return None
    out: dict[str, Any] = {"consumeReservationType": AFFINITY_TYPES[aff.consume]}
    if aff.values:
        out.update(key=RESERVATION_NAME_KEY, values=list(aff.values))
    return out
