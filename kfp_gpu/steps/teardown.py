"""teardown (the ExitHandler): release everything a run owns, found by its run-id label.

Order: training jobs (every job kind of :mod:`kfp_gpu.jobkinds`: PyTorchJobs, TrainJobs) -> balloons -> what every provisioner backend holds (node-pool: pool sizes back to what
the run found, or minus what it added when another run grew the same pool; provisioning-request: the run's
ProvisioningRequests and PodTemplates) -> node claims -> cloud reservations -> ledgers -> leases. Every action is
idempotent: a second or concurrent teardown finds nothing left and is a no-op. It writes the cost report
(GPU-hours provisioned vs used, idle GPU-minutes, $ at catalog rates) from the run's own timeline.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kfp_gpu import jobkinds, provisioners
from kfp_gpu.cluster import balloons, lease, ledger
from kfp_gpu.cluster.nodes import list_nodes, name_of, unclaim
from kfp_gpu.errors import KfpGpuError
from kfp_gpu.ownership import LABEL_RUN_ID, label_safe
from kfp_gpu.providers.base import CapacityProvider
from kfp_gpu.spec import ProvisioningSpec
from kfp_gpu.steps.result import StepResult
from kfp_gpu.timeline import NodeState, Timeline

STEP = "teardown"


@dataclass
class TeardownReport:
    jobs: list[str] = field(default_factory=list)
    balloons: list[str] = field(default_factory=list)
    nodes_released: list[str] = field(default_factory=list)
    nodes_deleted: list[str] = field(default_factory=list)
    pools_restored: dict[str, int] = field(default_factory=dict)
    reservations: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)  # provisioner objects deleted (ProvisioningRequests...)
    ledgers: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def noop(self) -> bool:
        return not (self.jobs or self.balloons or self.nodes_released or self.pools_restored
                    or self.reservations or self.requests or self.ledgers)

    def to_dict(self) -> dict[str, Any]:
        return {"jobs": self.jobs, "balloons": self.balloons, "nodes_released": self.nodes_released,
                "nodes_deleted": self.nodes_deleted, "pools_restored": self.pools_restored, "reservations": self.reservations,
                "requests": self.requests, "ledgers": self.ledgers, "errors": self.errors, "noop": self.noop}


def run(spec: ProvisioningSpec, run_id: str, upstream_json: str, *, api: client.ApiClient | None = None,
        provider: CapacityProvider | None = None) -> StepResult:
    """Raises: nothing for missing objects; KfpGpuError only when the provider cannot be reached at all."""
    from kfp_gpu.cluster.kube import api_client

    api = api or api_client(spec.target)
    provider = provider or provisioners.provider_for(spec)
    report, timeline = release_run(spec, run_id, api, provider)
    from kfp_gpu.report._common import world

    shown, clock_note = world(timeline)  # the report in the world's clock (the rehearsal compresses time)
    cost_md, metrics = _cost(spec, shown)
    metrics.update({"objects_deleted": float(len(report.jobs) + len(report.balloons) + len(report.reservations)),
                    "pools_restored": float(len(report.pools_restored)), "teardown_errors": float(len(report.errors))})
    lines = ["## teardown" + (": nothing left to release (no-op)" if report.noop else "")]
    for key, val in report.to_dict().items():
        if val and key != "noop":
            lines.append(f"- {key}: {val}")
    md = "\n".join(lines) + ("\n\n" + cost_md if cost_md else "") + (f"\n\n_{clock_note}_" if clock_note else "")
    out = {**report.to_dict(), "timeline": timeline.to_json() if timeline.nodes else "", "cost": metrics}
    return StepResult(json.dumps(out, sort_keys=True), metrics, md, _html(spec, shown, md))


def release_run(spec: ProvisioningSpec, run_id: str, api: client.ApiClient, provider: CapacityProvider | None,
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
    for kind in jobkinds.every():  # a kind whose CRD is absent has nothing to delete
        try:
            rep.jobs += kind.delete_for_run(api, ns, run_id)
        except KfpGpuError as exc:  # classified by the job-kind contract, transient ones already retried
            rep.errors.append(f"delete {kind.resource.plural}: {exc.message}")
    rep.balloons = balloons.delete_balloons(api, ns, run_id)
    nodes, _ = list_nodes(api, selector)  # before the release: a backend may delete the run's own nodes
    for backend in provisioners.backends(api, provider):
        out = backend.release(spec, run_id)
        rep.pools_restored.update(out.pools_restored)
        rep.nodes_deleted += out.nodes_deleted
        rep.requests += out.objects
        rep.errors += out.errors
    now = time.time()
    for node in nodes:
        name = name_of(node)
        if name in rep.nodes_deleted or unclaim(api, name):
            rep.nodes_released.append(name)
            tl = timeline.nodes.get(name)
            if tl is not None and tl.state is not NodeState.RELEASED:
                tl.advance(NodeState.RELEASED, now)
    try:
        rep.reservations = provider.release(run_id) if provider is not None else []
    except KfpGpuError as exc:
        rep.errors.append(f"release reservations: {exc.message}")
    for name in rep.reservations:  # the cost report bills a reservation from held to released
        timeline.event("reservation-released", time.time(), name=name)
    for cm in ledgers:
        if ledger.delete(api, cm):
            rep.ledgers.append(cm.metadata.name)
    try:  # the run's heartbeat Leases go last: until here they told the janitor the run was alive
        lease.delete_run_leases(api, ns, run_id)
    except ApiException as exc:
        rep.errors.append(f"delete leases: {exc.reason}")
    for tl in timeline.nodes.values():
        if tl.state is not NodeState.RELEASED:
            tl.advance(NodeState.RELEASED, now)
    return rep, timeline


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
