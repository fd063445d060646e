"""The kfp-gpu error tree.

Every error carries structured fields and a ``remediation`` string a human can act on.
Retry semantics live here, kopf-style: ``transient`` errors may be retried with back-off,
permanent ones must not be. ``scope`` says how much of the placement space an error blocks
(zone, region or the whole provider), which drives failover.

Errors survive a trip between DAG steps: ``to_dict`` / ``from_dict`` round-trip them through JSON.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from typing import Any, ClassVar


class Scope(str, enum.Enum):
    """How much of the placement space an error blocks."""

    NONE = "none"  # transient: nothing is blocked, retry after back-off
    ZONE = "zone"
    REGION = "region"
    PROVIDER = "provider"


class KfpGpuError(Exception):
    """Base of every error kfp-gpu raises on purpose.

    Attributes:
        message: what went wrong, naming the object and value.
        remediation: what the user should do about it.
        fields: structured context (field names, amounts, zones...), JSON-serialisable.
        transient: True when retrying the same call later may succeed.
        scope: the placement scope this error blocks, for failover decisions.
    """

    transient: ClassVar[bool] = False
    default_scope: ClassVar[Scope] = Scope.PROVIDER
    exit_code: ClassVar[int] = 1

    def __init__(
        self,
        message: str,
        *,
        remediation: str = "",
        scope: Scope | None = None,
        **fields: Any,
    ) -> None:
        self.message = message
        self.remediation = remediation
        self.scope = scope if scope is not None else self.default_scope
        self.fields: dict[str, Any] = dict(fields)
        super().__init__(self.__str__())

    def __str__(self) -> str:
        text = self.message
        if self.remediation:  # one line: what went wrong, then the fix
            text += f" (fix: {self.remediation})"
        return text

    def to_dict(self) -> dict[str, Any]:
        return {
            "type": type(self).__name__,
            "message": self.message,
            "remediation": self.remediation,
            "scope": self.scope.value,
            "transient": self.transient,
            "fields": self.fields,
        }

    @staticmethod
    def from_dict(data: Mapping[str, Any]) -> KfpGpuError:
        cls = _REGISTRY.get(str(data.get("type")), KfpGpuError)
        err = cls.__new__(cls)
        KfpGpuError.__init__(
            err,
            str(data.get("message", "")),
            remediation=str(data.get("remediation", "")),
            scope=Scope(str(data.get("scope", cls.default_scope.value))),
            **dict(data.get("fields") or {}),
        )
        return err


class InvalidSpec(KfpGpuError):
    """The user's spec or input is wrong. Permanent; raised at decoration/compile time when possible."""

    exit_code = 2

    def __init__(self, field: str, value: Any, allowed: str, *, remediation: str = "") -> None:
        super().__init__(
            f"invalid {field}={value!r}: {allowed}",
            remediation=remediation or default_fix(field, allowed),
            field=field,
            value=repr(value),
            allowed=allowed,
        )
        self.field = field
        self.value = value


class QuotaExceeded(KfpGpuError):
    """A cloud quota is smaller than what the run needs. Permanent until the quota is raised."""

    default_scope = Scope.REGION


class CapacityUnavailable(KfpGpuError):
    """The cloud has no stock for the requested machines (stockout). Blocks a zone by default."""

    default_scope = Scope.ZONE


class PermissionDenied(KfpGpuError):
    """Credentials are missing or lack an IAM permission. Permanent; blocks the whole provider."""

    default_scope = Scope.PROVIDER


class NotFound(KfpGpuError):
    """A named cloud or cluster object (region, node pool, cluster) does not exist."""

    default_scope = Scope.ZONE


class RateLimited(KfpGpuError):
    """The API throttled us (HTTP 429, RequestLimitExceeded...). Transient: back off and retry."""

    transient = True
    default_scope = Scope.NONE


class TransientCloudError(KfpGpuError):
    """A 5xx or network fault that is expected to clear by itself. Transient."""

    transient = True
    default_scope = Scope.NONE


class Preempted(KfpGpuError):
    """Spot/preemptible capacity was reclaimed. Transient: recover from the last checkpoint."""

    transient = True
    default_scope = Scope.ZONE


class ProvisioningTimeout(KfpGpuError):
    """The gang was not Ready before the scale-up deadline. What this run added was rolled back."""

    default_scope = Scope.ZONE
    exit_code = 3


class GangPlacementFailed(KfpGpuError):
    """A partial gang was placed and did not complete within the watchdog bound."""

    default_scope = Scope.ZONE


class QueueTimeout(GangPlacementFailed):
    """The job was not admitted by its Kueue queue within ``queue_timeout_s`` (the queue and the Workload's status
    in the message); a kind of GangPlacementFailed, so callers that handle that still do."""


class TrainingFailed(KfpGpuError):
    """The training application itself failed (not a preemption)."""


class RecoveryBudgetExhausted(KfpGpuError):
    """More preemptions than the spec's restart budget allows."""


class Cancelled(KfpGpuError):
    """The step received SIGTERM/SIGINT and cleaned up. A cancelled step never exits 0."""

    exit_code = 130


class NoKubeCredentials(PermissionDenied):
    """No kubeconfig file, not in a pod: there is no cluster to talk to at all."""


class KubeconfigInvalid(KfpGpuError):
    """The kubeconfig is missing, empty or cannot be parsed, or names a context it does not have."""

    exit_code = 2


class ClusterUnreachable(KfpGpuError):
    """The Kubernetes API server named by the credentials does not answer (refused, DNS, TLS, timeout)."""


class WrongCluster(KfpGpuError):
    """The credentials point at a different cluster than ``target.cluster``. Permanent."""

    exit_code = 2


class CrdMissing(NotFound):
    """A custom resource the step needs (e.g. PyTorchJob kubeflow.org/v1) is not installed in the cluster."""

    default_scope = Scope.PROVIDER

    @classmethod
    def builder(cls, what: str, remediation: str) -> Callable[[], CrdMissing]:
        """The ``not_found=`` of :func:`kfp_gpu.cluster.apierrors.call` for a call on ``what`` (a CRD, as
        "NodePool (karpenter.sh/v1)"): a 404 there means the cluster does not serve it."""
        return lambda: cls(f"the cluster does not serve {what}", remediation=remediation)


class CloudError(KfpGpuError):
    """An error from a cloud API that no table recognised. Logged verbatim; blocks the narrowest scope."""

    default_scope = Scope.ZONE


_REGISTRY: dict[str, type[KfpGpuError]] = {
    cls.__name__: cls
    for cls in (
        KfpGpuError,
        InvalidSpec,
        QuotaExceeded,
        CapacityUnavailable,
        PermissionDenied,
        NotFound,
        RateLimited,
        TransientCloudError,
        Preempted,
        ProvisioningTimeout,
        GangPlacementFailed,
        TrainingFailed,
        RecoveryBudgetExhausted,
        Cancelled,
        CloudError,
        NoKubeCredentials,
        KubeconfigInvalid,
        ClusterUnreachable,
        WrongCluster,
        CrdMissing,
    )
}


def is_transient(err: BaseException) -> bool:
    """True when ``err`` may succeed on retry."""
    return isinstance(err, KfpGpuError) and err.transient


def yaml_problem(exc: BaseException) -> str:
    """One line for a YAML parse error (``yaml.YAMLError``): ``line L, column C: PROBLEM`` where PyYAML marks it,
    else the error's first line. Duck-typed, so this module imports no YAML library."""
    mark, problem = getattr(exc, "problem_mark", None), getattr(exc, "problem", None)
    if mark is not None and problem:
        return f"line {mark.line + 1}, column {mark.column + 1}: {problem}"
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def default_fix(field: str, allowed: str) -> str:
    """The fix an InvalidSpec says when its raiser gave none, read from what is allowed: "must be in [1, 4096]" ->
    "set nodes to a value in [1, 4096]", "allowed: 'a', 'b'" -> "set F to one of 'a', 'b'"; else "correct F"."""
    text = allowed.strip()
    if text.startswith("must be "):
        rest = text.removeprefix("must be ")
        return f"set {field} to {rest if rest.startswith(('a ', 'an ', 'one of ')) else 'a value ' + rest}"
    if text.startswith("allowed: "):
        return f"set {field} to one of {text.removeprefix('allowed: ')}"
    return f"correct {field}"
