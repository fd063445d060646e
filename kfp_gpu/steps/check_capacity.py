"""Preflight's "is there capacity now" question to the cluster's autoscaler, and the backend it reports.

:func:`backend` is the provisioner backend the run will get and why (:func:`kfp_gpu.provisioners.detect`), plus
whether to ask the autoscaler at all: the chosen backend is ``provisioning-request`` (not flex-start: DWS
capacity comes later by design), or the cluster serves ProvisioningRequests and a cluster-autoscaler (its fresh
status ConfigMap) manages node groups the spec may use.

:func:`ask` creates a PodTemplate (the gang's pod shape, :func:`kfp_gpu.provisioners.provreq.pod_spec`, limited
to the spec's candidate zones) and a ProvisioningRequest of class ``check-capacity.autoscaling.x-k8s.io`` with
``noRetry="true"`` (so "not found" is the terminal Failed=True instead of an endless Provisioned=False retry),
waits a bounded time for Provisioned=True (CapacityIsFound) or Failed=True (CapacityIsNotFound), and deletes
both objects whatever happened. The answer's meaning (cluster-autoscaler only counts the nodes it has now) is
in :mod:`kfp_gpu.plan.preflight`.
"""

from __future__ import annotations

import functools
import logging
import time
import uuid
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kfp_gpu.cluster import apierrors
from kfp_gpu.cluster import provreq as api_req
from kfp_gpu.cluster.nodes import ZONE_LABEL
from kfp_gpu.errors import KfpGpuError, NotFound
from kfp_gpu.ownership import Owner
from kfp_gpu.plan import provreq as plan
from kfp_gpu.plan.preflight import NO_ANSWER, NOT_ASKED, CapacityNow, capacity_answer
from kfp_gpu.providers.base import CapacityProvider
from kfp_gpu.retry import RetryPolicy
from kfp_gpu.spec import CapacityType, ProvisioningSpec

STEP = "preflight"
WAIT_S = 20.0  # cluster-autoscaler answers within a loop or two (scan interval 10 s by default)
LEASE_S = 300.0  # the janitor may delete a request a crashed preflight left behind after this
log = logging.getLogger(__name__)


def backend(spec: ProvisioningSpec, api: Any, provider: CapacityProvider | None) -> tuple[dict[str, str], str]:
    """({"name", "reason"} of the backend, "" when check-capacity should be asked else why not).

    Without a cluster (``api`` None) the backend is the spec's choice, or unknown for "auto". Raises: nothing
    (detection treats an unreadable API as absent)."""
    from kfp_gpu.provisioners import capabilities, detect

    if api is None:
        name = spec.target.provisioner if spec.target.provisioner != "auto" else "unknown"
        return {"name": name, "reason": "no cluster credentials: the cluster's autoscaler could not be detected"}, \
            "no cluster credentials"
    choice = detect(spec, api, provider)
    out = {"name": choice.name, "reason": choice.reason}
    chosen = capabilities(choice.name)
    if chosen is not None and chosen.supports_check_capacity and spec.capacity is not CapacityType.FLEX_START:
        return out, ""
    if spec.capacity is CapacityType.FLEX_START:
        return out, "capacity='flex-start': DWS obtains the capacity later by design"
    try:
        groups = api_req.autoscaler_node_groups(api) if api_req.api_served(api) else None
    except ApiException:
        groups = None
    if groups and any(not spec.target.pools or g in spec.target.pools for g in groups):
        return out, ""
    return out, "no cluster-autoscaler serves ProvisioningRequests for the matching pools"


def ask(spec: ProvisioningSpec, api: client.ApiClient, run_id: str = "", *, zones: list[str] | None = None,
        wait_s: float = WAIT_S) -> CapacityNow:
    """Ask check-capacity for the whole gang (in ``zones`` when given) and delete the request afterwards.

    Never raises for what the cluster does: a refused or failed call, or no answer within ``wait_s``, is the
    NO_ANSWER answer with the reason (never ok); a cluster without the API is NOT_ASKED.
    """
    run_id = run_id or f"preflight-{uuid.uuid4().hex[:8]}"
    ns = spec.target.namespace
    name = plan.request_name(run_id, STEP)
    owner = Owner.for_step(run_id, STEP, LEASE_S)
    t0 = time.time()
    try:  # a 429/5xx/timeout is retried (never before Retry-After) within a short bound: it is a preflight
        apierrors.call(functools.partial(
            api_req.create, api, ns, name, pod_spec=_pod_spec(spec, run_id, zones or []), count=spec.nodes,
            klass=plan.CHECK_CAPACITY, parameters=plan.parameters(plan.CHECK_CAPACITY, no_retry=True),
            labels=owner.labels()), f"create check-capacity request {ns}/{name}",
            policy=RetryPolicy(attempts=4, budget_s=min(10.0, wait_s), base_s=0.2, cap_s=2.0))
    except KfpGpuError as exc:
        _delete(api, ns, name)  # the PodTemplate may have been made before the request was refused
        if isinstance(exc, NotFound):
            return CapacityNow(NOT_ASKED, f"the cluster does not serve {plan.CRD_NAME} (namespace {ns})")
        return CapacityNow(NO_ANSWER, f"could not create check-capacity request: {exc.message}", name)
    try:
        obs, elapsed = _wait(api, ns, name, t0, t0 + wait_s)
    except Exception as exc:  # a refused watch, a broken connection: no answer, never ok
        return CapacityNow(NO_ANSWER, f"could not watch check-capacity request {ns}/{name}: {exc}", name)
    finally:
        _delete(api, ns, name)
    return capacity_answer(obs, request=name, waited_s=wait_s, elapsed_s=elapsed)


def _wait(api: client.ApiClient, ns: str, name: str, created: float, deadline: float,
          ) -> tuple[plan.Observed, float]:
    """The request's state once answered (or at the deadline), and the seconds from creation to the answer."""

    def answered(obj: dict[str, Any] | None) -> bool:
        st = plan.read_state((obj or {}).get("status", {}).get("conditions"))
        return st.state in (plan.ReqState.PROVISIONED, plan.ReqState.FAILED) or (
            st.state is plan.ReqState.WAITING and st.reason == "CapacityIsNotFound")

    w = api_req.RequestWatch(api, ns, name).start()
    try:
        obj = w.wait(answered, deadline)
        if w.error is not None:
            raise RuntimeError(str(w.error))
    finally:
        w.stop()
    return plan.read_state((obj or {}).get("status", {}).get("conditions")), time.time() - created


def _pod_spec(spec: ProvisioningSpec, run_id: str, zones: list[str]) -> dict[str, Any]:
    from kfp_gpu.provisioners.provreq import pod_spec

    body = pod_spec(spec, run_id)
    zones = [z for z in zones if z]
    if zones:  # the gang may land in any candidate zone (one zone each unless allow_zone_spread)
        terms = body.setdefault("affinity", {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": []}]}}})
        exprs = terms["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]
        exprs["matchExpressions"].append({"key": ZONE_LABEL, "operator": "In", "values": zones})
    return body


def _delete(api: client.ApiClient, ns: str, name: str) -> None:
    try:
        api_req.delete(api, ns, name)
    except ApiException as exc:
        log.warning("could not delete check-capacity request %s/%s: %s %s", ns, name, exc.status, exc.reason)
