"""EC2 capacity reservations and Capacity Block offerings for :class:`EksProvider`.

Reservations are tagged with the owner labels plus ``Name`` and end at the owner's lease expiry, so a
forgotten one expires on its own; re-reserving the same name for the same run re-attaches. They are
``open`` (InstanceMatchCriteria): instances of the matching type in that zone whose launch preference is
``open`` (EC2's default) run in them, so the nodes a resize then adds are the reserved ones, not extra.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from typing import Any

from kfp_gpu import accelerators
from kfp_gpu.errors import CloudError, NotFound
from kfp_gpu.ownership import LABEL_MANAGED, LABEL_RUN_ID, Owner, label_safe
from kfp_gpu.providers.base import Operation, OpStatus, OwnedResource, ReservationRequest

CR_STATUS = {"active": OpStatus.DONE, "pending": OpStatus.RUNNING, "failed": OpStatus.FAILED,
              "cancelled": OpStatus.DONE, "expired": OpStatus.DONE, "payment-pending": OpStatus.RUNNING}


def token(*parts: object) -> str:
    """A deterministic idempotency token (AWS ClientToken / clientRequestToken) from the owner."""
    return hashlib.sha256("/".join(map(str, parts)).encode()).hexdigest()[:48]


def _tags(d: dict[str, str]) -> list[dict[str, str]]:
    return [{"Key": k, "Value": v} for k, v in d.items()]


def _untag(tags: list[dict[str, str]] | None) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in tags or []}


class ReservationsMixin:
    """Needs ``region`` and ``_call`` from the provider class."""

    region: str

    def _call(self, service: str, op: str, *, region: str = "", zone: str = "", what: str = "", **kw: Any) -> Any:
        raise NotImplementedError

    # ---- reservations ----------------------------------------------------------------------
    def _reservations(self, region: str, filters: list[dict[str, Any]]) -> list[dict[str, Any]]:
        filters = [*filters, {"Name": "state", "Values": ["pending", "active", "payment-pending"]}]
        resp = self._call("ec2", "describe_capacity_reservations", region=region, Filters=filters)
        return list(resp.get("CapacityReservations", []))

    def reserve(self, req: ReservationRequest, owner: Owner) -> Operation:
        """Create (or re-attach to) capacity reservation ``req.name`` ending at the owner's lease.

        Raises: CapacityUnavailable (InsufficientInstanceCapacity), QuotaExceeded, PermissionDenied
        (ec2:CreateCapacityReservation), CloudError (name taken by another run).
        """
        region = req.zone[:-1]
        shape = accelerators.get(req.accelerator).aws_instance_for(req.gpus_per_node)
        labels = owner.labels()
        for cr in self._reservations(region, [{"Name": "tag:Name", "Values": [req.name]}]):
            other = _untag(cr.get("Tags")).get(LABEL_RUN_ID)
            if other != labels[LABEL_RUN_ID]:
                raise CloudError(f"capacity reservation {req.name!r} belongs to run {other!r}", zone=req.zone)
            status = CR_STATUS.get(cr.get("State", ""), OpStatus.RUNNING)
            return Operation(f"{region}|{cr['CapacityReservationId']}", "reserve", req.name, status)
        resp = self._call(
            "ec2", "create_capacity_reservation", region=region, zone=req.zone,
            what=f"reserve {req.count} x {shape.name} in {req.zone}",
            InstanceType=req.machine_type or shape.name, InstancePlatform="Linux/UNIX", AvailabilityZone=req.zone,
            # open: the node group's matching instances (launch preference "open", EC2's default) run in it
            InstanceCount=req.count, InstanceMatchCriteria="open", EndDateType="limited",
            EndDate=dt.datetime.fromtimestamp(owner.lease_expires, tz=dt.timezone.utc),
            ClientToken=token(owner.run_id, owner.step, req.name),
            TagSpecifications=[{"ResourceType": "capacity-reservation",
                                "Tags": _tags({"Name": req.name, **labels})}],
        )
        cr = resp["CapacityReservation"]
        status = CR_STATUS.get(cr.get("State", ""), OpStatus.RUNNING)
        return Operation(f"{region}|{cr['CapacityReservationId']}", "reserve", req.name, status)

    def release(self, owner_run_id: str) -> list[str]:
        """Cancel every capacity reservation tagged with the run id. Already-gone ones are skipped.

        Raises: PermissionDenied (ec2:CancelCapacityReservation), TransientCloudError.
        """
        run = label_safe(owner_run_id)
        out = []
        for cr in self._reservations(self.region, [{"Name": f"tag:{LABEL_RUN_ID}", "Values": [run]}]):
            try:
                self._call("ec2", "cancel_capacity_reservation", CapacityReservationId=cr["CapacityReservationId"])
            except NotFound:
                continue
            out.append(_untag(cr.get("Tags")).get("Name", cr["CapacityReservationId"]))
        return out

    def list_owned(self, run_id: str | None = None) -> list[OwnedResource]:
        """Live capacity reservations kfp-gpu created (for ``run_id`` when given).

        Raises: PermissionDenied, TransientCloudError.
        """
        flt = ({"Name": f"tag:{LABEL_RUN_ID}", "Values": [label_safe(run_id)]} if run_id is not None
               else {"Name": "tag-key", "Values": [LABEL_MANAGED]})
        return [
            OwnedResource("capacity-reservation", _untag(cr.get("Tags")).get("Name", cr["CapacityReservationId"]),
                          cr.get("AvailabilityZone", ""), _untag(cr.get("Tags")))
            for cr in self._reservations(self.region, [flt])
        ]

    def capacity_block_offerings(
        self, accelerator: str, gpus_per_node: int, count: int, hours: int,
        *, start: dt.datetime | None = None, end: dt.datetime | None = None,
    ) -> list[dict[str, Any]]:
        """EC2 Capacity Block offerings for ``count`` instances for ``hours`` hours, cheapest first.

        Raises: InvalidSpec (no such instance shape), PermissionDenied
        (ec2:DescribeCapacityBlockOfferings), CloudError.
        """
        shape = accelerators.get(accelerator).aws_instance_for(gpus_per_node)
        kw: dict[str, Any] = {"InstanceType": shape.name, "InstanceCount": count, "CapacityDurationHours": hours}
        if start is not None:
            kw["StartDateRange"] = start
        if end is not None:
            kw["EndDateRange"] = end
        resp = self._call("ec2", "describe_capacity_block_offerings", **kw)
        offers = [
            {"id": o.get("CapacityBlockOfferingId"), "zone": o.get("AvailabilityZone"),
             "instance_type": o.get("InstanceType"), "count": o.get("InstanceCount"),
             "start": str(o.get("StartDate", "")), "end": str(o.get("EndDate", "")),
             "upfront_fee": float(o.get("UpfrontFee", "nan")), "currency": o.get("CurrencyCode", "USD")}
            for o in resp.get("CapacityBlockOfferings", [])
        ]
        return sorted(offers, key=lambda o: o["upfront_fee"])
