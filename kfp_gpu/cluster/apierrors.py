"""The one classifier of Kubernetes API errors, and the one conversion of them into kfp-gpu errors.

:func:`classify` reads an ``ApiException`` (or the urllib3/socket error the client raises when the server does not
answer) and says what it is:

- :class:`Transient`: 429 Too Many Requests (API Priority and Fairness), any 5xx (500 InternalError/ServerTimeout,
  503 ServiceUnavailable, 504 Timeout), status 0 (no HTTP answer), and timeouts, refused or dropped connections.
  Retry with back-off, never before ``retry_after_s`` (the ``Retry-After`` header, else the Status body's
  ``details.retryAfterSeconds``), as client-go does.
- :class:`NotFound` (404) and :class:`Conflict` (409: a stale ``resourceVersion`` or AlreadyExists): the caller
  decides (gone, re-read, re-attach).
- :class:`Permanent`: everything else (400, 401, 403, 410, 422, admission webhook refusals...): retrying the same
  call does not help. ``refusal`` is the one-line PermissionDenied of a 401/403 (:func:`api_refusal`).

Kubernetes' status codes: https://kubernetes.io/docs/reference/using-api/api-concepts/ and the API conventions
(https://github.com/kubernetes/community/blob/master/contributors/devel/sig-architecture/api-conventions.md
#http-status-codes); APF's 429 + Retry-After: https://kubernetes.io/docs/concepts/cluster-administration/flow-control/.

:func:`to_error` turns any of them into a classified :class:`~kfp_gpu.errors.KfpGpuError` (transient ones are
``RateLimited``/``TransientCloudError`` carrying ``retry_after_s``, which :func:`kfp_gpu.retry.call` honours);
:func:`call` is :func:`kfp_gpu.retry.call` for one Kubernetes API call: it retries the transient ones and raises
the rest classified.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from kfp_gpu import retry
from kfp_gpu.errors import KfpGpuError, PermissionDenied, RateLimited, TransientCloudError
from kfp_gpu.errors import NotFound as NotFoundError

T = TypeVar("T")


@dataclass(frozen=True)
class Transient:
    """Retry later: ``retry_after_s`` is the server's floor (None: it gave none)."""

    status: int
    reason: str
    retry_after_s: float | None = None


@dataclass(frozen=True)
class NotFound:
    status: int
    reason: str


@dataclass(frozen=True)
class Conflict:
    status: int
    reason: str


@dataclass(frozen=True)
class Permanent:
    """Retrying the same call does not help. ``refusal``: the one-line error of an RBAC/credentials refusal."""

    status: int
    reason: str
    refusal: KfpGpuError | None = None


Verdict = Transient | NotFound | Conflict | Permanent

# urllib3's errors by name (the kubernetes client's transport), so this module needs no urllib3 import:
# MaxRetryError wraps NewConnectionError/ConnectTimeoutError, ReadTimeoutError is a socket read timeout,
# ProtocolError a dropped connection ("Connection aborted", "IncompleteRead").
_TRANSPORT = {"MaxRetryError", "NewConnectionError", "ConnectTimeoutError", "ReadTimeoutError", "ProtocolError",
              "TimeoutError", "ConnectionError", "NameResolutionError", "SSLError"}


def is_api_exception(exc: BaseException) -> bool:
    return type(exc).__name__ == "ApiException" and hasattr(exc, "status")


def classify(exc: BaseException) -> Verdict | None:
    """What ``exc`` is, or None when it is neither an API answer nor a transport failure (a bug: let it raise)."""
    if is_api_exception(exc):
        status = int(getattr(exc, "status", 0) or 0)
        reason = " ".join(str(getattr(exc, "reason", "") or "").split())
        if status == 0 or status == 429 or status >= 500:
            return Transient(status, reason or "no HTTP answer", _retry_after(exc))
        if status == 404:
            return NotFound(status, reason)
        if status == 409:
            return Conflict(status, reason)
        return Permanent(status, reason, api_refusal(exc))
    if isinstance(exc, (TimeoutError, ConnectionError)) or type(exc).__name__ in _TRANSPORT:
        return Transient(0, " ".join(str(exc).split())[:200] or type(exc).__name__)
    return None


def is_transient(exc: BaseException) -> bool:
    """True for a transient API/transport error, or a kfp-gpu error classified transient."""
    if isinstance(exc, KfpGpuError):
        return exc.transient
    return isinstance(classify(exc), Transient)


def _retry_after(exc: BaseException) -> float | None:
    headers: Any = getattr(exc, "headers", None) or {}
    header = None
    try:
        header = headers.get("Retry-After") or headers.get("retry-after")
    except AttributeError:
        header = None
    seconds = retry.parse_retry_after(str(header)) if header else None
    if seconds is not None:
        return seconds
    details = _status_body(exc).get("details") or {}
    value = details.get("retryAfterSeconds") if isinstance(details, dict) else None
    return float(value) if isinstance(value, (int, float)) and value >= 0 else None


def _status_body(exc: BaseException) -> dict[str, Any]:
    """The ``Status`` object the API server answered with, or {}."""
    body = getattr(exc, "body", None)
    try:
        data = json.loads(body) if body else {}
    except (TypeError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def api_refusal(exc: BaseException) -> KfpGpuError | None:
    """The one conversion of a Kubernetes API refusal into a one-line kfp-gpu error, or None.

    401 -> PermissionDenied (the credentials are not accepted); 403 with the authorizer's "cannot <verb>
    resource <r>" message -> PermissionDenied naming that permission and pointing at the RBAC that grants it.
    Anything else (admission webhooks, 404, 409...) is left to the caller.
    """
    status = getattr(exc, "status", None)
    if not is_api_exception(exc) or status not in (401, 403):
        return None
    message = str(_status_body(exc).get("message", ""))
    if status == 401:
        return PermissionDenied(
            "the Kubernetes API server did not accept the credentials (401 Unauthorized)",
            remediation="refresh the kubeconfig's token or the service account token, or point KUBECONFIG at a "
            "working kubeconfig")
    if "cannot" not in message:
        return None
    return PermissionDenied(
        f"the Kubernetes API server refused: {message}",
        remediation="add that verb on that resource to the identity's role and re-apply it: the controller's in "
        "kfp_gpu/manifests/controller-rbac.yaml (kfp-gpu install), a tenant's steps' in kfp-gpu tenant add, the "
        "janitor's in deploy/janitor-rbac.yaml (docs/rbac-iam.md)")


def to_error(exc: BaseException, what: str, *, not_found: Callable[[], KfpGpuError] | None = None) -> KfpGpuError:
    """``exc`` (an API or transport error) as a classified kfp-gpu error about ``what`` (e.g. "create NodePool x").

    429 -> RateLimited, 5xx/timeouts -> TransientCloudError (both transient, ``retry_after_s`` in their fields);
    404 -> ``not_found()`` or NotFound; 401/403 -> PermissionDenied; anything else (409 included) -> a permanent
    KfpGpuError naming the status and the server's message. A KfpGpuError is returned as it is.
    """
    if isinstance(exc, KfpGpuError):
        return exc
    verdict = classify(exc)
    message = str(_status_body(exc).get("message", "")) or (verdict.reason if verdict is not None else str(exc))
    message = " ".join(message.split())[:300]
    if isinstance(verdict, Transient):
        extra: dict[str, Any] = {} if verdict.retry_after_s is None else {"retry_after_s": verdict.retry_after_s}
        if verdict.status == 429:
            return RateLimited(f"{what}: the Kubernetes API server throttled the call (429): {message}",
                               remediation="nothing: retried with back-off; if it persists, check the API server's "
                               "priority-and-fairness limits", status=429, **extra)
        said = f"answered {verdict.status}" if verdict.status else "did not answer"
        return TransientCloudError(f"{what}: the Kubernetes API server {said}: {message}",
                                   remediation="nothing: retried with back-off; if it persists, check the API "
                                   "server's health and the network path to it", status=verdict.status, **extra)
    if isinstance(verdict, NotFound):
        return not_found() if not_found is not None else NotFoundError(
            f"{what}: not found (404): {message}", remediation="check that the object and its API exist in the cluster",
            status=404)
    if isinstance(verdict, Permanent) and verdict.refusal is not None:
        return verdict.refusal
    if verdict is None:
        return KfpGpuError(f"{what}: {message}")
    return KfpGpuError(f"{what}: the Kubernetes API server answered {verdict.status}: {message}",
                       remediation="read the server's message: the request or the object is not acceptable as it is",
                       status=verdict.status)


# Bounds of one API call's retries: a control-plane hiccup (leader election, APF throttling) clears in seconds.
API_POLICY = retry.RetryPolicy(attempts=6, budget_s=30.0, base_s=0.2, cap_s=5.0)


def call(fn: Callable[[], T], what: str, *, not_found: Callable[[], KfpGpuError] | None = None,
         policy: retry.RetryPolicy | None = None, **loop: Any) -> T:
    """``fn()`` (one idempotent Kubernetes API call, or a few), retried while it fails transiently (never before
    the server's Retry-After); then any API/transport error raised as :func:`to_error` classifies it.

    ``fn`` handles the 404/409 it expects itself. ``loop`` goes to :func:`kfp_gpu.retry.call` (clock, sleep, rng).

    Raises:
        KfpGpuError: classified (a transient one once the retry bound is spent, saying so).
    """
    def once() -> T:
        try:
            return fn()
        except Exception as exc:
            if isinstance(exc, KfpGpuError) or classify(exc) is None:
                raise
            raise to_error(exc, what, not_found=not_found) from None

    return retry.call(once, policy=policy or API_POLICY, what=what, **loop)
