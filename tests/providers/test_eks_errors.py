"""The EKS error -> scope table, one case per AWS error code, through real botocore calls whose
responses are injected with a before-send hook (no mocks of our own code)."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from botocore.awsrequest import AWSResponse
from botocore.config import Config

from kfp_gpu.errors import (
    CapacityUnavailable,
    CloudError,
    KfpGpuError,
    NotFound,
    PermissionDenied,
    QuotaExceeded,
    RateLimited,
    Scope,
    TransientCloudError,
)
from kfp_gpu.ownership import Owner
from kfp_gpu.providers.base import PoolRef, ReservationRequest
from kfp_gpu.providers.eks import ERROR_TABLE, FAIL_FAST, EksProvider

OWNER = Owner("run-1", "warm-pool", 2_000_000_000.0)
EMPTY = ('<DescribeCapacityReservationsResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/">'
         "<capacityReservationSet/></DescribeCapacityReservationsResponse>")

EXPECTED: dict[str, tuple[type[KfpGpuError], Scope]] = {
    "InsufficientInstanceCapacity": (CapacityUnavailable, Scope.ZONE),
    "UnfulfillableCapacity": (CapacityUnavailable, Scope.ZONE),
    "InsufficientCapacity": (CapacityUnavailable, Scope.ZONE),
    "VcpuLimitExceeded": (QuotaExceeded, Scope.REGION),
    "MaxSpotInstanceCountExceeded": (QuotaExceeded, Scope.REGION),
    "InstanceLimitExceeded": (QuotaExceeded, Scope.REGION),
    "UnauthorizedOperation": (PermissionDenied, Scope.PROVIDER),
    "AuthFailure": (PermissionDenied, Scope.PROVIDER),
    "AccessDenied": (PermissionDenied, Scope.PROVIDER),
    "AccessDeniedException": (PermissionDenied, Scope.PROVIDER),
    "UnrecognizedClientException": (PermissionDenied, Scope.PROVIDER),
    "InvalidClientTokenId": (PermissionDenied, Scope.PROVIDER),
    "ExpiredToken": (PermissionDenied, Scope.PROVIDER),
    "ExpiredTokenException": (PermissionDenied, Scope.PROVIDER),
    "SignatureDoesNotMatch": (PermissionDenied, Scope.PROVIDER),
    "RequestLimitExceeded": (RateLimited, Scope.NONE),
    "Throttling": (RateLimited, Scope.NONE),
    "ThrottlingException": (RateLimited, Scope.NONE),
    "TooManyRequestsException": (RateLimited, Scope.NONE),
    "ServiceUnavailable": (TransientCloudError, Scope.NONE),
    "ServiceUnavailableException": (TransientCloudError, Scope.NONE),
    "InternalError": (TransientCloudError, Scope.NONE),
    "ResourceInUseException": (TransientCloudError, Scope.NONE),
    "ResourceNotFoundException": (NotFound, Scope.ZONE),
    "NoSuchResourceException": (NotFound, Scope.REGION),
    "InvalidCapacityReservationId.NotFound": (NotFound, Scope.ZONE),
    "InvalidSubnetID.NotFound": (NotFound, Scope.ZONE),
}


class _Raw:
    def __init__(self, body: bytes) -> None:
        self.body = body

    def stream(self, **_: Any) -> Iterator[bytes]:
        yield self.body


def respond(status: int, body: str, headers: dict[str, str] | None = None) -> AWSResponse:
    return AWSResponse("http://stub", status, headers or {}, _Raw(body.encode()))  # type: ignore[arg-type]


def provider_with(responses: list[AWSResponse], service: str = "ec2") -> EksProvider:
    session = boto3.session.Session(aws_access_key_id="k", aws_secret_access_key="s")

    def factory(svc: str, region: str) -> Any:
        c = session.client(svc, region_name=region, endpoint_url="http://127.0.0.1:9", config=Config(**FAIL_FAST))
        if svc == service:
            c.meta.events.register(f"before-send.{svc}", lambda **_: responses.pop(0))
        return c

    return EksProvider("c", "us-east-1", client_factory=factory)


def test_every_table_row_is_tested() -> None:
    assert set(EXPECTED) == set(ERROR_TABLE)


@pytest.mark.parametrize("code", sorted(EXPECTED))
def test_ec2_error_code_is_classified(code: str) -> None:
    status = 500 if code in {"InsufficientInstanceCapacity", "InternalError"} else 400
    body = (f"<Response><Errors><Error><Code>{code}</Code><Message>verbatim {code}</Message></Error></Errors>"
            "<RequestID>r</RequestID></Response>")
    p = provider_with([respond(200, EMPTY), respond(status, body)])
    with pytest.raises(KfpGpuError) as ei:
        p.reserve(ReservationRequest("r", "us-east-1a", "a100-80gb", 8, 1), OWNER)
    cls, scope = EXPECTED[code]
    assert type(ei.value) is cls and ei.value.scope is scope
    assert f"verbatim {code}" in ei.value.message and ei.value.fields["code"] == code
    assert ei.value.transient == (scope is Scope.NONE)


def test_access_denied_names_the_iam_action_to_grant() -> None:
    body = json.dumps({"message": "User is not authorized to perform eks:UpdateNodegroupConfig"})
    ng = json.dumps({"nodegroup": {"nodegroupName": "g", "scalingConfig": {"minSize": 0, "maxSize": 4, "desiredSize": 0}}})
    p = provider_with([respond(200, ng), respond(403, body, {"x-amzn-ErrorType": "AccessDeniedException"})], "eks")
    with pytest.raises(PermissionDenied) as ei:
        p.resize(PoolRef("g", "us-east-1a", "us-east-1"), 2, OWNER)
    assert "eks:UpdateNodegroupConfig" in ei.value.message
    assert "add eks:UpdateNodegroupConfig to the Allow statements of deploy/aws-policy.json" in ei.value.remediation


def test_access_denied_prefix_variants() -> None:
    body = "<Response><Errors><Error><Code>AccessDenied.Foo</Code><Message>m</Message></Error></Errors></Response>"
    p = provider_with([respond(200, EMPTY), respond(403, body)])
    with pytest.raises(PermissionDenied, match="ec2:CreateCapacityReservation"):
        p.reserve(ReservationRequest("r", "us-east-1a", "a100-80gb", 8, 1), OWNER)


@pytest.mark.parametrize(("status", "cls"), [(429, RateLimited), (503, TransientCloudError)])
def test_http_status_without_known_code_is_transient(status: int, cls: type[KfpGpuError]) -> None:
    body = "<Response><Errors><Error><Code>SomethingNew</Code><Message>m</Message></Error></Errors></Response>"
    p = provider_with([respond(200, EMPTY), respond(status, body)])
    with pytest.raises(cls):
        p.reserve(ReservationRequest("r", "us-east-1a", "a100-80gb", 8, 1), OWNER)


def test_unrecognised_error_is_cloud_error_narrowest_scope_verbatim_logged(caplog: pytest.LogCaptureFixture) -> None:
    body = "<Response><Errors><Error><Code>Weird.Thing</Code><Message>the exact words</Message></Error></Errors></Response>"
    p = provider_with([respond(200, EMPTY), respond(400, body)])
    with caplog.at_level(logging.WARNING), pytest.raises(CloudError) as ei:
        p.reserve(ReservationRequest("r", "us-east-1a", "a100-80gb", 8, 1), OWNER)
    assert ei.value.scope is Scope.ZONE and "the exact words" in ei.value.message
    assert "Weird.Thing" in caplog.text


def test_non_http_errors() -> None:
    from botocore.exceptions import EndpointConnectionError, NoCredentialsError

    p = EksProvider("c", "us-east-1", client_factory=lambda s, r: None)
    assert isinstance(p.classify(NoCredentialsError()), PermissionDenied)
    assert isinstance(p.classify(EndpointConnectionError(endpoint_url="http://x")), TransientCloudError)
    assert isinstance(p.classify(ValueError("odd"), region="us-east-1"), CloudError)
