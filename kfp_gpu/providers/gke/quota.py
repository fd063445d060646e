"""Quota reads (Compute regions.get / projects.get, Cloud Quotas quotaInfos) and increase requests."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from kfp_gpu import accelerators
from kfp_gpu.accelerators import GCP_ALL_REGIONS_METRIC, GCP_GPU_FAMILY_QUOTA_ID, Accelerator
from kfp_gpu.errors import InvalidSpec, KfpGpuError, NotFound, Scope
from kfp_gpu.providers.base import QuotaAmount
from kfp_gpu.providers.gke import preferences as prefs

if TYPE_CHECKING:
    from kfp_gpu.providers.gke.provider import GkeProvider

# Typical approval lead times (days) for increase requests; inputs for the preflight report.
LEAD_TIME_DAYS = {"regional": 2.0, "family": 7.0, "global": 1.0}
_SERVICE = "compute.googleapis.com"


def console_url(project: str, metric: str, region: str) -> str:
    return (f"https://console.cloud.google.com/iam-admin/quotas?project={project}"
            f"&service={_SERVICE}&metric={metric}&location={region}")


def read(p: GkeProvider, acc: Accelerator, region: str, *, spot: bool) -> list[QuotaAmount]:
    """Regional metric(s), the GPU-family row (Cloud Quotas) when the accelerator has one, and
    GPUS_ALL_REGIONS. Unreadable rows come back with status "unknown" and the reason.

    Raises: PermissionDenied (no credentials at all), NotFound (no such region).
    """
    p.credentials()
    metrics = [acc.gcp_quota_metric] + ([acc.gcp_preemptible_metric] if spot else [])
    # the GPU family's reads first: they are the longest chain (quotaInfos + pools + group sizes, two fan-outs
    # deep), so they leave before the flat regions.get / projects.get
    kinds: list[tuple[str, Callable[[], list[QuotaAmount]]]] = []
    if acc.gcp_gpu_family:
        family = acc.gcp_gpu_family
        kinds.append(("family", lambda: _family(p, region, family)))
    cpus = ["PREEMPTIBLE_CPUS", "CPUS"] if spot else ["CPUS"]  # listed in every real region; absent: not read
    kinds += [("regional", lambda: _regional(p, acc, region, metrics, cpus)), ("global", lambda: _global(p))]
    names = {"regional": metrics, "global": [GCP_ALL_REGIONS_METRIC], "family": [str(acc.gcp_gpu_family)]}
    rows: dict[str, list[QuotaAmount]] = {}
    for (kind, _), result in zip(kinds, p.parallel([fn for _, fn in kinds]), strict=True):
        if isinstance(result, NotFound) and kind == "regional":
            raise NotFound(f"region {region} does not exist in project {p.project}: {result.message}",
                           remediation="use a GCP region such as us-central1", region=region,
                           scope=Scope.REGION)
        if isinstance(result, KfpGpuError):
            loc = "global" if kind == "global" else region
            rows[kind] = [_unknown(p, m, loc, result) for m in names[kind]]
        else:
            rows[kind] = result
    return [row for kind in ("regional", "global", "family") for row in rows.get(kind, [])]


def _unknown(p: GkeProvider, metric: str, loc: str, err: KfpGpuError) -> QuotaAmount:
    reason = f"{type(err).__name__}: {err.message}"
    if err.remediation:
        reason += f" (fix: {err.remediation})"
    return QuotaAmount(metric, loc, None, None, status="unknown", reason=reason,
                       raise_path=console_url(p.project, metric, loc))


def _regional(p: GkeProvider, acc: Accelerator, region: str, metrics: list[str], cpus: list[str]
              ) -> list[QuotaAmount]:
    r = p.shared_read(("regions.get", p.project, region), lambda: p._call(
        "regions", "get", at_region=region, project=p.project, region=region))
    by_metric = {str(q.metric): q for q in r.quotas}
    rows = [QuotaAmount(m, region, float(q.limit), float(q.usage), unit="vcpus",
                        raise_path=console_url(p.project, m, region), lead_time_days=LEAD_TIME_DAYS["regional"])
            for m in cpus if (q := by_metric.get(m)) is not None]
    for m in metrics:
        q = by_metric.get(m)
        if q is None:
            if acc.gcp_gpu_family:
                continue  # Compute omits this family's metric; the Cloud Quotas row covers it
            rows.append(QuotaAmount(m, region, None, None, status="unknown",
                                    reason=f"regions.get for {region} does not list {m}",
                                    raise_path=console_url(p.project, m, region)))
            continue
        rows.append(QuotaAmount(m, region, float(q.limit), float(q.usage),
                                raise_path=console_url(p.project, m, region),
                                lead_time_days=LEAD_TIME_DAYS["regional"]))
    return rows


GLOBAL_TTL_S = 2.0
_global_lock = threading.Lock()
_global_memo: dict[tuple[str, Any, str], tuple[float, Future[Any]]] = {}  # (endpoint, caller, project) -> in flight


def _global(p: GkeProvider) -> list[QuotaAmount]:
    """GPUS_ALL_REGIONS. A preflight asks once per candidate region at the same moment; those concurrent
    asks share one projects.get (single flight, reused for ``GLOBAL_TTL_S``)."""
    key = (p.endpoint, p.identity(), p.project)  # the same project's global quota, whichever provider object asks
    with _global_lock:
        hit = _global_memo.get(key)
        mine = hit is None or time.monotonic() - hit[0] > GLOBAL_TTL_S
        if mine:
            fut: Future[Any] = Future()
            _global_memo[key] = (time.monotonic(), fut)
        else:
            assert hit is not None
            fut = hit[1]
    if mine:
        try:
            fut.set_result(p._call("projects", "get", project=p.project))
        except BaseException as exc:
            fut.set_exception(exc)
            with _global_lock:
                _global_memo.pop(key, None)
    proj = fut.result()
    for q in proj.quotas:
        if q.metric == GCP_ALL_REGIONS_METRIC:
            return [QuotaAmount(GCP_ALL_REGIONS_METRIC, "global", float(q.limit), float(q.usage),
                                raise_path=console_url(p.project, GCP_ALL_REGIONS_METRIC, "global"),
                                lead_time_days=LEAD_TIME_DAYS["global"])]
    return [QuotaAmount(GCP_ALL_REGIONS_METRIC, "global", None, None, status="unknown",
                        reason=f"projects.get for {p.project} does not list {GCP_ALL_REGIONS_METRIC}")]


def _family(p: GkeProvider, region: str, family: str) -> list[QuotaAmount]:
    name = f"projects/{p.project}/locations/global/services/{_SERVICE}/quotaInfos/{GCP_GPU_FAMILY_QUOTA_ID}"
    # the row (Cloud Quotas) and the usage (this cluster's pools) in one round: neither needs the other
    info, counted = p.parallel([
        lambda: p.shared_read(("quotaInfos.get", name), lambda: p._call("quotas", "get_quota_info",
                                                                         at_region=region, name=name)),
        lambda: _family_usage(p, region, family)])
    if isinstance(info, KfpGpuError):
        raise info
    raise_path = console_url(p.project, GCP_GPU_FAMILY_QUOTA_ID, region)
    for d in info.dimensions_infos:
        dims = dict(d.dimensions)
        if dims.get("region") == region and dims.get("gpu_family") == family:
            if isinstance(counted, KfpGpuError):
                raise counted
            usage, note = counted
            return [QuotaAmount(family, region, float(d.details.value), usage, raise_path=raise_path,
                                reason=note, lead_time_days=LEAD_TIME_DAYS["family"])]
    return [QuotaAmount(family, region, 0.0, 0.0, raise_path=raise_path, lead_time_days=LEAD_TIME_DAYS["family"],
                        reason=f"Cloud Quotas lists no {family} quota in {region}: the limit is 0")]


def _family_usage(p: GkeProvider, region: str, family: str) -> tuple[float, str]:
    """Cloud Quotas reports limits only: usage is counted from this cluster's pools in ``region`` (their sizes
    from one instanceGroupManagers.aggregatedList read beside nodePools.list: see GkeProvider.gpu_pools)."""
    note = "usage counted from this cluster's node pools (Cloud Quotas reports limits only)"
    labels = [a.gke_label for a in map(accelerators.get, accelerators.names()) if a.gcp_gpu_family == family]
    try:
        pools = p.gpu_pools(region, labels)
    except NotFound:
        return 0.0, note + f"; the cluster has no pools in {region}"
    used = 0
    for s in pools:
        try:
            if accelerators.get(s.accelerator).gcp_gpu_family != family:
                continue
        except InvalidSpec:
            continue
        used += max(0, s.size) * s.gpus_per_node
    return float(used), note


def quota_target(metric: str, region: str) -> tuple[str, dict[str, str]]:
    """Cloud Quotas (quotaId, dimensions) for a Compute metric, a GPU family or GPUS_ALL_REGIONS."""
    if metric == GCP_ALL_REGIONS_METRIC:
        return "GPUS-ALL-REGIONS-per-project", {}
    family = metric.split(":", 1)[-1] if metric.startswith(GCP_GPU_FAMILY_QUOTA_ID) else metric
    if family in {a.gcp_gpu_family for a in map(accelerators.get, accelerators.names())}:
        return GCP_GPU_FAMILY_QUOTA_ID, {"region": region, "gpu_family": family}
    return metric.replace("_", "-") + "-per-project-region", {"region": region}


def request_increase(p: GkeProvider, metric: str, region: str, value: float, justification: str) -> str:
    """Ask Cloud Quotas for ``value`` of ``metric`` in ``region``: the one QuotaPreference of that quota and
    dimensions is created, or patched in place (see :mod:`kfp_gpu.providers.gke.preferences`).

    The contact email is ``p.contact_email`` and is checked before any call.

    Raises: InvalidSpec (no/bad contact_email, value not above the current limit), PermissionDenied, CloudError.
    """
    if value <= 0:
        raise InvalidSpec("value", value, "must be a positive quota amount")
    email = prefs.check_contact_email(p.contact_email)
    quota_id, dims = quota_target(metric, region)
    current = _current_limit(p, metric, region)
    if current is not None and value <= current:
        raise InvalidSpec("value", value, f"must be above the current {metric} limit ({current:g}) in {region}",
                          remediation="ask for more than you have; check free quota first")
    return prefs.upsert(p, quota_id, dims, int(value), justification, email, region=region)


def _current_limit(p: GkeProvider, metric: str, region: str) -> float | None:
    try:
        if metric == GCP_ALL_REGIONS_METRIC:
            rows = _global(p)
        else:
            r = p._call("regions", "get", at_region=region, project=p.project, region=region)
            rows = [QuotaAmount(str(q.metric), region, float(q.limit), float(q.usage)) for q in r.quotas]
    except KfpGpuError:
        return None
    return next((q.limit for q in rows if q.metric == metric), None)
