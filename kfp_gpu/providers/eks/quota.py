"""EC2 vCPU quotas for :class:`~kfp_gpu.providers.eks.provider.EksProvider`: read a family's row, file an increase.

Contract: :func:`read` returns one :class:`~kfp_gpu.providers.base.QuotaAmount` in **vCPUs** for the accelerator's
family code (P/G, on-demand/spot): the limit from Service Quotas ``get_service_quota`` (the AWS default value
when the account has no applied value), the usage from the vCPUs of ``pending``/``running`` instances of that
family (``describe_instances``: exact and current; CloudWatch ``AWS/Usage`` lags by minutes and needs another
permission). A part that cannot be read makes the row ``unknown`` with the reason; missing credentials raise.
:func:`request_increase` files ``request_service_quota_increase``, returning a pending request for the same quota
instead of filing a second. The caller has checked the region.

https://docs.aws.amazon.com/servicequotas/2019-06-24/apireference/API_GetServiceQuota.html
https://docs.aws.amazon.com/servicequotas/2019-06-24/apireference/API_RequestServiceQuotaIncrease.html
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from kfp_gpu import accelerators, fanout
from kfp_gpu.errors import CloudError, InvalidSpec, KfpGpuError, NotFound, PermissionDenied
from kfp_gpu.providers.base import QuotaAmount
from kfp_gpu.providers.eks.errors import classify

if TYPE_CHECKING:
    from kfp_gpu.providers.eks.provider import EksProvider

__all__ = ["ACCELERATOR_OF", "LEAD_TIME_DAYS", "SHAPES", "read", "request_increase"]

log = logging.getLogger(__name__)

_P_CODES = {accelerators.AWS_QUOTA_P_ON_DEMAND, accelerators.AWS_QUOTA_P_SPOT}
_SPOT_CODES = {accelerators.AWS_QUOTA_P_SPOT, accelerators.AWS_QUOTA_G_SPOT}
SHAPES: dict[str, accelerators.MachineShape] = {}  # EC2 instance type -> its shape in the catalog
ACCELERATOR_OF: dict[str, str] = {}  # EC2 instance type -> catalog accelerator name
for _name in accelerators.names():
    for _shape in accelerators.get(_name).aws_instances:
        SHAPES[_shape.name] = _shape
        ACCELERATOR_OF[_shape.name] = _name
LEAD_TIME_DAYS = {"P": 3.0, "G": 1.0}  # typical approval times seen for GPU vCPU quota increases


def read(p: EksProvider, accelerator: str, region: str, *, spot: bool) -> list[QuotaAmount]:
    """The vCPU quota row of ``accelerator``'s family in ``region`` (see the module docstring).

    Raises: PermissionDenied (no credentials at all).
    """
    acc = accelerators.get(accelerator)
    code = acc.aws_quota_spot if spot else acc.aws_quota_on_demand
    family = "P" if code in _P_CODES else "G"
    raise_path = (
        f"https://{region}.console.aws.amazon.com/servicequotas/home/services/ec2/quotas/{code} "
        f"or `aws service-quotas request-service-quota-increase --service-code ec2 --quota-code {code} "
        f"--desired-value <vCPUs> --region {region}` or `kfp-gpu quota request`"
    )
    limit, usage = fanout.run_all([lambda: _quota_limit(p, code, region),
                                   lambda: _family_usage(p, family, code in _SPOT_CODES, region)])
    for r in (limit, usage):
        if isinstance(r, PermissionDenied) and r.fields.get("credentials_missing"):
            raise r
    lim = limit if isinstance(limit, float) else None
    use = usage if isinstance(usage, float) else None
    reasons = [str(r.message) for r in (limit, usage) if isinstance(r, KfpGpuError)]
    return [QuotaAmount(
        code, region, lim, use, unit="vcpus", status="unknown" if reasons else "ok",
        reason="; ".join(reasons), raise_path=raise_path, lead_time_days=LEAD_TIME_DAYS[family],
    )]


def _quota_limit(p: EksProvider, code: str, region: str) -> float | KfpGpuError:
    try:
        resp = p._call("service-quotas", "get_service_quota", region=region, ServiceCode="ec2", QuotaCode=code)
    except NotFound:
        try:
            resp = p._call("service-quotas", "get_aws_default_service_quota", region=region,
                           ServiceCode="ec2", QuotaCode=code)
        except KfpGpuError as exc:
            return exc
    except KfpGpuError as exc:
        return exc
    return float(resp["Quota"]["Value"])


def _family_usage(p: EksProvider, family: str, spot: bool, region: str) -> float | KfpGpuError:
    # Family matched client-side: instance-type wildcards are not honoured by every endpoint.
    prefixes = ("p",) if family == "P" else ("g", "vt")
    filters = [{"Name": "instance-state-name", "Values": ["pending", "running"]}]
    try:
        pager = p.client("ec2", region).get_paginator("describe_instances")
        instances = [
            i for page in pager.paginate(Filters=filters) for r in page.get("Reservations", [])
            for i in r.get("Instances", [])
        ]
        instances = [
            i for i in instances
            if str(i.get("InstanceType", "")).startswith(prefixes)
            and (i.get("InstanceLifecycle") == "spot") == spot
        ]
        return float(sum(_vcpus(p, i, region) for i in instances))
    except KfpGpuError as exc:
        return exc
    except Exception as exc:
        return classify(exc, region=region, action="ec2:DescribeInstances")


def _vcpus(p: EksProvider, inst: dict[str, Any], region: str) -> int:
    cpu = inst.get("CpuOptions") or {}
    if cpu.get("CoreCount"):
        return int(cpu["CoreCount"]) * int(cpu.get("ThreadsPerCore", 1))
    itype = str(inst["InstanceType"])
    if itype in SHAPES:
        return SHAPES[itype].vcpus
    resp = p._call("ec2", "describe_instance_types", region=region, InstanceTypes=[itype])
    return int(resp["InstanceTypes"][0]["VCpuInfo"]["DefaultVCpus"])


def request_increase(p: EksProvider, metric: str, region: str, value: float, justification: str) -> str:
    """File the increase of ``metric`` (an ec2 quota code) to ``value`` vCPUs; a pending one is returned instead.

    Raises: InvalidSpec (value not above the current limit), PermissionDenied, NotFound, CloudError.
    """
    current = _quota_limit(p, metric, region)
    if isinstance(current, KfpGpuError):
        raise current
    if value <= current:
        raise InvalidSpec("value", value, f"must be above the current {metric} limit {current:g} vCPUs in {region}")
    log.info("quota request %s %s -> %g: %s", metric, region, value, justification)
    try:
        resp = p._call("service-quotas", "request_service_quota_increase", region=region,
                       ServiceCode="ec2", QuotaCode=metric, DesiredValue=float(value))
    except CloudError as exc:
        if exc.fields.get("code") != "ResourceAlreadyExistsException":
            raise
        hist = p._call("service-quotas", "list_requested_service_quota_change_history_by_quota",
                       region=region, ServiceCode="ec2", QuotaCode=metric, Status="PENDING")
        pending = hist.get("RequestedQuotas", [])
        if not pending:
            raise
        return str(pending[0]["Id"])
    return str(resp["RequestedQuota"]["Id"])
