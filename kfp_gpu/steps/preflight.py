"""The preflight step: read every quota and capacity signal concurrently, decide, report.

All reads run at once on a thread pool - every candidate region's cloud quota and node pools, and
(with a Kubernetes ``ApiClient``) the namespace ResourceQuota on ``requests.nvidia.com/gpu``, the
allocatable GPUs of Ready nodes, and the Kueue ClusterQueue when its CRD exists - so total latency is
about one API round trip. A read that fails makes its check UNKNOWN (never ok) with the reason. The cloud side
(quota, pools) and the checkpoint URI are checked here; the cluster-side checks are
:mod:`kfp_gpu.steps.preflight_cluster`.

With a cluster it also detects the provisioner backend (shown with its reason) and, where an autoscaler serves
ProvisioningRequests, asks it check-capacity for the gang (:mod:`kfp_gpu.steps.check_capacity`; bounded wait,
the request deleted afterwards). For ``capacity="reservation"`` the nodes the named reservation still has free
need no new quota (:func:`kfp_gpu.plan.quota.reserved_nodes`).

Public API (wired by the CLI as ``kfp-gpu preflight`` / ``kfp-gpu quota request``):

* :func:`run_preflight` -> :class:`~kfp_gpu.plan.preflight.PreflightResult`
* :func:`check` - raise ``QuotaExceeded`` when nothing fits
* :func:`request_increase` - file a quota increase through the provider
"""

from __future__ import annotations

import functools
import logging
import os
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from kfp_gpu import fanout
from kfp_gpu.errors import InvalidSpec, KfpGpuError, NotFound, QuotaExceeded
from kfp_gpu.plan.placement import candidate_zones, matching_pools, plan_placements
from kfp_gpu.plan.preflight import NOT_ASKED, CapacityNow, ClusterCheck, PreflightResult
from kfp_gpu.plan.quota import QuotaCheck, Verdict, evaluate, needs, reservation_free, reserved_nodes
from kfp_gpu.providers.base import CapacityProvider, PoolState, QuotaAmount
from kfp_gpu.spec import ProvisioningSpec
from kfp_gpu.steps import preflight_cluster

__all__ = ["PreflightResult", "check", "check_checkpoint_uri", "request_increase", "run_preflight", "store_probe"]

log = logging.getLogger(__name__)
# probes an object-store URI: returns a kfp_gpu.checkpoint.probe.ProbeResult (or None: writable), raises: not writable
CheckpointProbe = Callable[[str], Any]
T = TypeVar("T")


def _spawn(fn: Callable[..., T], *args: Any, **kwargs: Any) -> fanout.Task[T]:
    return fanout.spawn(functools.partial(fn, *args, **kwargs))


def run_preflight(
    spec: ProvisioningSpec,
    provider: CapacityProvider,
    kube_api: Any = None,
    *,
    regions: Sequence[str] | None = None,
    checkpoint_probe: CheckpointProbe | None = None,
    run_id: str = "",
    capacity_wait_s: float | None = None,
) -> PreflightResult:
    """Check every candidate region/zone x quota metric (and the cluster, given ``kube_api``) at once.

    ``regions`` adds candidate regions after ``spec.target.region``. ``kube_api`` is a
    ``kubernetes.client.ApiClient``. ``checkpoint_probe`` writes a probe object for s3:// / gs://
    URIs (:func:`store_probe`; the preflight step passes it; without it those are UNKNOWN). ``run_id`` names the check-capacity request (a fresh id when empty);
    ``capacity_wait_s`` bounds the wait for its answer (default :data:`kfp_gpu.steps.check_capacity.WAIT_S`).

    Never raises for a check it cannot make (that check is UNKNOWN); use :func:`check` to fail.
    """
    from kfp_gpu.steps import check_capacity

    started = time.monotonic()
    cands = list(dict.fromkeys([spec.target.region, *(regions or ())]))
    # every read on the shared pool at once (kfp_gpu.fanout: reused threads; nothing here waits on a queued read)
    wait_s = check_capacity.WAIT_S if capacity_wait_s is None else capacity_wait_s
    quota_f = {r: _spawn(provider.quota, spec.accelerator, r, spot=spec.spot) for r in cands}
    pools_f = {r: _spawn(provider.pools, r, sizes=False) for r in cands}
    now_f = _spawn(_capacity_now, spec, kube_api, provider, pools_f[spec.target.region], run_id, wait_s)
    kube_f: dict[str, fanout.Task[ClusterCheck]] = {}
    if kube_api is not None:
        kube_f = {
            "namespace-quota": _spawn(preflight_cluster.namespace_quota, spec, kube_api),
            "kueue": _spawn(preflight_cluster.kueue_check, spec, kube_api),
        }
        nodes_f = _spawn(preflight_cluster.ready_gpu_nodes, spec, kube_api)
    ckpt_f = _spawn(check_checkpoint_uri, spec.checkpoint_uri, checkpoint_probe) if spec.checkpoint_uri else None

    checks_by_region: dict[str, list[QuotaCheck]] = {}
    pools_by_region: dict[str, list[PoolState] | None] = {}
    unknown_by_region: dict[str, list[str]] = {}
    provisioner, capacity_now = now_f.result()
    from kfp_gpu.provisioners import capabilities

    chosen = capabilities(provisioner.get("name", ""))
    via_groups = chosen is not None and chosen.capacity_via_autoscaler_groups
    pool_bound = not (chosen is not None and chosen.launches_without_pools)
    for r in cands:
        try:
            pools_by_region[r] = pools_f[r].result()
        except NotFound as exc:
            pools_by_region[r] = []
            unknown_by_region.setdefault(r, [])
            log.info("preflight: no pools in %s: %s", r, exc.message)
        except Exception as exc:
            pools_by_region[r] = None
            unknown_by_region.setdefault(r, []).append(f"pools: {_msg(exc)}")
        if via_groups and not matching_pools(spec, pools_by_region[r] or []):
            # the autoscaler's node groups are not the cloud's pools here (a self-managed autoscaler):
            # their headroom is the autoscaler's to judge (check-capacity above, the request itself)
            pools_by_region[r] = None
            unknown_by_region.setdefault(r, []).append(
                "pools: the autoscaler's node groups are not visible to the cloud provider")
        checks_by_region[r] = _quota_checks(spec, r, quota_f[r], reserved_nodes(spec, pools_by_region[r]))
    cluster = [f.result() for f in kube_f.values()]
    if kube_api is not None:
        cluster.insert(0, preflight_cluster.capacity_check(spec, nodes_f, pools_by_region.get(spec.target.region),
                                                           pool_bound=pool_bound))
        if spec.topology != "none":
            cluster.insert(1, preflight_cluster.topology_check(spec, nodes_f, pools_by_region.get(spec.target.region)))
    if ckpt_f is not None:
        cluster.append(ckpt_f.result())
    placements = plan_placements(spec, checks_by_region, pools_by_region,
                                 unknown_by_region={r: v for r, v in unknown_by_region.items() if v},
                                 pool_bound=pool_bound)
    reservation: dict[str, Any] = {}
    if spec.capacity.value == "reservation":
        home = pools_by_region.get(spec.target.region)
        reservation = {"name": spec.reservation, "free": reservation_free(spec, home),
                       "nodes": reserved_nodes(spec, home)}
    return PreflightResult(
        spec.accelerator, spec.nodes, spec.gpus_per_node, spec.capacity.value, placements,
        [c for c in cluster if c is not None], time.monotonic() - started, provisioner, capacity_now, reservation,
    )


def _capacity_now(spec: ProvisioningSpec, api: Any, provider: CapacityProvider, pools: fanout.Task[list[PoolState]],
                  run_id: str, wait_s: float) -> tuple[dict[str, str], CapacityNow]:
    """The backend choice and, where an autoscaler serves ProvisioningRequests, its check-capacity answer."""
    from kfp_gpu.steps import check_capacity

    try:
        provisioner, skip = check_capacity.backend(spec, api, provider)
    except Exception as exc:  # detection must never fail preflight
        return {"name": "unknown", "reason": f"detection failed: {_msg(exc)}"}, CapacityNow(NOT_ASKED, _msg(exc))
    if skip:
        return provisioner, CapacityNow(NOT_ASKED, skip)
    try:
        zones = candidate_zones(spec, spec.target.region, pools.result())
    except Exception:
        zones = list(spec.zones)
    return provisioner, check_capacity.ask(spec, api, run_id, zones=zones, wait_s=wait_s)


def check(result: PreflightResult, *, strict: bool = False) -> PreflightResult:
    """Return ``result`` when a placement fits.

    Raises:
        QuotaExceeded: nothing fits (with the shortfalls, how to raise each quota and lead times);
            with ``strict=True`` also when the verdict is only UNKNOWN.
    """
    if result.verdict is Verdict.SHORT:
        raise result.error()
    if strict and result.verdict is Verdict.UNKNOWN:
        raise QuotaExceeded(
            "preflight could not verify capacity: " + "; ".join(result.unknowns),
            remediation="fix the permissions/connectivity named above, or run without --strict",
            unknowns=result.unknowns,
        )
    return result


def request_increase(
    spec: ProvisioningSpec,
    provider: CapacityProvider,
    metric: str,
    region: str,
    value: float,
    justification: str,
) -> str:
    """File a quota increase (``kfp-gpu quota request``). Returns the provider's request id.

    ``metric=""`` means the spec's main metric (GCP regional GPU metric / AWS vCPU quota code);
    ``value<=0`` means "current limit plus what the spec needs" (read from the provider).

    Raises:
        InvalidSpec: no metric/value can be derived, or ``value`` is not above the current limit.
        PermissionDenied, NotFound, CloudError: from the provider.
    """
    region = region or spec.target.region
    main = needs(spec, region)[0]
    metric = metric or main.metric
    if value <= 0:
        rows = provider.quota(spec.accelerator, region, spot=spec.spot)
        row = next((r for r in rows if r.metric == metric), None)
        if row is None or row.limit is None:
            raise InvalidSpec("value", value, f"cannot derive a target for {metric} in {region}; pass --value")
        value = row.limit + (main.amount if metric in main.metrics else spec.total_gpus)
    just = justification or (
        f"kfp-gpu: {spec.nodes} x {spec.gpus_per_node} {spec.accelerator} ({spec.capacity.value}) training runs"
    )
    return provider.request_quota_increase(metric, region, value, just)


def store_probe(run_id: str = "") -> CheckpointProbe:
    """The object-store probe the preflight step runs (:func:`kfp_gpu.checkpoint.probe.probe`): write a small object
    carrying the run id, read it back, delete it."""
    from kfp_gpu.checkpoint.probe import probe

    return lambda uri: probe(uri, run_id=run_id)


PROBE_VERDICT = {"ok": Verdict.FITS, "denied": Verdict.SHORT, "missing": Verdict.SHORT, "failed": Verdict.SHORT,
                 "unknown": Verdict.UNKNOWN}


def check_checkpoint_uri(uri: str, probe: CheckpointProbe | None = None) -> ClusterCheck:
    """Is the checkpoint URI writable? Local paths: write and remove a probe file. Object stores:
    ``probe(uri)`` when given (:func:`store_probe`): its ProbeResult decides (ok -> FITS; denied, missing bucket,
    failed -> SHORT; unreachable -> UNKNOWN); a probe that raises means not writable. Without a probe: UNKNOWN."""
    name = "checkpoint-uri"
    if uri.startswith(("s3://", "gs://")):
        if probe is None:
            return ClusterCheck(name, Verdict.UNKNOWN, f"{uri}: no storage client to probe it",
                                remediation="pass a checkpoint probe (fsspec) to verify write access")
        try:
            res = probe(uri)
        except Exception as exc:
            return ClusterCheck(name, Verdict.SHORT, f"{uri} is not writable: {_msg(exc)}",
                                remediation="grant write access to the bucket/prefix or change checkpoint_uri")
        if res is None:
            return ClusterCheck(name, Verdict.FITS, f"{uri} is writable")
        verdict = PROBE_VERDICT.get(str(getattr(res, "status", "")), Verdict.UNKNOWN)
        return ClusterCheck(name, verdict, f"{uri} is writable ({res.reason})" if verdict is Verdict.FITS
                            else str(res.reason), remediation="" if verdict is Verdict.FITS else str(res.remediation))
    path = uri.removeprefix("file://")
    probe_file = os.path.join(path, f".kfp-gpu-probe-{uuid.uuid4().hex[:8]}")
    try:
        os.makedirs(path, exist_ok=True)
        with open(probe_file, "w") as fh:
            fh.write("ok")
        os.remove(probe_file)
    except OSError as exc:
        return ClusterCheck(name, Verdict.SHORT, f"{uri} is not writable: {exc.strerror or exc}",
                            remediation="fix the directory permissions or change checkpoint_uri")
    return ClusterCheck(name, Verdict.FITS, f"{uri} is writable")


# ---- cloud side ----------------------------------------------------------------------------
def _msg(exc: BaseException) -> str:
    return exc.message if isinstance(exc, KfpGpuError) else f"{type(exc).__name__}: {exc}"


def _quota_checks(spec: ProvisioningSpec, region: str, fut: fanout.Task[list[QuotaAmount]], reserved: int = 0,
                  ) -> list[QuotaCheck]:
    try:
        rows = fut.result()
    except NotFound as exc:
        return [QuotaCheck(n.metric, n.location, n.unit, n.amount, Verdict.SHORT, reason=f"region: {exc.message}")
                for n in needs(spec, region, reserved=reserved)]
    except Exception as exc:
        fix = f" (fix: {exc.remediation})" if isinstance(exc, KfpGpuError) and exc.remediation else ""
        return [QuotaCheck(n.metric, n.location, n.unit, n.amount, Verdict.UNKNOWN,
                           reason=f"quota read failed: {_msg(exc)}{fix}") for n in needs(spec, region, reserved=reserved)]
    return evaluate(spec, region, rows, reserved=reserved)
