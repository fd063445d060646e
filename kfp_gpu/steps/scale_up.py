"""burst_scale_up: all-or-nothing gang provisioning within the spec's deadline, through the run's provisioner.

The backend (node-pool resizes, or a ProvisioningRequest the cluster's autoscaler serves) is chosen by
:func:`kfp_gpu.provisioners.select` and recorded in the capacity this step outputs, so train and teardown
use the same one. It runs in a controller work unit for the run's GpuGang; the gang (not a lease) is the run's
liveness: the controller releases it when its owner is gone.
"""

from __future__ import annotations

import time

from kubernetes import client

from kfp_gpu import provisioners
from kfp_gpu.providers.base import CapacityProvider
from kfp_gpu.provisioners import GangRequest
from kfp_gpu.spec import ProvisioningSpec
from kfp_gpu.steps.result import StepResult
from kfp_gpu.timeline import Timeline

STEP = "scale_up"


def run(spec: ProvisioningSpec, run_id: str, upstream_json: str, *, api: client.ApiClient | None = None,
        provider: CapacityProvider | None = None) -> StepResult:
    """Component entry. Raises: ProvisioningTimeout, CapacityUnavailable, QuotaExceeded, PermissionDenied,
    NotFound, InvalidSpec (an autoscaled pool under target.autoscaled_pools="refuse"), CrdMissing."""
    from kfp_gpu.cluster.kube import api_client

    api = api or api_client(spec.target)
    t0 = time.time()
    backend = provisioners.select(spec, api, provider)
    cap = backend.acquire(spec, run_id, GangRequest(step=STEP))
    tl = Timeline.from_json(cap.timeline_json)
    lat = sorted(tl.ready_latencies())
    metrics = {
        "nodes_ready": float(len(cap.nodes)), "gpus_ready": float(len(cap.nodes) * spec.gpus_per_node),
        "scale_up_seconds": time.time() - t0,
        "p50_node_ready_seconds": lat[len(lat) // 2] if lat else 0.0,
        "max_node_ready_seconds": lat[-1] if lat else 0.0,
    }
    from kfp_gpu.rehearsal_seam import world_time_scale
    from kfp_gpu.report._common import duration, world

    shown, clock_note = world(tl)  # the report in the world's clock (the rehearsal compresses time)
    md = [f"## burst scale-up: {len(cap.nodes)}/{spec.nodes} nodes Ready in "
          f"{duration(metrics['scale_up_seconds'] * world_time_scale())} ({backend.name})"]
    md += [f"- {p.pool} ({p.zone}): {len(p.nodes)} nodes" for p in cap.placements]
    if cap.extra.get("requests"):
        md.append(f"- ProvisioningRequest {cap.extra['requests'][-1]} ({cap.extra.get('class', '')})")
    md += [f"\n_{clock_note}_"] if clock_note else []
    return StepResult(cap.to_json(), metrics, "\n".join(md), _html(spec, shown, "\n".join(md)))


def _html(spec: ProvisioningSpec, tl: Timeline, md: str) -> str:
    try:
        from kfp_gpu.report.html import render_html

        return render_html(title=f"kfp-gpu burst scale-up ({spec.nodes}x{spec.gpus_per_node} {spec.accelerator})",
                           timeline=tl, summary=md.replace("## ", ""))
    except Exception:  # the report must never fail the step
        return ""


__all__ = ["run", "STEP"]
