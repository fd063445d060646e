"""teardown (the ExitHandler): release everything a run owns, found by its run-id label.

Order: PyTorchJobs -> balloons -> node claims -> pool sizes (back to what the run found, or minus
what it added when another run grew the same pool) -> cloud reservations -> ledgers. Every action is
idempotent: a second or concurrent teardown finds nothing left and is a no-op. It writes the cost report
(GPU-hours provisioned vs used, idle GPU-minutes, $ at catalog rates) from the run's own timeline.
"""

from __future__ import annotations

import functools
import json
import time
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kfp_gpu.cluster import balloons, lease, ledger
from kfp_gpu.cluster.nodes import NodeView, list_nodes, name_of, unclaim
from kfp_gpu.errors import KfpGpuError
from kfp_gpu.plan.scale import rollback_sizes
from kfp_gpu.providers.base import LABEL_RUN_ID, CapacityProvider, Operation, Owner, PoolRef, label_safe
from kfp_gpu.spec import ProvisioningSpec
from kfp_gpu.steps.result import StepResult
from kfp_gpu.steps.retry import retry_transient
from kfp_gpu.timeline import NodeState, Timeline

STEP = "teardown"
PYTORCHJOB = ("kubeflow.org", "v1", "pytorchjobs")


@dataclass
class TeardownReport:
    jobs: list[str] = field(default_factory=list)
    balloons: list[str] = field(default_factory=list)
    nodes_released: list[str] = field(default_factory=list)
    nodes_deleted: list[str] = field(default_factory=list)
    pools_restored: dict[str, int] = field(default_factory=dict)
    reservations: list[str] = field(default_factory=list)
    ledgers: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def noop(self) -> bool:
        return not (self.jobs or self.balloons or self.nodes_released or self.pools_restored
                    or self.reservations or self.ledgers)

    def to_dict(self) -> dict[str, Any]:
        return {"jobs": self.jobs, "balloons": self.balloons, "nodes_released": self.nodes_released,
                "nodes_deleted": self.nodes_deleted, "pools_restored": self.pools_restored, "reservations": self.reservations,
                "ledgers": self.ledgers, "errors": self.errors, "noop": self.noop}


def run(spec: ProvisioningSpec, run_id: str, upstream_json: str, *, api: client.ApiClient | None = None,
        provider: CapacityProvider | None = None) -> StepResult:
    """Raises: nothing for missing objects; KfpGpuError only when the provider cannot be reached at all."""
    from kfp_gpu.cluster.kube import api_client
    from kfp_gpu.providers import for_target

    api = api or api_client(spec.target)
    provider = provider or for_target(spec.target)
    report, timeline = release_run(spec, run_id, api, provider)
    cost_md, metrics = _cost(spec, timeline)
    metrics.update({"objects_deleted": float(len(report.jobs) + len(report.balloons) + len(report.reservations)),
                    "pools_restored": float(len(report.pools_restored)), "teardown_errors": float(len(report.errors))})
    lines = ["## teardown" + (": nothing left to release (no-op)" if report.noop else "")]
    for key, val in report.to_dict().items():
        if val and key != "noop":
            lines.append(f"- {key}: {val}")
    md = "\n".join(lines) + ("\n\n" + cost_md if cost_md else "")
    out = {**report.to_dict(), "timeline": timeline.to_json() if timeline.nodes else "", "cost": metrics}
    return StepResult(json.dumps(out, sort_keys=True), metrics, md, _html(spec, timeline, md))


def release_run(spec: ProvisioningSpec, run_id: str, api: client.ApiClient, provider: CapacityProvider,
                ) -> tuple[TeardownReport, Timeline]:
    """Release everything ``run_id`` owns in ``spec.target.namespace``. Idempotent."""
    ns, rep = spec.target.namespace, TeardownReport()
    selector = f"{LABEL_RUN_ID}={label_safe(run_id)}"
    ledgers = sorted(ledger.list_for_run(api, ns, run_id), key=lambda cm: ledger.data_of(cm).get("started", 0))
    timeline = Timeline(run_id)
    for cm in ledgers:
        data = ledger.data_of(cm)
        if data.get("timeline"):
            timeline.merge(Timeline.from_json(data["timeline"]))
    custom = client.CustomObjectsApi(api)
    try:
        jobs = custom.list_namespaced_custom_object(*PYTORCHJOB[:2], ns, PYTORCHJOB[2], label_selector=selector)
        for job in jobs.get("items", []):
            name = job["metadata"]["name"]
            _ignore_404(lambda n=name: custom.delete_namespaced_custom_object(
                *PYTORCHJOB[:2], ns, PYTORCHJOB[2], n, propagation_policy="Foreground"))
            rep.jobs.append(name)
    except ApiException as exc:
        if exc.status != 404:  # CRD absent: nothing to delete
            rep.errors.append(f"list pytorchjobs: {exc.reason}")
    rep.balloons = balloons.delete_balloons(api, ns, run_id)
    nodes, _ = list_nodes(api, selector)
    claimed: dict[PoolRef, list[str]] = {}
    for node in nodes:
        view = NodeView.of(node)
        claimed.setdefault(PoolRef(view.pool, view.zone, spec.target.region), []).append(view.name)
    rep.pools_restored = _restore_pools(spec, provider, run_id, ledgers, rep, claimed)
    now = time.time()
    for node in nodes:
        name = name_of(node)
        if name in rep.nodes_deleted or unclaim(api, name):
            rep.nodes_released.append(name)
            tl = timeline.nodes.get(name)
            if tl is not None and tl.state is not NodeState.RELEASED:
                tl.advance(NodeState.RELEASED, now)
    try:
        rep.reservations = provider.release(run_id)
    except KfpGpuError as exc:
        rep.errors.append(f"release reservations: {exc.message}")
    for cm in ledgers:
        if _ignore_404(lambda n=cm.metadata.name: client.CoreV1Api(api).delete_namespaced_config_map(n, ns)):
            rep.ledgers.append(cm.metadata.name)
    try:  # the run's heartbeat Leases go last: until here they told the janitor the run was alive
        lease.delete_run_leases(api, ns, run_id)
    except ApiException as exc:
        rep.errors.append(f"delete leases: {exc.reason}")
    for tl in timeline.nodes.values():
        if tl.state is not NodeState.RELEASED:
            tl.advance(NodeState.RELEASED, now)
    return rep, timeline


def _restore_pools(spec: ProvisioningSpec, provider: CapacityProvider, run_id: str,
                   ledgers: list[client.V1ConfigMap], rep: TeardownReport,
                   claimed: dict[PoolRef, list[str]]) -> dict[str, int]:
    """Shrink every pool the run grew by what it added.

    When the provider can delete specific nodes (GKE: instanceGroupManagers.deleteInstances), the run's
    own claimed nodes go first, so a parallel run's nodes in the same pool are never the ones removed.
    The rest is a plain resize to ``rollback_sizes`` (the size found, or current - added).
    """
    found: dict[PoolRef, int] = {}
    targets: dict[PoolRef, int] = {}
    region = spec.target.region
    for cm in ledgers:  # oldest first: the earliest step's "found" is what the run found
        data = ledger.data_of(cm)
        for key, size in dict(data.get("found", {})).items():
            pool, zone = key.split("|", 1)
            found.setdefault(PoolRef(pool, zone, region), int(size))
        for key, size in dict(data.get("targets", {})).items():
            pool, zone = key.split("|", 1)
            ref = PoolRef(pool, zone, region)
            targets[ref] = max(targets.get(ref, 0), int(size))
    if not targets:
        return {}
    owner = Owner.for_step(run_id, STEP, 600)
    deleter = getattr(provider, "delete_nodes", None)
    deleted: dict[PoolRef, int] = {}
    if callable(deleter):
        ops: list[Operation] = []
        for ref, target in targets.items():
            victims = claimed.get(ref, [])[: max(0, target - found.get(ref, 0))]
            if victims and retry_transient(functools.partial(_submit, ops, deleter, ref, victims), rep.errors,
                                           f"delete nodes of {ref.pool}"):
                deleted[ref] = len(victims)
                rep.nodes_deleted += victims
        _wait_ops(provider, ops)
    for ref, k in deleted.items():  # those deletions removed k of what the run added
        targets[ref] -= k
    current = {PoolRef(st.ref.pool, st.ref.zone, region): st.size for st in provider.pools(region)}
    restore = rollback_sizes(found, targets, current)
    done: dict[str, int] = {f"{r.pool}|{r.zone}": targets[r] for r in deleted}
    for ref, size in restore.items():
        if retry_transient(functools.partial(provider.resize, ref, size, owner), rep.errors,
                           f"restore {ref.pool} to {size}"):
            done[f"{ref.pool}|{ref.zone}"] = size
    return done


def _submit(ops: list[Operation], deleter: Any, ref: PoolRef, names: list[str]) -> None:
    ops.append(deleter(ref, names))


def _wait_ops(provider: CapacityProvider, ops: list[Operation], timeout_s: float = 30.0) -> None:
    end = time.time() + timeout_s
    pending = list(ops)
    while pending and time.time() < end:
        try:
            pending = [op for op in (provider.operation(o) for o in pending) if not op.done]
        except KfpGpuError:
            pass
        if pending:
            time.sleep(0.05)


def _ignore_404(fn: Any) -> bool:
    try:
        fn()
        return True
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise


def _cost(spec: ProvisioningSpec, tl: Timeline) -> tuple[str, dict[str, float]]:
    try:
        from kfp_gpu.report.cost import cost_report
    except ImportError:
        return "", {}
    if not tl.nodes:
        return "", {}
    rep = cost_report(spec, tl)
    d = {k: float(v) for k, v in rep.to_dict().items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    return rep.to_markdown(), d


def _html(spec: ProvisioningSpec, tl: Timeline, md: str) -> str:
    try:
        from kfp_gpu.report.cost import cost_report
        from kfp_gpu.report.html import render_html

        return render_html(title=f"kfp-gpu teardown and cost ({spec.nodes}x{spec.gpus_per_node} {spec.accelerator})",
                           timeline=tl if tl.nodes else None, cost=cost_report(spec, tl) if tl.nodes else None,
                           summary=md.splitlines()[0].replace("## ", ""))
    except Exception:  # the report must never fail teardown
        return ""
