"""The janitor (`kfp-gpu gc`): reclaim what runs left behind when their exit handler never ran.

Everything kfp-gpu creates carries ``kfp-gpu.io/lease-expires``. A run whose newest lease has expired is
torn down with the spec recorded in its own ledger, exactly as its exit handler would have done. Orphans
without a ledger (balloons, node claims, jobs) are released by their own lease label. Run it as the
CronJob in deploy/janitor-cronjob.yaml.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from kubernetes import client

from kfp_gpu.cluster import balloons, ledger
from kfp_gpu.cluster.nodes import labels_of, list_nodes, name_of, unclaim
from kfp_gpu.providers.base import LABEL_LEASE, LABEL_RUN_ID, CapacityProvider
from kfp_gpu.spec import ProvisioningSpec


@dataclass
class GcReport:
    runs: dict[str, str] = field(default_factory=dict)  # run label -> "released" | "would release" | "live"
    orphans: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        lines = [f"kfp-gpu gc: {len(self.runs)} run(s) seen, {len(self.orphans)} orphan object(s)"]
        lines += [f"  run {r}: {s}" for r, s in sorted(self.runs.items())]
        lines += [f"  orphan {o}" for o in self.orphans]
        return "\n".join(lines)


def _expired(labels: dict[str, str] | None, now: float) -> bool:
    try:
        return float((labels or {}).get(LABEL_LEASE, "inf")) < now
    except ValueError:
        return False


def collect(namespace: str = "default", *, dry_run: bool = False, endpoint: str = "",
            api: client.ApiClient | None = None, provider: CapacityProvider | None = None,
            now: float | None = None) -> GcReport:
    """Tear down runs whose leases all expired; release orphaned objects with expired leases.

    Raises: ApiException when the cluster cannot be listed; KfpGpuError when a provider is unreachable.
    """
    from kfp_gpu.cluster.kube import api_client
    from kfp_gpu.steps.teardown import release_run

    api = api or api_client(None)
    now = time.time() if now is None else now
    rep = GcReport()
    by_run: dict[str, list[client.V1ConfigMap]] = {}
    for cm in ledger.list_for_run(api, namespace, None):
        by_run.setdefault((cm.metadata.labels or {}).get(LABEL_RUN_ID, ""), []).append(cm)
    for run_label, cms in by_run.items():
        if not all(_expired(cm.metadata.labels, now) for cm in cms):
            rep.runs[run_label] = "live"
            continue
        if dry_run:
            rep.runs[run_label] = "would release"
            continue
        data = ledger.data_of(cms[0])
        spec = ProvisioningSpec.from_json(data["spec"])
        run_id = (cms[0].metadata.annotations or {}).get("kfp-gpu.io/run-id-raw", run_label)
        prov = provider or _provider(spec, endpoint)
        release_run(spec, run_id, api, prov)
        rep.runs[run_label] = "released"
    live = {r for r, s in rep.runs.items() if s == "live"}
    core = client.CoreV1Api(api)
    for pod in core.list_namespaced_pod(namespace, label_selector=f"{balloons.BALLOON_LABEL}=true").items:
        if _expired(pod.metadata.labels, now) and (pod.metadata.labels or {}).get(LABEL_RUN_ID) not in live:
            rep.orphans.append(f"pod/{pod.metadata.name}")
            if not dry_run:
                balloons.delete_balloons(api, namespace, (pod.metadata.labels or {}).get(LABEL_RUN_ID))
    nodes, _ = list_nodes(api, LABEL_RUN_ID)
    for node in nodes:
        labels = labels_of(node)
        if _expired(labels, now) and labels.get(LABEL_RUN_ID) not in live:
            rep.orphans.append(f"node-claim/{name_of(node)}")
            if not dry_run:
                unclaim(api, name_of(node))
    return rep


def _provider(spec: ProvisioningSpec, endpoint: str) -> CapacityProvider:
    from kfp_gpu.providers import for_target

    target = spec.target
    if endpoint:
        import dataclasses

        target = dataclasses.replace(target, endpoint=endpoint)
    return for_target(target)
