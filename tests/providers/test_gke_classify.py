"""The GKE error -> scope table, one case per entry, raised through the real google clients.

Each case injects the cloud's error into the stand-in (as an HTTP fault carrying the reason, or
as a failed Operation) and checks the class and scope GkeProvider.classify assigns.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

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
from kfp_gpu.providers.base import Operation, OpStatus, PoolRef
from kfp_gpu.providers.gke import ERROR_SCOPES, HTTP_SCOPES, GkeProvider
from kfp_gpu.providers.gke import classify as cl
from kfp_gpu.retry import RetryPolicy
from tests.sim._helpers import CLUSTER, PROJECT, REGION, running, scenario

OWNER = Owner("run-1", "scale-up", 2_000_000_000.0)
SET_SIZE = r"nodePools/l4-a:setSize"
FAST = RetryPolicy(attempts=3, budget_s=5.0, base_s=0.01, cap_s=0.05)


def _resize_error(faults: list[dict[str, Any]], **extra: Any) -> KfpGpuError:
    """The error resize() raises when every setSize meets ``faults`` (persistent: transient ones are
    retried by the provider until its bound, then raised classified)."""
    faults = [{"count": 1000, **f} for f in faults]
    with running(scenario(faults=faults, **extra)) as sim:
        p = GkeProvider(PROJECT, REGION, CLUSTER, endpoint=sim.url, retry=FAST)
        with pytest.raises(KfpGpuError) as info:
            p.resize(PoolRef("l4-a", "us-central1-a"), 1, OWNER)
        return info.value


# Every token of ERROR_SCOPES, raised as an HTTP error whose errors[].reason / ErrorInfo carry it.
@pytest.mark.parametrize("token", sorted(ERROR_SCOPES))
def test_every_table_token_through_the_client(token: str) -> None:
    cls, scope = ERROR_SCOPES[token]
    reason = token.split(":")[0]
    status = {CapacityUnavailable: 503, QuotaExceeded: 403, RateLimited: 429}.get(cls, 503)
    message = f"{reason}: injected"
    if ":" in token:
        message = f"Quota '{token.split(':')[1]}' exceeded. Limit: 8.0 globally."
    err = _resize_error([{"path": SET_SIZE, "status": status, "reason": reason, "message": message}])
    assert type(err) is cls, err
    assert err.scope is scope, (token, err.scope)


@pytest.mark.parametrize(("status", "cls", "scope"), [
    (401, PermissionDenied, Scope.PROVIDER),
    (403, PermissionDenied, Scope.PROVIDER),
    (429, RateLimited, Scope.NONE),
    (500, TransientCloudError, Scope.NONE),
    (503, TransientCloudError, Scope.NONE),
])
def test_http_status_fallbacks(status: int, cls: type[KfpGpuError], scope: Scope) -> None:
    err = _resize_error([{"path": SET_SIZE, "status": status, "reason": "someReason"}])
    assert type(err) is cls and err.scope is scope
    assert HTTP_SCOPES[status] == (cls, scope)
    assert err.transient is (scope is Scope.NONE)


def test_permission_denied_names_the_iam_permission() -> None:
    err = _resize_error([{"path": SET_SIZE, "status": 403, "message": 'Required "container.clusters.update" permission(s)'}])
    assert isinstance(err, PermissionDenied)
    assert err.fields["permission"] == "container.clusters.update"
    assert "container.clusters.update" in err.remediation
    assert "gcloud auth" in _resize_error([{"path": SET_SIZE, "status": 401}]).remediation


@pytest.mark.parametrize(("method", "url", "perm"), [
    ("POST", "http://x/compute/v1/projects/p/zones/z/reservations", "compute.reservations.create"),
    ("DELETE", "http://x/compute/v1/projects/p/zones/z/reservations/r", "compute.reservations.delete"),
    ("POST", "http://x/v1/projects/p/locations/global/quotaPreferences?quotaPreferenceId=a",
     "cloudquotas.quotas.update"),
    ("GET", "http://x/compute/v1/projects/p/regions/us-central1?%24alt=json", "compute.regions.get"),
    ("GET", "http://x/compute/v1/projects/p?%24alt=json", "compute.projects.get"),
])
def test_iam_permission_table(method: str, url: str, perm: str) -> None:
    assert cl.permission_for(method, url) == perm


def _done_error(**extra: Any) -> KfpGpuError | None:
    """The error of the DONE resize Operation when GCE refuses the VM creations (quota is checked per VM)."""
    with running(scenario(api={"error_rate": 0}, **extra)) as sim:
        p = GkeProvider(PROJECT, REGION, CLUSTER, endpoint=sim.url, retry=FAST)
        op = p.resize(PoolRef("l4-a", "us-central1-a"), 1, OWNER)
        deadline = time.monotonic() + 10
        while not op.done and time.monotonic() < deadline:
            time.sleep(0.05)
            op = p.operation(op)
        assert op.done, op
        return op.error if isinstance(op.error, KfpGpuError) else None


def test_quota_exceeded_regional_vs_all_regions() -> None:
    regional = _done_error(pools=[{"name": "l4-a", "zone": "us-central1-a", "accelerator": "l4",
                                   "gpus_per_node": 1, "max_nodes": 500}],
                           regions={"us-central1": {"zones": ["us-central1-a"],
                                                    "quotas": {"NVIDIA_L4_GPUS": {"limit": 0}}}})
    assert isinstance(regional, QuotaExceeded) and regional.scope is Scope.REGION
    assert regional.fields["metric"] == "NVIDIA_L4_GPUS"
    everywhere = _done_error(global_quotas={"GPUS_ALL_REGIONS": {"limit": 0}})
    assert isinstance(everywhere, QuotaExceeded) and everywhere.scope is Scope.PROVIDER
    assert everywhere.fields["metric"] == "GPUS_ALL_REGIONS"


@pytest.mark.parametrize("details", [False, True])
def test_stockout_operation_is_zone_scoped(details: bool) -> None:
    err = _resize_error([], stockouts=[{"zone": "us-central1-a", "window": "always", "with_details": details}])
    assert isinstance(err, CapacityUnavailable) and err.scope is Scope.ZONE
    assert err.fields["zone"] == "us-central1-a"


def test_busy_pool_is_transient() -> None:
    f = cl.Fault("Operation operation-1 is currently operating on node pool p. Please wait", 400)
    err = cl.classify_fault(f, zone="us-central1-a")
    assert isinstance(err, TransientCloudError) and err.transient


def test_not_found_scopes() -> None:
    with running() as sim:
        p = GkeProvider(PROJECT, REGION, CLUSTER, endpoint=sim.url)
        with pytest.raises(NotFound) as pool:
            p.resize(PoolRef("nope", "us-central1-a"), 1, OWNER)
        assert pool.value.scope is Scope.ZONE
        with pytest.raises(NotFound) as region:
            p.quota("l4", "mars-north1", spot=False)
        assert region.value.scope is Scope.REGION
        wrong_cluster = GkeProvider(PROJECT, REGION, "nope", endpoint=sim.url)
        with pytest.raises(NotFound, match="clusters/nope"):
            wrong_cluster.pools(REGION)


def test_unrecognised_error_is_cloud_error_with_narrowest_scope(caplog: pytest.LogCaptureFixture) -> None:
    err = _resize_error([{"path": SET_SIZE, "status": 409, "reason": "weirdThing", "message": "verbatim text"}])
    assert isinstance(err, CloudError) and err.scope is Scope.ZONE
    assert "verbatim text" in err.message
    assert "unclassified" in caplog.text
    assert cl.classify_fault(cl.Fault("odd", 418), region=REGION).scope is Scope.REGION
    assert cl.classify_fault(cl.Fault("odd", 418)).scope is Scope.PROVIDER


def test_connection_failure_is_transient() -> None:
    p = GkeProvider(PROJECT, REGION, CLUSTER, endpoint="http://127.0.0.1:9", timeout=2)
    with pytest.raises(TransientCloudError):
        p.pools(REGION)


def test_classify_passes_kfp_errors_through() -> None:
    p = GkeProvider(PROJECT, REGION, CLUSTER, endpoint="http://127.0.0.1:9")
    e = RateLimited("x")
    assert p.classify(e) is e
    assert Operation("noop:a:b:1", "resize", "a/b", OpStatus.DONE).done
