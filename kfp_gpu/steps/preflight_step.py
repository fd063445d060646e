"""quota_preflight as a DAG step: run the concurrent preflight, fail fast when nothing fits."""

from __future__ import annotations

from typing import Any

from kfp_gpu.plan.preflight import FOUND, NOT_FOUND
from kfp_gpu.plan.quota import Verdict
from kfp_gpu.providers.base import CapacityProvider
from kfp_gpu.spec import ProvisioningSpec
from kfp_gpu.steps.preflight import check, run_preflight, store_probe
from kfp_gpu.steps.result import StepResult

BACKEND_METRIC = {"provisioning-request": 1.0, "node-pool": 0.0}
CAPACITY_METRIC = {FOUND: 1.0, NOT_FOUND: 0.0}


def run(spec: ProvisioningSpec, run_id: str, upstream_json: str, *, api: Any = None,
        provider: CapacityProvider | None = None) -> StepResult:
    """Raises: QuotaExceeded (nothing fits; with shortfalls, how to raise each quota, lead times);
    KubeconfigInvalid, ClusterUnreachable, WrongCluster (see :func:`kfp_gpu.cluster.kube.api_client`)."""
    from kfp_gpu.cluster.kube import api_client
    from kfp_gpu.errors import NoKubeCredentials
    from kfp_gpu.providers import for_target

    provider = provider or for_target(spec.target)
    if api is None:
        try:
            api = api_client(spec.target)
        except NoKubeCredentials:  # no cluster at all: its checks become "unknown", never "ok"
            api = None
        # a broken kubeconfig, an unreachable or wrong cluster fail the step with their one-line error
    # the checkpoint_uri's store is probed (s3:// / gs://: a labelled object written, read back, deleted)
    result = check(run_preflight(spec, provider, api, run_id=run_id, checkpoint_probe=store_probe(run_id)))
    metrics = {
        "placements_fitting": float(len(result.fitting)),
        "unknown_checks": float(len(result.unknowns)),
        "preflight_seconds": float(result.elapsed_s),
        # the backend (1 = provisioning-request, 0 = node-pool, -1 = unknown) and the autoscaler's check-capacity
        # answer (1 = capacity available now, 0 = no capacity now, -1 = no answer / not asked)
        "provisioner_provisioning_request": BACKEND_METRIC.get(result.provisioner.get("name", ""), -1.0),
        "capacity_now": CAPACITY_METRIC.get(result.capacity_now.answer if result.capacity_now else "", -1.0),
    }
    if result.capacity_now is not None and result.capacity_now.answer in (FOUND, NOT_FOUND):
        metrics["check_capacity_seconds"] = float(result.capacity_now.elapsed_s)
    md = result.to_markdown()
    return StepResult(result.to_json(), metrics, md, _html(spec, result, md))


def _html(spec: ProvisioningSpec, result: Any, md: str) -> str:
    try:
        from kfp_gpu.report.html import PreflightRow, render_html

        rows = []
        for p in result.placements:
            for c in p.checks:
                status = {Verdict.FITS: "ok", Verdict.SHORT: "short"}.get(c.verdict, "unknown")
                rows.append(PreflightRow(
                    placement=p.label, metric=c.metric, needed=c.needed, free=c.free, limit=c.limit,
                    short=c.short_by if status == "short" else None, status=status, unit=c.unit,
                    remediation=c.raise_path or c.reason, lead_time_days=c.lead_time_days or None))
        return render_html(title=f"kfp-gpu quota preflight ({spec.nodes}x{spec.gpus_per_node} {spec.accelerator})",
                           preflight=rows, summary=md.splitlines()[0] if md else "")
    except Exception:  # the report must never fail the step
        return ""
