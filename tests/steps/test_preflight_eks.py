"""Preflight through the real EksProvider: Service Quotas via Stubber, EC2/EKS answered by a
before-send hook keyed on the API action (so concurrent calls need no ordering)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qs

import boto3
import pytest
from botocore.awsrequest import AWSResponse
from botocore.config import Config
from botocore.stub import Stubber

from kfp_gpu.errors import QuotaExceeded
from kfp_gpu.plan.quota import Verdict
from kfp_gpu.providers.eks import FAIL_FAST, EksProvider
from kfp_gpu.spec import ProvisioningSpec, Target, TargetKind
from kfp_gpu.steps.preflight import check, run_preflight

NS = 'xmlns="http://ec2.amazonaws.com/doc/2016-11-15/"'


class _Raw:
    def __init__(self, body: bytes) -> None:
        self.body = body

    def stream(self, **_: Any) -> Iterator[bytes]:
        yield self.body


def ok(body: str) -> AWSResponse:
    return AWSResponse("http://stub", 200, {}, _Raw(body.encode()))  # type: ignore[arg-type]


def ec2_hook(request: Any, **_: Any) -> AWSResponse:
    action = parse_qs(request.body.decode() if isinstance(request.body, bytes) else request.body)["Action"][0]
    if action == "DescribeSubnets":
        return ok(f"<DescribeSubnetsResponse {NS}><subnetSet><item><subnetId>subnet-a</subnetId>"
                  "<availabilityZone>us-east-1a</availabilityZone></item></subnetSet></DescribeSubnetsResponse>")
    assert action == "DescribeInstances"
    items = "".join(
        f"<item><instanceId>i-{i}</instanceId><instanceType>p5.48xlarge</instanceType></item>" for i in range(2)
    )
    return ok(f"<DescribeInstancesResponse {NS}><reservationSet><item><reservationId>r-1</reservationId>"
              f"<instancesSet>{items}</instancesSet></item></reservationSet></DescribeInstancesResponse>")


def eks_hook(request: Any, **_: Any) -> AWSResponse:
    path = request.url.split("amazonaws.com", 1)[-1].split("?")[0]
    if path == "/clusters/c":
        return ok(json.dumps({"cluster": {"name": "c", "status": "ACTIVE"}}))
    if path == "/clusters/c/node-groups":
        return ok(json.dumps({"nodegroups": ["h100-a"]}))
    return ok(json.dumps({"nodegroup": {
        "nodegroupName": "h100-a", "instanceTypes": ["p5.48xlarge"], "capacityType": "ON_DEMAND",
        "subnets": ["subnet-a"], "scalingConfig": {"minSize": 0, "maxSize": 4, "desiredSize": 0}}}))


def provider(quota_value: float) -> EksProvider:
    session = boto3.session.Session(aws_access_key_id="k", aws_secret_access_key="s")
    sq = session.client("service-quotas", region_name="us-east-1", config=Config(**FAIL_FAST))
    stub = Stubber(sq)
    stub.add_response("get_service_quota", {"Quota": {"QuotaCode": "L-417A185B", "Value": quota_value}})
    stub.activate()

    def factory(service: str, region: str) -> Any:
        if service == "service-quotas":
            return sq
        c = session.client(service, region_name=region, config=Config(**FAIL_FAST))
        c.meta.events.register(f"before-send.{service}", ec2_hook if service == "ec2" else eks_hook)
        return c

    return EksProvider("c", "us-east-1", client_factory=factory)


SPEC = ProvisioningSpec("h100-80gb", nodes=2, target=Target(kind=TargetKind.EKS, cluster="c", region="us-east-1"))


def test_eks_preflight_fits_in_vcpus() -> None:
    res = run_preflight(SPEC, provider(1152.0))
    assert res.ok
    (p,) = res.placements
    (c,) = p.checks
    assert (p.zone, c.metric, c.unit, c.needed, c.free) == ("us-east-1a", "L-417A185B", "vcpus", 384.0, 768.0)
    assert "servicequotas" in res.to_markdown()


def test_eks_preflight_short_in_vcpus() -> None:
    res = run_preflight(SPEC, provider(576.0))  # 384 in use, 192 free < 384 needed
    assert res.verdict is Verdict.SHORT
    with pytest.raises(QuotaExceeded) as ei:
        check(res)
    assert "L-417A185B@us-east-1 short by 192 vcpus" in ei.value.message
    assert "lead time 3 days" in ei.value.remediation
