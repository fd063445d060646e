"""Recovery decisions for a running gang: pure functions over observed facts, in virtual time.

Nothing here does I/O or reads a clock: callers pass ``now`` and the facts a watch produced
(:class:`NodeFact`, :class:`PodFact`, :class:`NodeIncident`). The train step turns watch events into
facts, asks :func:`classify` what happened, then :func:`decide` what to do about it.

Classification (first match wins, preemption evidence always beats application failure, because peers
of a lost node die with NCCL errors that look like application failures):

1. a gang node deleted, shutting down (the kubelet's graceful node shutdown: ``Ready=False`` with the message
   :data:`NODE_SHUTTING_DOWN`, what GKE's Spot VMs show first), or tainted for shutdown (:data:`SHUTDOWN_TAINTS`)
   -> PREEMPTION of that node;
   then an eviction by Kueue (``queue_evicted``, see :mod:`kfp_gpu.plan.admission`) -> QUEUE_EVICTION: the
   gang's nodes are kept, the job waits in its queue again (its pods die with 143 or vanish; not the app's fault);
2. a pod with a ``DisruptionTarget`` condition or an eviction reason (:data:`EVICTION_REASONS`)
   -> PREEMPTION (of the pod's node when that node is unhealthy; of no node for scheduler preemption). The
   kubelet's ``TerminationByKubelet`` comes with its node's shutdown, but the two arrive on different watches in
   either order: that verdict is final only :data:`KUBELET_SETTLE_S` later, so the node's signal can name the
   lost node (rule 1) instead of a second preemption being counted when it arrives;
3. a pod that exited 137/143 within :data:`NODE_EVENT_WINDOW_S` after a node incident -> PREEMPTION;
4. any other failed pod, or a Failed job condition -> APP_FAILURE, committed only once
   :data:`APP_FAILURE_SETTLE_S` passed with no preemption evidence (the caller re-classifies until then).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from kfp_gpu.spec import Recovery

DISRUPTION_CONDITION = "DisruptionTarget"
# The kubelet's graceful node shutdown sets the Node's Ready condition False with this message, then terminates the
# pods (kubernetes.io/docs/concepts/cluster-administration/node-shutdown/). GKE enables it on every node since 1.20;
# on a Spot/preemptible VM it is the earliest signal in the API (the 30 s ACPI notice starts it).
NODE_SHUTTING_DOWN = "node is shutting down"
# Taints some actor documents setting on a node that is about to go; each entry names its source.
SHUTDOWN_TAINTS: frozenset[str] = frozenset({
    # GoogleCloudPlatform/k8s-node-termination-handler (deprecated: GKE >= 1.20 uses graceful node shutdown instead,
    # and sets no taint); kept for clusters that still run the handler
    "cloud.google.com/impending-node-termination",
    # non-graceful node shutdown (kubernetes.io/docs/concepts/cluster-administration/node-shutdown/)
    "node.kubernetes.io/out-of-service",
    # cluster-autoscaler marks a node it is deleting (autoscaler FAQ, "What are the taints the CA uses?"); not
    # DeletionCandidateOfClusterAutoscaler: a soft PreferNoSchedule mark the autoscaler lifts once pods need the node
    "ToBeDeletedByClusterAutoscaler",
    # the cloud node lifecycle controller: the VM is shut down (kubernetes.io/docs/reference/labels-annotations-taints/)
    "node.cloudprovider.kubernetes.io/shutdown",
    # aws-node-termination-handler with taintNode (github.com/aws/aws-node-termination-handler, README "Taints")
    "aws-node-termination-handler/spot-itn",
    "aws-node-termination-handler/rebalance-recommendation",
    # Karpenter taints a node it is draining (karpenter.sh/docs/concepts/disruption/)
    "karpenter.sh/disrupted",
})
EVICTION_REASONS: frozenset[str] = frozenset({
    "Evicted", "TerminationByKubelet", "DeletionByTaintManager", "PreemptionByScheduler",
    "PreemptionByKubeScheduler", "EvictionByEvictionAPI", "DeletionByPodGC", "NodeShutdown", "Terminated",
})
PREEMPT_EXIT_CODES: frozenset[int] = frozenset({137, 143})  # SIGKILL / SIGTERM
NODE_EVENT_WINDOW_S = 120.0  # a 137/143 exit this soon after a node incident is the incident's fallout
APP_FAILURE_SETTLE_S = 2.0  # wait this long for preemption evidence before blaming the application
KUBELET_SETTLE_S = 1.0  # wait this long after a pod's TerminationByKubelet for its node's shutdown signal


class Cause(str, enum.Enum):
    NONE = "none"
    PREEMPTION = "preemption"
    APP_FAILURE = "app-failure"
    QUEUE_EVICTION = "queue-eviction"  # Kueue took the quota back (Preempted, PodsReadyTimeout, ...)
    STALL = "stall"  # no training progress for the stall timeout (kfp_gpu.plan.stall); pods still Running
    STRAGGLER = "straggler"  # stragglers="replace": a straggler's node swapped at the next checkpoint boundary


@dataclass(frozen=True)
class NodeFact:
    name: str
    at: float
    exists: bool = True
    ready: bool = True
    unschedulable: bool = False
    taints: tuple[str, ...] = ()
    gpus: float = 0.0  # allocatable nvidia.com/gpu
    zone: str = ""
    claimed_by: str = ""  # the kfp-gpu.io/run-id claim label ("" when unclaimed)
    uid: str = ""  # the Node object's uid: a VM recreated under the same name is a new Node
    shutting_down: bool = False  # Ready=False with the message NODE_SHUTTING_DOWN (graceful node shutdown)
    conditions: tuple[tuple[str, str], ...] = ()  # (type, status) of every condition but Ready (GPU health)


@dataclass(frozen=True)
class PodFact:
    name: str
    node: str
    at: float
    phase: str = "Pending"  # Pending | Running | Succeeded | Failed | Unknown
    exit_code: int | None = None
    disruption: str = ""  # reason of a DisruptionTarget=True condition, "" when none
    reason: str = ""  # status.reason or the terminated container's reason
    deleted: bool = False
    terminating: bool = False
    role: str = ""  # master | worker
    owner_uid: str = ""


@dataclass(frozen=True)
class NodeIncident:
    node: str
    at: float
    reason: str  # "deleted" | a shutdown taint key | "NotReady"
    uid: str = ""  # which incarnation of the node (see NodeFact.uid)


@dataclass(frozen=True)
class Verdict:
    cause: Cause
    at: float = 0.0  # time of the evidence that decided it
    lost_nodes: tuple[str, ...] = ()
    reason: str = ""
    pods: tuple[str, ...] = ()
    settle_until: float | None = None  # not final before this time (APP_FAILURE; a kubelet termination)

    def final(self, now: float) -> bool:
        return self.cause is not Cause.NONE and (self.settle_until is None or now >= self.settle_until)


def node_shutdown_reason(node: NodeFact) -> str:
    """Why ``node`` is going away ("deleted", :data:`NODE_SHUTTING_DOWN`, the shutdown taint key), or "" when it
    is not."""
    if not node.exists:
        return "deleted"
    if node.shutting_down:
        return NODE_SHUTTING_DOWN
    for key in node.taints:
        if key in SHUTDOWN_TAINTS:
            return key
    return ""


def gang_ready(gang: Iterable[str], nodes: Mapping[str, NodeFact], gpus_per_node: int) -> tuple[str, ...]:
    """The gang nodes that are NOT usable yet (missing, NotReady, cordoned, going away, too few GPUs)."""
    missing = []
    for name in gang:
        n = nodes.get(name)
        if (n is None or not n.exists or not n.ready or n.unschedulable or node_shutdown_reason(n)
                or n.gpus < gpus_per_node):
            missing.append(name)
    return tuple(missing)


def gang_losses(gang: Iterable[str], nodes: Mapping[str, NodeFact], run_label: str) -> tuple[str, ...]:
    """The gang nodes lost for good, as opposed to merely not Ready yet.

    A node is lost when it is absent or deleted, shutting down or tainted for shutdown (a preemption notice), or claimed by
    another run. Lost nodes must be replaced (and counted as a preemption); nodes that are only NotReady
    or still lack GPUs are waited for. An *unclaimed* gang node is not lost: a managed instance group
    recreates a preempted VM under the same name, and the fresh Node is this run's again once claimed
    (:func:`unclaimed`).
    """
    lost = []
    for name in gang:
        n = nodes.get(name)
        if n is None or node_shutdown_reason(n) or (n.claimed_by and n.claimed_by != run_label):
            lost.append(name)
    return tuple(lost)


def unclaimed(gang: Iterable[str], nodes: Mapping[str, NodeFact]) -> tuple[str, ...]:
    """Gang nodes that exist, are not going away, and carry no run's claim: to be claimed (again)."""
    return tuple(n for n in gang if n in nodes and not nodes[n].claimed_by and not node_shutdown_reason(nodes[n]))


def loss_reason(name: str, nodes: Mapping[str, NodeFact], run_label: str) -> str:
    """Why :func:`gang_losses` counted ``name`` as lost, for the ledger and the timeline."""
    n = nodes.get(name)
    if n is None:
        return "missing"
    why = node_shutdown_reason(n)
    if why:
        return why
    return f"claimed by run {n.claimed_by}" if n.claimed_by and n.claimed_by != run_label else ""


def classify(
    gang: Iterable[str],
    incidents: Mapping[str, NodeIncident],
    pods: Iterable[PodFact],
    *,
    now: float,
    job_failed: str = "",
    queue_evicted: str = "",
    queue_evicted_at: float | None = None,
) -> Verdict:
    """What happened to the gang, from node incidents (keyed by node) and the current attempt's pods.

    ``job_failed`` is the reason of a Failed job condition ("" when the job has not failed);
    ``queue_evicted`` the reason Kueue evicted the job's Workload ("" when it did not), seen at
    ``queue_evicted_at`` (default ``now``).
    """
    gang_set = frozenset(gang)
    lost = sorted((i for i in incidents.values() if i.node in gang_set), key=lambda i: i.at)
    if lost:
        return Verdict(Cause.PREEMPTION, lost[0].at, tuple(i.node for i in lost),
                       f"node {lost[0].node}: {lost[0].reason}")
    if queue_evicted:
        return Verdict(Cause.QUEUE_EVICTION, now if queue_evicted_at is None else queue_evicted_at, (), queue_evicted)
    pod_list = sorted(pods, key=lambda p: p.at)
    for p in pod_list:
        why = p.disruption or (p.reason if p.reason in EVICTION_REASONS else "")
        if why:
            gone = (p.node,) if p.node and p.node in incidents else ()
            settle = p.at + KUBELET_SETTLE_S if why == "TerminationByKubelet" and p.node and not gone else None
            return Verdict(Cause.PREEMPTION, p.at, gone, f"pod {p.name}: {why}", (p.name,), settle_until=settle)
    recent = [i for i in incidents.values() if 0.0 <= now - i.at <= NODE_EVENT_WINDOW_S]
    failed = [p for p in pod_list if p.phase == "Failed" or (p.exit_code not in (None, 0))]
    for p in failed:
        if p.exit_code in PREEMPT_EXIT_CODES and recent:
            return Verdict(Cause.PREEMPTION, p.at, tuple(sorted({i.node for i in recent} & gang_set)),
                           f"pod {p.name} exited {p.exit_code} after node {recent[0].node} {recent[0].reason}",
                           (p.name,))
    if failed:
        first = failed[0]
        return Verdict(Cause.APP_FAILURE, first.at, (), f"pod {first.name} exited {first.exit_code}"
                       + (f" ({first.reason})" if first.reason else ""), tuple(p.name for p in failed),
                       settle_until=first.at + APP_FAILURE_SETTLE_S)
    if job_failed:
        return Verdict(Cause.APP_FAILURE, now, (), f"job failed: {job_failed}", settle_until=now + APP_FAILURE_SETTLE_S)
    return Verdict(Cause.NONE, now)


# ---- budget -------------------------------------------------------------------------------------

class Action(str, enum.Enum):
    RESUME = "resume"  # preemption (or queue eviction) within budget: re-provision what was lost and resume
    RETRY = "retry"  # application failure within its retry budget: restart from the checkpoint
    FAIL = "fail"  # application failure, retries used up -> TrainingFailed
    EXHAUSTED = "exhausted"  # preemption budget used up -> RecoveryBudgetExhausted


@dataclass(frozen=True)
class Budget:
    """What a run has used so far. Lives in the step ledger, so a retried step keeps counting."""

    preemptions: int = 0
    app_failures: int = 0
    on_demand: bool = False  # fallback already engaged


@dataclass(frozen=True)
class Decision:
    action: Action
    budget: Budget  # after counting this incident
    on_demand: bool = False  # re-provision on-demand instead of spot
    remaining: int = 0  # preemptions (or app retries) still allowed after this one
    message: str = ""


def decide(policy: Recovery, *, spot: bool, budget: Budget, verdict: Verdict) -> Decision:
    """The action for a final verdict. Raises: ValueError for a verdict that is not a failure."""
    if verdict.cause is Cause.PREEMPTION:
        used = budget.preemptions + 1
        on_demand = budget.on_demand or (spot and policy.on_demand_after > 0 and used >= policy.on_demand_after)
        nb = replace(budget, preemptions=used, on_demand=on_demand)
        if used > policy.max_preemptions:
            return Decision(Action.EXHAUSTED, nb, on_demand, 0,
                            f"preemption {used} exceeds recovery.max_preemptions={policy.max_preemptions}")
        note = " (on-demand fallback)" if on_demand and not budget.on_demand else ""
        return Decision(Action.RESUME, nb, on_demand, policy.max_preemptions - used,
                        f"preemption {used}/{policy.max_preemptions}: resuming{note}")
    if verdict.cause is Cause.QUEUE_EVICTION:  # same budget; nodes kept, so no on-demand switch
        used = budget.preemptions + 1
        nb = replace(budget, preemptions=used)
        if used > policy.max_preemptions:
            return Decision(Action.EXHAUSTED, nb, budget.on_demand, 0,
                            f"queue eviction {used} exceeds recovery.max_preemptions={policy.max_preemptions}")
        return Decision(Action.RESUME, nb, budget.on_demand, policy.max_preemptions - used,
                        f"queue eviction {used}/{policy.max_preemptions}: resuming from the newest checkpoint "
                        "once Kueue admits the job again")
    if verdict.cause in (Cause.STALL, Cause.STRAGGLER):  # same restart budget; restart from the newest checkpoint
        used = budget.preemptions + 1
        nb = replace(budget, preemptions=used)
        what = verdict.cause.value
        if used > policy.max_preemptions:
            return Decision(Action.EXHAUSTED, nb, budget.on_demand, 0,
                            f"restart {used} ({what}) exceeds recovery.max_preemptions={policy.max_preemptions}")
        return Decision(Action.RESUME, nb, budget.on_demand, policy.max_preemptions - used,
                        f"{what}: restart {used}/{policy.max_preemptions} from the newest checkpoint")
    if verdict.cause is Cause.APP_FAILURE:
        used = budget.app_failures + 1
        nb = replace(budget, app_failures=used)
        if used > policy.app_failure_retries:
            return Decision(Action.FAIL, nb, budget.on_demand, 0,
                            f"application failure {used} exceeds recovery.app_failure_retries="
                            f"{policy.app_failure_retries}")
        return Decision(Action.RETRY, nb, budget.on_demand, policy.app_failure_retries - used,
                        f"application failure {used}/{policy.app_failure_retries}: retrying")
    raise ValueError(f"nothing to decide for verdict {verdict.cause.value}")


# ---- watchdog ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Placement:
    """How far the current attempt's gang got: times are None until they happened."""

    created_at: float
    gang: int
    first_pod_at: float | None = None
    first_bound_at: float | None = None
    bound: int = 0
    running: int = 0


@dataclass(frozen=True)
class Watchdog:
    expired: str = ""  # why the gang failed to place; "" while within bounds
    next_deadline: float | None = None  # when to look again if nothing else happens


def watchdog(p: Placement, *, now: float, admission_s: float, placement_s: float) -> Watchdog:
    """Fail fast on a job with no pods after ``admission_s`` or a partial gang after ``placement_s``."""
    if p.running >= p.gang:
        return Watchdog()
    if p.first_pod_at is None:
        deadline = p.created_at + admission_s
        if now >= deadline:
            return Watchdog(f"job admitted but no pods after {admission_s:g}s")
        return Watchdog(next_deadline=deadline)
    if p.bound >= p.gang:
        return Watchdog()  # fully placed; pods are starting
    start = p.first_bound_at if p.first_bound_at is not None else p.first_pod_at
    deadline = start + placement_s
    if now >= deadline:
        return Watchdog(f"partial placement: {p.bound}/{p.gang} pods placed after {placement_s:g}s")
    return Watchdog(next_deadline=deadline)


# ---- accounting --------------------------------------------------------------------------------

def steps_lost(*, checkpoint_step: int, checkpoint_at: float | None, failed_at: float,
               steps_per_s: float | None, checkpoint_every: int) -> int:
    """Estimated steps trained since the checkpoint we resume from (work redone after resuming).

    With a measured step rate: rate x time since the checkpoint, capped at ``checkpoint_every`` (a newer
    checkpoint would exist otherwise). Without one: half a checkpoint interval, the expected loss.
    """
    if steps_per_s and steps_per_s > 0 and checkpoint_at is not None:
        return max(0, min(checkpoint_every, round(steps_per_s * max(0.0, failed_at - checkpoint_at))))
    return checkpoint_every // 2


@dataclass
class Usage:
    """Running intervals of the job (one per attempt) -> GPU-hours."""

    gpus: int
    intervals: list[tuple[float, float]] = field(default_factory=list)

    def add(self, start: float | None, end: float) -> None:
        if start is not None and end > start:
            self.intervals.append((start, end))

    @property
    def seconds(self) -> float:
        return sum(b - a for a, b in self.intervals)

    @property
    def gpu_hours(self) -> float:
        return self.seconds * self.gpus / 3600.0
