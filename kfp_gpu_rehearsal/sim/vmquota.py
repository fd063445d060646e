"""Compute allocation quota, checked where GCE checks it for a managed instance group: when each VM is created.

A MIG resize (GKE ``nodePools.setSize``) is accepted whatever the quota; every VM creation the group then
attempts is checked against the regional GPU metric (or the Cloud Quotas GPU family), ``GPUS_ALL_REGIONS`` and
the vCPU metrics (``CPUS``, or ``PREEMPTIBLE_CPUS`` for Spot VMs when the region has that quota, plus a machine family's
``<FAMILY>_CPUS`` when declared). A refused creation is a ``QUOTA_EXCEEDED`` instance error in
``instanceGroupManagers.listErrors`` and the group retries it. See docs/sim.md, rule 4b.

Only VMs that exist count (a VM the group has not created yet uses no quota).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kfp_gpu import accelerators
from kfp_gpu_rehearsal.sim.scenario import PoolSpec, RegionSpec

if TYPE_CHECKING:
    from kfp_gpu_rehearsal.sim.state import SimState

CPUS, PREEMPTIBLE_CPUS = "CPUS", "PREEMPTIBLE_CPUS"


def vcpus(spec: PoolSpec) -> int:
    """vCPUs of one VM of ``spec`` (its machine type in the catalog; else the catalog's machine for its GPUs)."""
    acc = accelerators.get(spec.accelerator)
    for m in acc.gce_machines:
        if m.name == spec.machine_type:
            return m.vcpus
    return acc.gce_machine_for(spec.gpus_per_node).vcpus


def cpu_metrics(spec: PoolSpec, region: RegionSpec) -> list[str]:
    """The vCPU metrics one VM of ``spec`` counts against. Spot VMs use ``PREEMPTIBLE_CPUS`` when the region has
    that quota (limit above 0) and standard ``CPUS`` otherwise; a family metric (``A2_CPUS``) applies when declared."""
    pre = region.quotas.get(PREEMPTIBLE_CPUS)
    base = PREEMPTIBLE_CPUS if spec.spot and pre is not None and pre.limit > 0 else CPUS
    family = spec.machine_type.split("-", 1)[0].upper() + "_CPUS"
    return [base] + ([family] if family != base and family in region.quotas else [])


def cpu_usage(st: SimState, region: str, metric: str) -> float:
    """vCPUs of the created VMs (not the planned ones) of the simulated pools counted against ``metric``."""
    from kfp_gpu_rehearsal.sim.mig import CREATING

    r = st.region(region)
    with st.lock:
        return float(sum(
            vcpus(p.spec) for p in st.pools.values() if p.spec.region == region
            and metric in cpu_metrics(p.spec, r) for i in p.instances.values() if i.state != CREATING))


def creation_error(st: SimState, spec: PoolSpec, vms: int = 1) -> dict[str, Any] | None:
    """The listErrors ``error`` ({code, message}) when creating ``vms`` more VMs of ``spec`` would exceed a quota."""
    acc = accelerators.get(spec.accelerator)
    short = st.quota_short(spec.region, spec.quota_metric, acc.gcp_gpu_family, float(spec.gpus_per_node * vms))
    if short is None:
        r = st.region(spec.region)
        need = float(vcpus(spec) * vms)
        for metric in cpu_metrics(spec, r):
            q = r.quotas.get(metric)
            if q is not None and q.usage + cpu_usage(st, spec.region, metric) + need > q.limit:
                short = (metric, spec.region, q.limit)
                break
    if short is None:
        return None
    metric, region, limit = short
    loc = "all regions" if region == "global" else f"region {region}"
    return {"code": "QUOTA_EXCEEDED", "message": f"Quota '{metric}' exceeded.  Limit: {limit:.1f} in {loc}."}
