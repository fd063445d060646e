"""The capacity reservation a managed node group's instances launch into, from its launch template.

A node group built from a launch template carries the template's ``CapacityReservationSpecification``:
``CapacityReservationTarget`` (a Capacity Reservation id, a Capacity Block's reservation id, or a
reservation resource group ARN) makes the group "specific" - its instances run only in that reservation -
and ``CapacityReservationPreference`` is ``open`` (any matching open reservation, EC2's default: "any"),
``none`` or ``capacity-reservations-only``.
https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_LaunchTemplateCapacityReservationSpecificationRequest.html
https://docs.aws.amazon.com/eks/latest/userguide/capacity-blocks-mng.html
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

from kfp_gpu.errors import KfpGpuError

log = logging.getLogger(__name__)
PREFERENCE = {"open": "any", "none": "none", "capacity-reservations-only": "specific"}


class _Caller(Protocol):
    def _call(self, service: str, op: str, *, region: str = "", zone: str = "", what: str = "", **kw: Any) -> Any: ...


def reservation_target(p: _Caller, group: dict[str, Any], region: str) -> tuple[str, tuple[str, ...], int | None]:
    """(affinity, reservation ids/ARNs, free instances of the targeted reservations) of ``group``.
    ("", (), None) when it has no launch template or the template sets nothing. Best effort: a template
    that cannot be read is logged and reported as not set. Raises: nothing."""
    lt = group.get("launchTemplate") or {}
    if not (lt.get("id") or lt.get("name")):
        return "", (), None
    ref = {"LaunchTemplateId": lt["id"]} if lt.get("id") else {"LaunchTemplateName": lt["name"]}
    try:
        resp = p._call("ec2", "describe_launch_template_versions", region=region,
                       Versions=[str(lt.get("version") or "$Default")], **ref)
    except KfpGpuError as exc:
        log.warning("cannot read launch template %s of node group %s: %s", lt, group.get("nodegroupName"), exc)
        return "", (), None
    versions = resp.get("LaunchTemplateVersions") or [{}]
    spec = (versions[0].get("LaunchTemplateData") or {}).get("CapacityReservationSpecification") or {}
    target = spec.get("CapacityReservationTarget") or {}
    ids = tuple(str(v) for v in (target.get("CapacityReservationId"), target.get("CapacityReservationResourceGroupArn"))
                if v)
    if not ids:
        return PREFERENCE.get(str(spec.get("CapacityReservationPreference", "")), ""), (), None
    return "specific", ids, _free(p, ids, region)


def _free(p: _Caller, ids: tuple[str, ...], region: str) -> int | None:
    """AvailableInstanceCount summed over the targeted Capacity Reservations; None when unknown (a resource
    group, or an answer without the count)."""
    cr_ids = [i for i in ids if i.startswith("cr-")]
    if len(cr_ids) != len(ids):
        return None
    try:
        resp = p._call("ec2", "describe_capacity_reservations", region=region, CapacityReservationIds=cr_ids)
    except KfpGpuError as exc:
        log.warning("cannot read capacity reservations %s: %s", cr_ids, exc)
        return None
    counts = [c.get("AvailableInstanceCount") for c in resp.get("CapacityReservations", [])]
    if not counts or any(c is None for c in counts):
        return None
    return sum(int(c) for c in counts)
