"""The train step's GPU health gate: probe every gang node not probed yet, release and replace the bad ones.

Runs after the gang is Ready and claimed (``train_recovery.converge``) and before the job is created, on every attempt,
so replacement nodes (a preemption's, or the gate's own) are probed too; a node that passed keeps its pass for as
long as it is the same Node (name and uid). The decision is :func:`kfp_gpu.plan.health.gate`; the probe pods are
:mod:`kfp_gpu.cluster.probe`. A bad node is *released*: cordoned, tainted :data:`UNHEALTHY_TAINT` (so no run claims
it again), its claim removed; the caller then replaces it through the run's provisioner (the recovery path,
:mod:`kfp_gpu.steps.replace`). The ledger's ``health`` list and the timeline (``health-probe``, ``health-bad``,
``health-passed``; a released node's timeline ends ``released``) record every round. Replacements for bad GPUs are
not preemptions: they do not use the ``recovery.max_preemptions`` budget; ``health.max_rounds`` and
``health.timeout_s`` bound them.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from kubernetes import client

from kfp_gpu.errors import GangPlacementFailed
from kfp_gpu.ownership import UNHEALTHY_ANNOTATION
from kfp_gpu.plan.health import UNHEALTHY_TAINT, GateAction, GateVerdict, gate, unhealthy
from kfp_gpu.timeline import NodeState

if TYPE_CHECKING:
    from kfp_gpu.steps.train_state import TrainState

log = logging.getLogger(__name__)
__all__ = ["UNHEALTHY_ANNOTATION", "UNHEALTHY_TAINT", "HealthGate", "await_listed", "release"]



class HealthGate:
    """Per train step: which Node incarnations passed, and the gate's clock (its bound spans every round)."""

    def __init__(self) -> None:
        self.passed: set[tuple[str, str]] = set()  # (node, uid)
        self.started: float | None = None
        self.rounds = 0

    def run(self, st: TrainState) -> list[str]:
        """Probe the gang's unprobed nodes once (one round). Returns the bad nodes, already released ([] = all
        pass). Raises: GangPlacementFailed when the gate gives up (``health.max_rounds``, ``health.timeout_s``)."""
        h = st.spec.health
        if not h.probe:
            return []
        w = st.watch
        w.drain()
        todo = [n for n in st.capacity.nodes if (n, w.nodes[n].uid if n in w.nodes else "") not in self.passed]
        if not todo:
            return []
        from kfp_gpu.cluster.probe import ProbeRound

        now = time.time()
        if self.started is None:
            self.started = now
        self.rounds += 1
        round_no, round_started = self.rounds, now
        st.timeline.event("health-probe", now, round=round_no, nodes=list(todo))
        probes = ProbeRound(st.api, h, st.capacity, st.run_id, todo, round_no, st.owner.labels())
        probes.start()
        try:
            while True:
                w.drain()
                faults = {n: unhealthy(dict(w.nodes[n].conditions), h.conditions) for n in todo if n in w.nodes}
                now = time.time()
                verdict = gate(todo, probes.results, {n: f for n, f in faults.items() if f}, now=now,
                               gate_started=self.started, round_started=round_started, round_no=round_no,
                               probe_timeout_s=h.probe_timeout_s, timeout_s=h.timeout_s, max_rounds=h.max_rounds)
                if verdict.action is not GateAction.WAIT:
                    break
                probes.poll(min(1.0, max(0.05, (verdict.next_deadline or now) - now)))
        finally:
            probes.stop()
        self._record(st, verdict, todo, round_started, now, probes.results)
        if verdict.action is GateAction.GIVE_UP:
            raise GangPlacementFailed(
                verdict.message, nodes=[n for n, _ in verdict.bad],
                remediation="check the nodes' GPUs (kubectl describe node; dcgmi diag -r 3), pick another zone or "
                "accelerator, or raise health.max_rounds / health.timeout_s")
        for n in todo:
            if n not in dict(verdict.bad) and n in w.nodes:
                self.passed.add((n, w.nodes[n].uid))
        bad = [n for n, _ in verdict.bad]
        for n, why in verdict.bad:
            release(st.api, n, why)
            tl = st.timeline.nodes.get(n)
            if tl is not None:
                try:
                    tl.advance(NodeState.RELEASED, now)
                except ValueError:
                    pass
        return bad

    def unavailable(self, st: TrainState, why: str) -> bool:
        """The gate cannot run before this job (``why``): say so once per step, in the ledger's ``health`` list
        (action ``skipped``), the timeline (``health-skipped``) and the log, instead of passing silently. False when
        ``health.probe`` is off or it was said already."""
        if not st.spec.health.probe or any(e.get("action") == "skipped" for e in st.ledger.get("health", [])):
            return False
        now = time.time()
        st.ledger.setdefault("health", []).append({"round": 0, "nodes": [], "started_at": now, "decided_at": now,
                                                   "action": "skipped", "bad": [], "exit_codes": {}, "message": why})
        st.timeline.event("health-skipped", now, reason=why)
        log.warning("GPU health gate not run: %s", why)
        return True

    def _record(self, st: TrainState, verdict: GateVerdict, todo: list[str], started: float, now: float,
                results: dict[str, Any]) -> None:
        entry = {"round": self.rounds, "nodes": list(todo), "started_at": started, "decided_at": now,
                 "action": verdict.action.value, "bad": [{"node": n, "reason": why} for n, why in verdict.bad],
                 "exit_codes": {n: r.exit_code for n, r in results.items()}, "message": verdict.message}
        st.ledger.setdefault("health", []).append(entry)
        for n, why in verdict.bad:
            st.timeline.event("health-bad", now, node=n, reason=why, round=self.rounds)
        if verdict.action is GateAction.PASS:
            st.timeline.event("health-passed", now, round=self.rounds, nodes=list(todo),
                              seconds=round(now - started, 3))
        st.save_ledger()
        log.info("GPU health gate round %d: %s", self.rounds, verdict.message or verdict.action.value)


def await_listed(st: TrainState, timeout_s: float) -> None:
    """Let the node watch catch up with the nodes a provisioner just returned (else ``train_recovery.converge`` would count a
    replacement the watch has not delivered yet as missing, i.e. lost)."""
    deadline = time.time() + timeout_s
    st.watch.drain()
    while any(n not in st.watch.nodes for n in st.capacity.nodes) and time.time() < deadline:
        st.watch.wait(min(0.5, max(0.0, deadline - time.time())))


def release(api: client.ApiClient, node: str, why: str) -> None:
    """Release a bad node: cordon it, taint it :data:`UNHEALTHY_TAINT` (NoSchedule; no run claims a cordoned node),
    note the reason, then remove this run's claim. A node already gone is fine.

    Raises: ApiException (not 404; a conflict on every attempt)."""
    from kfp_gpu.cluster.conditional import patch_conditionally
    from kfp_gpu.cluster.nodes import read_node, unclaim

    core = client.CoreV1Api(api)

    def change(obj: dict[str, Any]) -> dict[str, Any]:
        taints = [t for t in (obj.get("spec") or {}).get("taints") or [] if t.get("key") != UNHEALTHY_TAINT]
        taints.append({"key": UNHEALTHY_TAINT, "value": "true", "effect": "NoSchedule"})
        return {"metadata": {"resourceVersion": obj["metadata"]["resourceVersion"],
                             "annotations": {UNHEALTHY_ANNOTATION: why[:250]}},
                "spec": {"unschedulable": True, "taints": taints}}

    if patch_conditionally(read_node(api, node), change,
                           lambda body: core.patch_node(node, body, _preload_content=False),
                           lambda: read_node(api, node), attempts=8, raise_when_exhausted=True):
        unclaim(api, node)
