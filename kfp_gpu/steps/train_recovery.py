"""The train step's incidents and repairs: count each against the recovery budget, replace lost nodes, and
bring the gang back to whole.

Contract: :func:`record` writes one incident (preemption, queue eviction, stall, app failure) to the budget,
the step ledger (with the steps lost since the newest checkpoint) and the timeline, and saves the ledger;
:func:`exhausted` is the error once the budget is spent; :func:`replace_nodes` asks the provisioner for
replacements of ``lost`` (same zone first) and records which nodes replaced them; :func:`converge` returns
only once every node of the gang is Ready, claimed by this run and has its GPUs, counting a node lost while
no job runs as a preemption like any other. All act on the step's :class:`~kfp_gpu.steps.train_state.TrainState`.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from kfp_gpu import progress
from kfp_gpu.errors import GangPlacementFailed, RecoveryBudgetExhausted
from kfp_gpu.job import JobTemplate
from kfp_gpu.ownership import label_safe
from kfp_gpu.plan.recovery import (
    Action,
    Cause,
    Decision,
    Verdict,
    decide,
    gang_losses,
    gang_ready,
    loss_reason,
    steps_lost,
    unclaimed,
)
from kfp_gpu.steps.replace import Reprovision, replace
from kfp_gpu.steps.train_state import TrainState

__all__ = ["HEALTH_ATTEMPT_BASE", "claim_unclaimed", "converge", "exhausted", "record", "replace_nodes"]

log = logging.getLogger("kfp_gpu.steps.train")


def converge(st: TrainState, reprovision: Reprovision | None, gate_s: float) -> None:
    """Return once every node of the gang is Ready, claimed by this run, with its GPUs allocatable.

    The gang is re-derived from live Nodes on every event, never from a list taken before the latest
    preemption: a node lost while no job runs (a survivor or a replacement preempted while a recovery was
    in flight, or a VM recreated without our claim) is a preemption like any other. It is counted against
    the budget, replaced, and waited for, so any sequence of preemptions within the budget converges.
    The deadline (``gate_s``) restarts after each replacement.

    Raises: RecoveryBudgetExhausted, GangPlacementFailed (not Ready within ``gate_s``), and the provisioning
    errors of the replacement (ProvisioningTimeout, CapacityUnavailable, NotFound...).
    """
    w, label = st.watch, label_safe(st.run_id)
    deadline = time.time() + gate_s
    while True:
        w.drain()
        gang = st.capacity.nodes
        lost = gang_losses(gang, w.nodes, label)
        # preempted while recovering, even if its instance group already brought it back under the same name
        # (a node no longer in the gang - already replaced, e.g. a revoked one whose deletion came late - is not)
        fresh = {i.node: i.reason for i in w.incidents.values() if (i.node, i.at) not in st.counted and i.node in gang}
        st.counted |= {(i.node, i.at) for i in w.incidents.values()}
        if lost or fresh:
            now = time.time()
            reason = "; ".join([f"node {n}: {why}" for n, why in sorted(fresh.items()) if n not in lost]
                               + [f"node {n}: {loss_reason(n, w.nodes, label)}" for n in lost])
            verdict = Verdict(Cause.PREEMPTION, now, tuple(sorted(set(lost) | set(fresh))),
                              reason + " (while recovering)")
            decision = decide(st.spec.recovery, spot=st.spec.spot, budget=st.budget, verdict=verdict)
            w.decided_at = now
            record(st, verdict, decision, None)
            if decision.action is Action.EXHAUSTED:
                raise exhausted(st, decision, verdict)
            st.degraded = True
            progress.report(progress.DEGRADED, "Recovering", f"job {st.job}: {reason}"[:1000],
                            preemptions=st.budget.preemptions, lost_nodes=len(verdict.lost_nodes))
            if lost:
                replace_nodes(st, list(lost), decision.on_demand, reprovision)
            else:
                st.ledger["preemptions"][-1]["replacement_nodes"] = sorted(fresh)  # recreated, still ours
            st.save_ledger()
            deadline = time.time() + gate_s
            continue
        if claim_unclaimed(st, unclaimed(gang, w.nodes)):
            continue
        if len(gang) < st.spec.nodes:  # a replacement came back short: ask for the rest
            replace_nodes(st, [], False, reprovision, deficit=st.spec.nodes - len(gang))
            continue
        missing = gang_ready(gang, w.nodes, st.capacity.gpus_per_node)
        if not missing:
            return
        left = deadline - time.time()
        if left <= 0:
            raise GangPlacementFailed(
                f"gang not Ready after {gate_s:g}s: {len(missing)}/{len(gang)} nodes NotReady or without "
                f"{st.capacity.gpus_per_node} allocatable GPUs: {', '.join(missing)}",
                remediation="check the scale-up output and the nodes (kubectl describe node ...)", nodes=list(missing))
        w.wait(min(left, 5.0))


def claim_unclaimed(st: TrainState, names: tuple[str, ...]) -> bool:
    """Claim gang nodes that carry no claim (a VM recreated under its old name). True when any was tried;
    the watch then shows each as ours, or as another run's (then it is lost)."""
    from kfp_gpu.cluster.nodes import NodeView, claim, read_node

    protected = set(st.capacity.extra.get("protected_pools", []))  # autoscaled pools under "protect"
    for name in names:
        node = read_node(st.api, name)
        if node is not None:
            claim(st.api, node, st.run_id, st.owner.lease_expires, namespace=st.namespace,
                  protect=NodeView.of(node).pool in protected)
    if names:
        st.watch.wait(1.0)  # let the watch deliver the labels (or the loss) before looking again
    return bool(names)


def exhausted(st: TrainState, decision: Decision, verdict: Verdict) -> RecoveryBudgetExhausted:
    return RecoveryBudgetExhausted(
        f"job {st.job}: {decision.message}; last: {verdict.reason}",
        remediation="raise recovery.max_preemptions, use on-demand capacity (recovery.on_demand_after) "
        "or a reservation, or checkpoint more often",
        preemptions=st.ledger.get("preemptions", []), budget=st.spec.recovery.max_preemptions,
    )


def record(st: TrainState, verdict: Verdict, decision: Decision, template: JobTemplate | None) -> None:
    """Count an incident: budget, usage, ledger entry (with steps lost) and timeline."""
    now = time.time()
    st.budget = decision.budget
    st.close_usage(now)
    ck = st.checkpoint()
    ck_step = ck.step if ck is not None else 0
    rate = None
    if ck is not None and st.running_at is not None and ck.created > st.running_at and ck.step > st.resume_step:
        rate = (ck.step - st.resume_step) / (ck.created - st.running_at)
    entry: dict[str, Any] = {
        "t": verdict.at, "decided_at": st.watch.decided_at, "reason": verdict.reason, "action": decision.action.value,
        "checkpoint_step": ck_step, "checkpoint_uri": ck.uri if ck is not None else "",
        "steps_lost": 0 if template is None else steps_lost(  # no job ran while recovering: nothing lost
            checkpoint_step=ck_step, checkpoint_at=ck.created if ck else None, failed_at=verdict.at,
            steps_per_s=rate, checkpoint_every=template.checkpoint_every),
        "message": decision.message,
    }
    entry["cause"] = verdict.cause.value
    if verdict.cause is Cause.QUEUE_EVICTION:  # Kueue took the quota back: nodes kept, job waits in its queue
        entry.update(lost_nodes=[], queue=st.queue, workload=st.watch.workload.name if st.watch.workload else "",
                     detect_latency_s=round(max(0.0, st.watch.decided_at - verdict.at), 4))
        st.ledger.setdefault("preemptions", []).append(entry)
        st.timeline.event("queue-eviction", verdict.at, reason=verdict.reason, job=st.job, queue=st.queue)
    elif verdict.cause is Cause.PREEMPTION:
        entry.update(lost_nodes=list(verdict.lost_nodes), on_demand=decision.on_demand,
                     detect_latency_s=round(st.watch.decided_at - verdict.at, 4))
        st.ledger.setdefault("preemptions", []).append(entry)
        for node in verdict.lost_nodes:
            st.timeline.event("preemption", verdict.at, node=node, reason=verdict.reason, job=st.job)
            st.mark_node_preempted(node, verdict.at)
        if not verdict.lost_nodes:
            st.timeline.event("preemption", verdict.at, node="", reason=verdict.reason, job=st.job)
        if template is None:
            entry["during"] = "recovery"
    elif verdict.cause in (Cause.STALL, Cause.STRAGGLER):  # pods Running; lost: the steps since the checkpoint
        entry.update(st.stall.record(verdict) if st.stall is not None else {})
        st.ledger.setdefault("stalls", []).append(entry)
    else:
        st.ledger.setdefault("app_failures", []).append(entry)
    if template is not None:
        st.timeline.event("job-finished", now, job=st.job, status=verdict.cause.value, attempt=st.attempt)
    st.ledger["budget"] = {"preemptions": st.budget.preemptions, "app_failures": st.budget.app_failures,
                           "on_demand": st.budget.on_demand}
    st.save_ledger()


HEALTH_ATTEMPT_BASE = 10000  # a health replacement's provisioner request key: never a preemption's recovery-<n>


def replace_nodes(st: TrainState, lost: list[str], on_demand: bool, reprovision: Reprovision | None,
                  deficit: int = 0, attempt: int | None = None, entry: dict[str, Any] | None = None) -> None:
    """Replace ``lost`` (same zone first), plus ``deficit`` more nodes, and record which nodes replaced them."""
    zone = next((p.zone for p in st.capacity.placements for n in p.nodes if n in lost), "")
    zone = zone or next((st.watch.nodes[n].zone for n in lost if n in st.watch.nodes), "")
    before = set(st.capacity.nodes) - set(lost)
    gone = [st.watch.nodes[n].uid for n in lost if n in st.watch.nodes]  # these incarnations are lost
    st.capacity = replace(st.spec, st.run_id, st.api, st.capacity, lost, zone_hint=zone, on_demand=on_demand,
                          attempt=st.budget.preemptions if attempt is None else attempt, hook=reprovision,
                          lost_uids=gone, deficit=deficit)
    if attempt is not None:  # a health replacement: recorded by the gate's ledger entry
        entry = st.ledger["health"][-1]
    entry = entry if entry is not None else (st.ledger.get("preemptions") or [None])[-1]  # the incident's record
    if entry is not None:
        entry["replacement_nodes"] = sorted(set(entry.get("replacement_nodes", []))
                                            | {n for n in st.capacity.nodes if n not in before})
    log.info("job %s: replaced %s; gang now %s", st.job, ", ".join(lost), ", ".join(st.capacity.nodes))
