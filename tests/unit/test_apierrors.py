"""The one classifier of Kubernetes API errors (kfp_gpu.cluster.apierrors), over real ApiException objects: pure,
no cluster, virtual time."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
import urllib3
from kubernetes.client.exceptions import ApiException

from kfp_gpu.cluster import apierrors
from kfp_gpu.cluster.apierrors import Conflict, NotFound, Permanent, Transient, classify
from kfp_gpu.errors import CrdMissing, KfpGpuError, PermissionDenied, RateLimited, TransientCloudError
from kfp_gpu.retry import RetryPolicy


class _Resp:
    """An HTTP answer as urllib3 hands it to ApiException(http_resp=...)."""

    def __init__(self, status: int, reason: str, body: dict[str, Any] | None = None,
                 headers: dict[str, str] | None = None) -> None:
        self.status, self.reason = status, reason
        self.data = json.dumps(body).encode() if body is not None else b""
        self._headers = urllib3.HTTPHeaderDict(headers or {})

    def getheaders(self) -> urllib3.HTTPHeaderDict:
        return self._headers


def api_exc(status: int, reason: str = "", body: dict[str, Any] | None = None,
            headers: dict[str, str] | None = None) -> ApiException:
    return ApiException(http_resp=_Resp(status, reason, body, headers))


def test_429_with_retry_after_is_transient_with_the_servers_floor() -> None:
    v = classify(api_exc(429, "Too Many Requests", {"message": "too many requests"}, {"Retry-After": "3"}))
    assert v == Transient(429, "Too Many Requests", 3.0)


def test_retry_after_header_is_case_insensitive_and_http_date_is_accepted() -> None:
    v = classify(api_exc(503, "Service Unavailable", headers={"retry-after": "Wed, 21 Oct 2099 07:28:00 GMT"}))
    assert isinstance(v, Transient) and v.retry_after_s is not None and v.retry_after_s > 86400


def test_retry_after_from_the_status_body_when_no_header() -> None:
    body = {"kind": "Status", "reason": "ServerTimeout", "message": "the server cannot complete the requested "
            "operation at this time, try again later", "details": {"retryAfterSeconds": 2}, "code": 500}
    assert classify(api_exc(500, "Internal Server Error", body)) == Transient(500, "Internal Server Error", 2.0)


@pytest.mark.parametrize("status", [500, 502, 503, 504])
def test_5xx_are_transient(status: int) -> None:
    v = classify(api_exc(status, "x"))
    assert isinstance(v, Transient) and v.retry_after_s is None


def test_no_http_answer_and_transport_errors_are_transient() -> None:
    assert isinstance(classify(ApiException(status=0, reason="no answer")), Transient)
    pool = urllib3.HTTPConnectionPool("127.0.0.1", 1)
    for exc in (urllib3.exceptions.ReadTimeoutError(pool, "/api", "Read timed out."),
                urllib3.exceptions.MaxRetryError(pool, "/api", urllib3.exceptions.NewConnectionError(
                    pool, "Connection refused")),
                urllib3.exceptions.ProtocolError("Connection aborted."),
                ConnectionRefusedError(111, "Connection refused"), TimeoutError()):
        assert isinstance(classify(exc), Transient), exc


def test_404_and_409_have_their_own_classes() -> None:
    assert classify(api_exc(404, "Not Found")) == NotFound(404, "Not Found")
    assert classify(api_exc(409, "Conflict", {"reason": "AlreadyExists"})) == Conflict(409, "Conflict")


@pytest.mark.parametrize("status", [400, 410, 422])
def test_other_4xx_are_permanent(status: int) -> None:
    v = classify(api_exc(status, "x"))
    assert isinstance(v, Permanent) and v.refusal is None


def test_rbac_refusal_is_permanent_and_carries_a_one_line_permission_error() -> None:
    body = {"message": 'nodes is forbidden: User "x" cannot list resource "nodes" in API group "" at the cluster scope'}
    v = classify(api_exc(403, "Forbidden", body))
    assert isinstance(v, Permanent) and isinstance(v.refusal, PermissionDenied)
    assert "cannot list resource" in str(v.refusal)


def test_a_bug_is_not_an_api_error() -> None:
    assert classify(ValueError("bad")) is None
    assert classify(KeyError("x")) is None


def test_to_error_makes_429_rate_limited_and_5xx_transient_with_retry_after() -> None:
    err = apierrors.to_error(api_exc(429, "Too Many Requests", {"message": "slow down"}, {"Retry-After": "4"}),
                             "create NodePool p")
    assert isinstance(err, RateLimited) and err.transient and err.fields["retry_after_s"] == 4.0
    assert err.message.startswith("create NodePool p:") and "slow down" in err.message
    err = apierrors.to_error(api_exc(503, "Service Unavailable"), "create ProvisioningRequest ns/r")
    assert isinstance(err, TransientCloudError) and err.transient and "retry_after_s" not in err.fields
    assert "answered 503" in err.message


def test_to_error_404_uses_the_callers_not_found_and_409_is_permanent() -> None:
    crd = CrdMissing("the cluster does not serve nodepools.karpenter.sh")
    assert apierrors.to_error(api_exc(404, "Not Found"), "x", not_found=lambda: crd) is crd
    err = apierrors.to_error(api_exc(409, "Conflict", {"message": "the object has been modified"}), "patch node n")
    assert type(err) is KfpGpuError and not err.transient and "409" in err.message and "modified" in err.message


def _flaky(answers: list[BaseException | str]) -> Any:
    def fn() -> str:
        a = answers.pop(0)
        if isinstance(a, BaseException):
            raise a
        return a
    return fn


def test_call_retries_transient_no_earlier_than_retry_after_then_succeeds() -> None:
    slept: list[float] = []
    now = [0.0]

    def sleep(s: float) -> None:
        slept.append(s)
        now[0] += s

    fn = _flaky([api_exc(429, "Too Many Requests", headers={"Retry-After": "2"}), api_exc(503, "x"), "ok"])
    assert apierrors.call(fn, "create x", clock=lambda: now[0], sleep=sleep, rng=random.Random(1)) == "ok"
    assert len(slept) == 2 and slept[0] >= 2.0


def test_call_raises_a_permanent_error_at_once_classified() -> None:
    calls: list[int] = []

    def fn() -> None:
        calls.append(1)
        raise api_exc(422, "Unprocessable Entity", {"message": "spec.limits: Invalid value"})

    with pytest.raises(KfpGpuError) as ei:
        apierrors.call(fn, "create NodePool p", sleep=lambda s: None)
    assert len(calls) == 1 and not ei.value.transient and "spec.limits: Invalid value" in str(ei.value)


def test_call_gives_up_on_a_persistent_503_within_its_bound_and_says_so() -> None:
    now = [0.0]

    def sleep(s: float) -> None:
        now[0] += s

    with pytest.raises(TransientCloudError) as ei:
        apierrors.call(_flaky([api_exc(503, "x")] * 10), "create x", policy=RetryPolicy(attempts=3, budget_s=100),
                       clock=lambda: now[0], sleep=sleep)
    assert ei.value.fields["attempts"] == 3 and "gave up after 3 attempts" in str(ei.value)


def test_call_lets_a_bug_through_unclassified() -> None:
    with pytest.raises(ZeroDivisionError):
        apierrors.call(lambda: 1 / 0, "x")


def test_a_step_leaks_no_bare_api_error_only_classified_ones() -> None:
    from kfp_gpu.steps.entry import _classified

    def throttled() -> Any:
        raise api_exc(429, "Too Many Requests", headers={"Retry-After": "1"})

    with pytest.raises(RateLimited) as ei:
        _classified(throttled, "scale-up")
    assert ei.value.transient and ei.value.to_dict()["transient"] is True and "step scale-up" in str(ei.value)

    def bug() -> Any:
        raise ValueError("a bug")

    with pytest.raises(ValueError):
        _classified(bug, "scale-up")
