"""The janitor (`kfp-gpu gc`): reclaim what runs left behind when their exit handler never ran.

A run that still has a GpuGang belongs to the controller, which releases it when its owner is gone or the gang is
deleted (the finalizer): the janitor never touches it. What it sweeps are orphans: objects of runs whose GpuGang is
gone (a finalizer removed by hand, a run of a version before the controller). It groups every kfp-gpu object by run
(ledgers, balloon pods, claimed Nodes, PyTorchJobs, run Leases of older versions; in one namespace or, with
``all_namespaces``, in all of them) and releases a gang-less run only when its lease labels expired (``lease_ttl_s``
after the objects were written) **and** no live owner is found (:func:`kfp_gpu.plan.lease.decide`): a step pod that still exists and has not
finished, an Argo Workflow still running (checked only when the Workflow CRD is served), or a
``local:<host>:<pid>`` process alive on this host keeps the run. A run with a ledger that recorded its spec
is torn down exactly as its exit handler would have done (:func:`kfp_gpu.steps.teardown.release_run`); what
is left (or a run without a spec) is released object by object.

Before releasing anything it takes the Lease lock ``kfp-gpu-janitor`` (:class:`kfp_gpu.cluster.lease.
JanitorLock`) in the namespace it runs in, so two janitors never race; the second one reports who holds the
lock and does nothing. An admin tool: the controller releases a gang whose owner is gone by itself; run
``kfp-gpu gc`` with the kfp-gpu-janitor ServiceAccount of deploy/janitor-rbac.yaml (or as an admin).
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Collection
from dataclasses import dataclass, field

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kfp_gpu import ownership
from kfp_gpu.cluster import lease, ledger, owned
from kfp_gpu.cluster.nodes import unclaim
from kfp_gpu.cluster.owners import Owners
from kfp_gpu.errors import KfpGpuError
from kfp_gpu.ownership import LABEL_LEASE, LABEL_RUN_ID, label_safe
from kfp_gpu.plan.lease import (
    LeaseRecord,
    Verdict,
    decide,
    label_expiry,
    owners_to_check,
    run_expiry,
)
from kfp_gpu.providers.base import CapacityProvider
from kfp_gpu.spec import ProvisioningSpec

log = logging.getLogger(__name__)


@dataclass
class GcReport:
    runs: dict[str, str] = field(default_factory=dict)  # run label -> "released" | "would release" | "live" | "error"
    reasons: dict[str, str] = field(default_factory=dict)  # run label -> why (the decision, or the failure)
    namespaces: dict[str, list[str]] = field(default_factory=dict)  # run label -> namespaces it has objects in
    orphans: list[str] = field(default_factory=list)  # objects released one by one ("kind ns/name")
    errors: list[str] = field(default_factory=list)
    scope: str = ""
    lock: str = ""
    lock_held_by: str = ""  # set when another janitor held the lock and this one did nothing

    def __str__(self) -> str:
        count = {s: sum(1 for v in self.runs.values() if v == s) for s in ("released", "would release", "live",
                                                                              "error")}
        head = f"kfp-gpu gc ({self.scope}): "
        if self.lock_held_by:
            return head + self.lock
        lines = [head + f"{len(self.runs)} run(s) seen: " + ", ".join(f"{n} {s}" for s, n in count.items() if n)
                 + (f"; {len(self.orphans)} object(s) released" if self.orphans else "")]
        if self.lock:
            lines.append(f"  lock: {self.lock}")
        for run, status in sorted(self.runs.items()):
            where = ",".join(self.namespaces.get(run, [])) or "-"
            lines.append(f"  run {run} [{where}]: {status} ({self.reasons.get(run, '')})")
        lines += [f"  released {o}" for o in self.orphans]
        lines += [f"  error: {e}" for e in self.errors]
        return "\n".join(lines)


@dataclass
class _Run:
    label: str
    run_id: str = ""
    objects: list[tuple[owned.Kind, owned.Obj]] = field(default_factory=list)
    leases: list[LeaseRecord] = field(default_factory=list)
    namespaces: set[str] = field(default_factory=set)
    spec_json: str = ""

    def label_expiries(self) -> list[float]:
        values = (label_expiry(owned.labels(o).get(LABEL_LEASE)) for _, o in self.objects)
        return [v for v in values if v is not None]


def collect(namespace: str = "default", *, dry_run: bool = False, endpoint: str = "",
            api: client.ApiClient | None = None, provider: CapacityProvider | None = None,
            now: float | None = None, all_namespaces: bool = False, lock_namespace: str = "",
            holder: str = "", runs: Collection[str] = ()) -> GcReport:
    """Release every run whose leases all expired and whose owners are gone; report the rest and why.

    ``namespace`` scopes the sweep unless ``all_namespaces``: claimed Nodes (cluster-scoped) count there only
    for runs with objects in that namespace, or that a heartbeat tied to it. ``runs`` limits it to these run ids. The lock lives
    in ``lock_namespace`` (default: the namespace this pod runs in, else ``namespace``); ``holder`` names
    this janitor in it. ``now`` overrides the clock for the lease decision. A dry run takes no lock and
    changes nothing.

    Raises:
        ApiException: the cluster cannot be listed or the lock cannot be read.
    """
    from kfp_gpu.cluster.kube import api_client

    api = api or api_client(None)
    scope = None if all_namespaces else namespace
    rep = GcReport(scope="all namespaces" if all_namespaces else f"namespace {namespace}")
    lock = None
    if not dry_run:
        lock = lease.JanitorLock(api, lock_namespace or lease.own_namespace(namespace), holder)
        if not lock.acquire():
            until = dt.datetime.fromtimestamp(lock.held_until or 0, dt.timezone.utc).strftime("%H:%M:%SZ")
            rep.lock_held_by = lock.held_by
            rep.lock = f"{lock.where} held by {lock.held_by} (until {until}); nothing done"
            return rep
        rep.lock = f"{lock.where} held by this janitor ({lock.holder})"
    try:
        _sweep(api, scope, {label_safe(r) for r in runs}, rep, lock, provider, endpoint, now)
    finally:
        if lock is not None:
            lock.release()
    return rep


def _sweep(api: client.ApiClient, scope: str | None, only: set[str], rep: GcReport, lock: lease.JanitorLock | None,
           provider: CapacityProvider | None, endpoint: str, now: float | None) -> None:
    found = _gather(api, scope, only)
    gangs = _gangs(api, scope)  # listed after the objects: a run's gang exists before anything of it is made
    owners = Owners(api)
    t = time.time() if now is None else now
    for label, run in sorted(found.items()):
        rep.namespaces[label] = sorted(run.namespaces)
        held = sorted(gangs.get((ns, label), "") for ns in run.namespaces if (ns, label) in gangs)
        if held:
            rep.runs[label] = "live"
            rep.reasons[label] = (f"GpuGang {', '.join(held)} exists: the controller releases the run (delete the "
                                  "gang to release it now)")
            continue
        expiry = run_expiry(run.leases, run.label_expiries())
        states = {} if expiry >= t else {o: owners.state(o) for o in owners_to_check(run.leases)}
        verdict: Verdict = decide(run.leases, run.label_expiries(), states, t)
        rep.reasons[label] = verdict.reason
        if not verdict.release:
            rep.runs[label] = "live"
            continue
        if lock is None:
            rep.runs[label] = "would release"
            continue
        if not lock.renew():
            rep.errors.append(f"lock lost to {lock.held_by}: stopped before run {label}")
            break
        try:
            _release(api, run, scope, provider, endpoint, rep)
            rep.runs[label] = "released"
        except (KfpGpuError, ApiException) as exc:
            msg = exc.message if isinstance(exc, KfpGpuError) else f"{exc.status} {exc.reason}"
            rep.runs[label] = "error"
            rep.reasons[label] += f"; release failed, retried next time: {msg}"


def _gangs(api: client.ApiClient, scope: str | None) -> dict[tuple[str, str], str]:
    """(namespace, run label) -> "namespace/name" of every GpuGang in scope; {} where the CRD is not served.
    Raises: ApiException (other than 404)."""
    from kfp_gpu.gang import api as gang

    path = f"/apis/{gang.API_VERSION}" + (f"/namespaces/{scope}" if scope else "") + f"/{gang.PLURAL}"
    try:
        items = owned.request(api, "GET", path).get("items") or []
    except ApiException as exc:
        if exc.status == 404:
            return {}
        raise
    out: dict[tuple[str, str], str] = {}
    for g in items:
        md = owned.meta(g)
        run = str((g.get("spec") or {}).get("runId") or "")
        if run:
            out[(str(md.get("namespace")), label_safe(run))] = f"{md.get('namespace')}/{md.get('name')}"
    return out


def _gather(api: client.ApiClient, scope: str | None, only: set[str]) -> dict[str, _Run]:
    found: dict[str, _Run] = {}

    def run_of(obj: owned.Obj) -> _Run | None:
        label = owned.labels(obj).get(LABEL_RUN_ID, "")
        if not label or (only and label not in only):
            return None
        run = found.setdefault(label, _Run(label))
        ns = owned.labels(obj).get(ledger.TENANT_LABEL) or owned.meta(obj).get("namespace")  # a ledger: its gang's
        if ns:
            run.namespaces.add(str(ns))
        raw = (owned.meta(obj).get("annotations") or {}).get(ownership.RUN_ID_RAW_ANNOTATION)
        run.run_id = run.run_id or str(raw or "")
        return run

    for kind in (owned.LEDGER, owned.BALLOON, *owned.JOBS, owned.PROVREQ, owned.PODTEMPLATE):
        sel = kind.selector
        for obj in owned.list_objects(api, kind, scope, sel):
            run = run_of(obj)
            if run is not None:
                run.objects.append((kind, obj))
                if kind is owned.LEDGER and not run.spec_json:
                    run.spec_json = str(ledger.data_of_json(obj).get("spec") or "")
    for obj in owned.list_objects(api, owned.LEASE, scope, owned.LEASE.selector):
        run = run_of(obj)
        if run is not None:
            run.leases.append(lease.lease_record(obj))
    for obj in owned.list_objects(api, owned.NODE, None, LABEL_RUN_ID):
        # Nodes are cluster-wide. A namespaced janitor takes a claim only for a run it sees in its namespace
        # (or that a heartbeat tied to it); the rest belong to other namespaces' runs (--all-namespaces).
        home, label = owned.node_namespace(obj), owned.labels(obj).get(LABEL_RUN_ID, "")
        if scope is not None and (home != scope if home else label not in found):
            continue
        run = run_of(obj)
        if run is not None:
            run.objects.append((owned.NODE, obj))
    for kind in owned.CLUSTER_SCOPED:  # NodePools, ComputeClasses: cluster-scoped, like Nodes
        for obj in owned.list_objects(api, kind, None, LABEL_RUN_ID):
            if scope is not None and owned.node_namespace(obj) != scope:
                continue
            run = run_of(obj)
            if run is not None:
                run.objects.append((kind, obj))
    for run in found.values():
        run.run_id = run.run_id or run.label
    return found


def _release(api: client.ApiClient, run: _Run, scope: str | None, provider: CapacityProvider | None,
             endpoint: str, rep: GcReport) -> None:
    """Tear the run down with its own spec when a ledger has it, then release what is left one by one."""
    from kfp_gpu.steps.teardown import release_run

    if run.spec_json:
        spec = ProvisioningSpec.from_json(run.spec_json)
        teardown, _ = release_run(spec, run.run_id, api, provider or _provider(spec, endpoint))
        rep.errors += [f"run {run.label}: {e}" for e in teardown.errors]
    else:
        rep.reasons[run.label] += "; no ledger with a spec: pool sizes left as they are"
    for ns in sorted(run.namespaces) if scope is None else [scope]:
        for kind, obj in owned.run_objects(api, ns, run.run_id, (*owned.JOBS, owned.PROVREQ, owned.PODTEMPLATE,
                                                                     owned.BALLOON, owned.LEDGER)):
            if owned.delete(api, kind, obj):
                rep.orphans.append(owned.ident(kind, obj))
    for kind, obj in owned.run_objects(api, None, run.run_id, owned.CLUSTER_SCOPED):  # Karpenter / GKE remove the nodes
        if (scope is None or owned.node_namespace(obj) in ("", scope)) and owned.delete(api, kind, obj):
            rep.orphans.append(owned.ident(kind, obj))
    for _, obj in owned.run_objects(api, None, run.run_id, (owned.NODE,)):
        if scope is None or owned.node_namespace(obj) in ("", scope):
            if unclaim(api, str(owned.meta(obj).get("name"))):
                rep.orphans.append(owned.ident(owned.NODE, obj))
    for ns in sorted(run.namespaces) if scope is None else [scope]:
        lease.delete_run_leases(api, ns, run.run_id)


def _provider(spec: ProvisioningSpec, endpoint: str) -> CapacityProvider:
    from kfp_gpu.providers import for_target

    target = spec.target
    if endpoint:
        import dataclasses

        target = dataclasses.replace(target, endpoint=endpoint)
    return for_target(target)
