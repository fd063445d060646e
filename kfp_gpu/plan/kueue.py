"""Kueue decisions (no I/O): which LocalQueue a job goes to, and whether its ClusterQueue has room for the gang.

Kueue v0.17 serves ``kueue.x-k8s.io/v1beta2`` (the storage version) and the deprecated ``v1beta1``; kfp-gpu
reads v1beta2, where a ClusterQueue's cohort is ``spec.cohortName`` and its AdmissionChecks are
``spec.admissionChecksStrategy.admissionChecks[].{name,onFlavors}`` (v1beta1's ``spec.admissionChecks`` list is
converted into that).

Queue choice (:func:`choose_local_queue`): ``target.queue`` names the LocalQueue; when it is empty, the
namespace's only LocalQueue is used, or the one named ``default`` (Kueue itself labels a job without a queue
name with ``default`` when that LocalQueue exists: LocalQueueDefaulting, GA in v0.17); a namespace without
LocalQueues is not gated by Kueue.

Room (:func:`evaluate`): only the ClusterQueue's flavors for ``nvidia.com/gpu`` whose ResourceFlavor
``nodeLabels`` name the run's accelerator count (``cloud.google.com/gke-accelerator`` = the catalog's GKE
label, or an EKS ``node.kubernetes.io/instance-type`` of the accelerator); a flavor without either label is
"unknown", never a fit. Per flavor, the nominal quota, the quota reserved by admitted/reserving workloads
(``status.flavorsReservation``), the borrowing limit and the lending limit are reported separately:

* needed <= nominal - reserved -> FITS;
* it fits only by borrowing unused quota from the cohort (up to the borrowing limit; no limit = unbounded) ->
  UNKNOWN, worded "fits if the cohort lends": the other ClusterQueues' unused quota is theirs to reclaim;
* otherwise SHORT (a full queue), with the amounts.

The lending limit is what this queue lends to its cohort; it neither adds to nor takes from what the run may use
within the nominal quota (lent quota is reclaimed by Kueue's preemption when the queue needs it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from kfp_gpu import accelerators
from kfp_gpu.errors import InvalidSpec
from kfp_gpu.plan.preflight import ClusterCheck
from kfp_gpu.plan.quota import Verdict

GROUP = "kueue.x-k8s.io"
VERSION = "v1beta2"  # served (and stored) by Kueue v0.17; v1beta1 is deprecated there
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
DEFAULT_QUEUE = "default"  # the LocalQueue Kueue defaults an unlabelled job to (LocalQueueDefaulting)
PROVISIONING_CONTROLLER = "kueue.x-k8s.io/provisioning-request"  # AdmissionCheck spec.controllerName
GPU = "nvidia.com/gpu"
GKE_ACCELERATOR_LABEL = "cloud.google.com/gke-accelerator"
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
CHECK_NAME = "kueue"


@dataclass(frozen=True)
class LocalQueueRef:
    """A LocalQueue in the job's namespace and the ClusterQueue it points at (``spec.clusterQueue``)."""

    name: str
    cluster_queue: str


@dataclass(frozen=True)
class FlavorQuota:
    """One flavor's ``nvidia.com/gpu`` quota in a ClusterQueue, with its ResourceFlavor's node labels.

    ``borrowing_limit`` / ``lending_limit`` None = not set (no limit). ``node_labels`` None = the ResourceFlavor
    object does not exist.
    """

    name: str
    nominal: float
    reserved: float = 0.0
    borrowing_limit: float | None = None
    lending_limit: float | None = None
    node_labels: Mapping[str, str] | None = field(default_factory=dict)


@dataclass(frozen=True)
class QueueSetup:
    """What the preflight read about the ClusterQueue behind a LocalQueue.

    ``found`` False = the ClusterQueue does not exist. ``covers_gpu`` False = no resource group covers
    ``nvidia.com/gpu``. ``provisioning_checks`` are the AdmissionChecks whose controller is
    ``kueue.x-k8s.io/provisioning-request``, each with its ``onFlavors`` (empty = every flavor).
    ``inactive`` is the message of an ``Active=False`` condition ("" when active or not yet reported).
    """

    local_queue: LocalQueueRef
    found: bool = True
    cohort: str = ""
    covers_gpu: bool = True
    flavors: tuple[FlavorQuota, ...] = ()
    provisioning_checks: tuple[tuple[str, tuple[str, ...]], ...] = ()
    inactive: str = ""


def choose_local_queue(namespace: str, wanted: str, queues: Sequence[LocalQueueRef]) -> LocalQueueRef | None:
    """The LocalQueue a job in ``namespace`` goes to, given the namespace's LocalQueues.

    None when ``wanted`` is empty and the namespace has no LocalQueue (Kueue does not gate the job).

    Raises:
        InvalidSpec: ``wanted`` is not among ``queues``; or ``wanted`` is empty and there are several LocalQueues,
            none named ``default``.
    """
    names = sorted(q.name for q in queues)
    have = ", ".join(names) or "none"
    if wanted:
        for q in queues:
            if q.name == wanted:
                return q
        raise InvalidSpec("target.queue", wanted, f"no LocalQueue {wanted} in namespace {namespace}; have: {have}",
                          remediation=f"set target.queue to one of: {have}" if names else
                          f"create LocalQueue {wanted} in namespace {namespace}, or leave target.queue empty")
    if not queues:
        return None
    if len(queues) == 1:
        return queues[0]
    for q in queues:
        if q.name == DEFAULT_QUEUE:
            return q
    raise InvalidSpec("target.queue", wanted, f"namespace {namespace} has several Kueue LocalQueues: {have}",
                      remediation=f"set target.queue to the LocalQueue to submit to (one of: {have})")


def flavor_match(labels: Mapping[str, str] | None, accelerator: str) -> str:
    """``"match"``, ``"other"`` (the labels name another accelerator) or ``"unknown"`` (no accelerator label,
    or the ResourceFlavor is missing: ``labels`` None)."""
    if labels is None:
        return "unknown"
    acc = accelerators.get(accelerator)
    verdicts = []
    if GKE_ACCELERATOR_LABEL in labels:
        verdicts.append(labels[GKE_ACCELERATOR_LABEL] == acc.gke_label)
    if INSTANCE_TYPE_LABEL in labels:
        verdicts.append(labels[INSTANCE_TYPE_LABEL] in {m.name for m in acc.aws_instances})
    if not verdicts:
        return "unknown"
    return "match" if any(verdicts) else "other"


def provisioning_check(setup: QueueSetup, flavor: str = "") -> str:
    """The name of the ClusterQueue's ProvisioningRequest AdmissionCheck (for ``flavor`` when given), or ""."""
    for name, on_flavors in setup.provisioning_checks:
        if not flavor or not on_flavors or flavor in on_flavors:
            return name
    return ""


def _lim(v: float | None) -> str:
    return "none" if v is None else f"{v:g}"


def _describe(f: FlavorQuota) -> str:
    return (f"flavor {f.name}: nominal {f.nominal:g}, reserved {f.reserved:g}, borrowing limit "
            f"{_lim(f.borrowing_limit)}, lending limit {_lim(f.lending_limit)}")


def _borrow_room(f: FlavorQuota, cohort: str) -> float | None:
    """How much more than the free nominal quota the flavor may borrow (None = unbounded)."""
    if not cohort:
        return 0.0
    if f.borrowing_limit is None:
        return None
    return max(0.0, f.borrowing_limit - max(0.0, f.reserved - f.nominal))


def evaluate(setup: QueueSetup, accelerator: str, needed: float) -> ClusterCheck:
    """The Kueue check for a run that needs ``needed`` GPUs of ``accelerator`` (see the module docstring)."""
    lq, cq = setup.local_queue, setup.local_queue.cluster_queue
    head = f"LocalQueue {lq.name} -> ClusterQueue {cq}" + (f" (cohort {setup.cohort})" if setup.cohort else "")
    prov = provisioning_check(setup)
    tail = f"; ProvisioningRequest AdmissionCheck: {prov}" if prov else ""
    fix_quota = f"raise nominalQuota of {GPU} in ClusterQueue {cq}"

    def out(verdict: Verdict, text: str, free: float | None = None, fix: str = "") -> ClusterCheck:
        return ClusterCheck(CHECK_NAME, verdict, f"{head}: {text}{tail}", needed, free, fix)

    if not setup.found:
        return out(Verdict.SHORT, "the ClusterQueue does not exist, so Kueue admits nothing from this LocalQueue",
                   fix=f"create ClusterQueue {cq} or point LocalQueue {lq.name} at an existing one")
    if setup.inactive:
        return out(Verdict.SHORT, f"the ClusterQueue is not active ({setup.inactive})",
                   fix=f"fix ClusterQueue {cq} so that it becomes Active")
    if not setup.covers_gpu:
        return out(Verdict.SHORT, f"no resource group covers {GPU}, so Kueue cannot admit a GPU job",
                   fix=f"add {GPU} to a resource group of ClusterQueue {cq}")
    kinds: dict[str, list[FlavorQuota]] = {"match": [], "other": [], "unknown": []}
    for f in setup.flavors:
        kinds[flavor_match(f.node_labels, accelerator)].append(f)
    skipped = "; ".join(f"{f.name} is {_accel_of(f.node_labels)}" for f in kinds["other"])
    skipped = f"; other accelerators not counted: {skipped}" if skipped else ""
    unknown = ", ".join(f.name + (" (no such ResourceFlavor)" if f.node_labels is None else "")
                        for f in kinds["unknown"])
    unknown_txt = (f"; flavor(s) {unknown} have no {GKE_ACCELERATOR_LABEL} node label, so whether they are "
                   f"{accelerator} is unknown") if unknown else ""
    matching = kinds["match"]
    described = "; ".join(_describe(f) for f in matching) or f"no flavor for {accelerator}"
    text = described + skipped + unknown_txt
    label_fix = (f"give ResourceFlavor(s) {unknown} the node label {GKE_ACCELERATOR_LABEL}="
                 f"{accelerators.get(accelerator).gke_label}") if unknown else ""
    if not matching:
        if unknown:
            return out(Verdict.UNKNOWN, text, fix=label_fix)
        return out(Verdict.SHORT, text, 0.0, f"add a flavor whose ResourceFlavor has nodeLabels {GKE_ACCELERATOR_LABEL}="
                   f"{accelerators.get(accelerator).gke_label} to ClusterQueue {cq}")
    free = {f.name: max(0.0, f.nominal - f.reserved) for f in matching}
    best = max(matching, key=lambda f: free[f.name])
    if free[best.name] >= needed:
        return out(Verdict.FITS, f"{text}; fits in flavor {best.name} ({free[best.name]:g} free)", free[best.name])
    for f in sorted(matching, key=lambda f: -free[f.name]):
        room = _borrow_room(f, setup.cohort)
        if room is None or free[f.name] + room >= needed:
            more = needed - free[f.name]
            return out(Verdict.UNKNOWN, f"{text}; fits if the cohort lends: flavor {f.name} has {free[f.name]:g} free "
                       f"within its nominal quota and needs {more:g} more borrowed from cohort {setup.cohort}",
                       free[f.name], f"{fix_quota} flavor {f.name} by {more:g}, or make sure cohort {setup.cohort} "
                       f"has {more:g} unused")
    if sum(free.values()) >= needed and len(matching) > 1:
        return out(Verdict.UNKNOWN, f"{text}; fits only split across flavors (Kueue gives each pod set one flavor)",
                   free[best.name], f"{fix_quota} flavor {best.name} to {best.reserved + needed:g}")
    if unknown:
        return out(Verdict.UNKNOWN, text, free[best.name], label_fix)
    return out(Verdict.SHORT, f"{text}; the queue is full for this run: {free[best.name]:g} free, needs {needed:g}",
               free[best.name], f"{fix_quota} flavor {best.name} to at least {best.reserved + needed:g}, or wait for "
               "the queue's workloads to finish")


def _accel_of(labels: Mapping[str, str] | None) -> str:
    labels = labels or {}
    return labels.get(GKE_ACCELERATOR_LABEL) or labels.get(INSTANCE_TYPE_LABEL) or "?"


def not_gated(namespace: str, reason: str = "") -> ClusterCheck:
    """The check when Kueue does not gate the namespace (not installed, or no LocalQueue)."""
    return ClusterCheck(CHECK_NAME, Verdict.FITS, reason or f"no Kueue LocalQueue in namespace {namespace}; "
                        "Kueue does not gate it")

