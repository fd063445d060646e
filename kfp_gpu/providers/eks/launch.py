"""The capacity reservation a managed node group's instances launch into, from its launch template.

A node group built from a launch template carries the template's ``CapacityReservationSpecification``:
``CapacityReservationTarget`` (a Capacity Reservation id, a Capacity Block's reservation id, or a
reservation resource group ARN) makes the group "specific" - its instances run only in that reservation -
and ``CapacityReservationPreference`` is ``open`` (any matching open reservation, EC2's default: "any"),
``none`` or ``capacity-reservations-only``.
https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_LaunchTemplateCapacityReservationSpecificationRequest.html
https://docs.aws.amazon.com/eks/latest/userguide/capacity-blocks-mng.html

The template's ``Placement.GroupName`` says where the group's instances land (:func:`placement`): a placement group
of strategy ``cluster`` packs them "close together inside an Availability Zone"; without one (or with a ``spread``
or ``partition`` group) EC2 spreads instances across its hardware.
https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/placement-strategies.html
https://docs.aws.amazon.com/eks/latest/userguide/launch-templates.html
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

from kfp_gpu.errors import KfpGpuError

log = logging.getLogger(__name__)
PREFERENCE = {"open": "any", "none": "none", "capacity-reservations-only": "specific"}


class _Caller(Protocol):
    def _call(self, service: str, op: str, *, region: str = "", zone: str = "", what: str = "", **kw: Any) -> Any: ...


def template_data(p: _Caller, group: dict[str, Any], region: str) -> dict[str, Any] | None:
    """The ``LaunchTemplateData`` of the version ``group`` (a DescribeNodegroup answer) was built from; None when it
    has none or the template cannot be read (logged). One DescribeLaunchTemplateVersions. Raises: nothing."""
    lt = group.get("launchTemplate") or {}
    if not (lt.get("id") or lt.get("name")):
        return None
    ref = {"LaunchTemplateId": lt["id"]} if lt.get("id") else {"LaunchTemplateName": lt["name"]}
    try:
        resp = p._call("ec2", "describe_launch_template_versions", region=region,
                       Versions=[str(lt.get("version") or "$Default")], **ref)
    except KfpGpuError as exc:
        log.warning("cannot read launch template %s of node group %s: %s", lt, group.get("nodegroupName"), exc)
        return None
    versions = resp.get("LaunchTemplateVersions") or [{}]
    return dict(versions[0].get("LaunchTemplateData") or {})


def reservation_target(p: _Caller, data: dict[str, Any] | None, region: str
                       ) -> tuple[str, tuple[str, ...], int | None]:
    """(affinity, reservation ids/ARNs, free instances of the targeted reservations) of a node group's launch
    template ``data`` (:func:`template_data`). ("", (), None) when it has no template or the template sets nothing.
    Raises: nothing."""
    if data is None:
        return "", (), None
    spec = data.get("CapacityReservationSpecification") or {}
    target = spec.get("CapacityReservationTarget") or {}
    ids = tuple(str(v) for v in (target.get("CapacityReservationId"), target.get("CapacityReservationResourceGroupArn"))
                if v)
    if not ids:
        return PREFERENCE.get(str(spec.get("CapacityReservationPreference", "")), ""), (), None
    return "specific", ids, _free(p, ids, region)


def placement(p: _Caller, data: dict[str, Any] | None, region: str) -> tuple[str, str]:
    """(placement, placement group) of a node group's launch template ``data``: ("compact", name) when its
    ``Placement.GroupName`` (or ``GroupId``) is a placement group of strategy ``cluster``; ("spread", name or "")
    otherwise (no template, no group, a ``spread``/``partition`` group: EC2 spreads the instances); ("", name)
    when the group cannot be described (ec2:DescribePlacementGroups refused or failed: logged). Raises: nothing."""
    where = (data or {}).get("Placement") or {}
    name, gid = str(where.get("GroupName") or ""), str(where.get("GroupId") or "")
    if not (name or gid):
        return "spread", ""
    which: dict[str, Any] = {"GroupNames": [name]} if name else {"GroupIds": [gid]}
    try:
        resp = p._call("ec2", "describe_placement_groups", region=region, **which)
    except KfpGpuError as exc:
        log.warning("cannot read placement group %s: %s", name or gid, exc)
        return "", name or gid
    found = [g for g in resp.get("PlacementGroups") or [] if g.get("GroupName") == name or g.get("GroupId") == gid]
    if not found:
        return "", name or gid
    return ("compact" if found[0].get("Strategy") == "cluster" else "spread"), str(found[0].get("GroupName") or name)


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
