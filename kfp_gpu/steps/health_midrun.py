"""Mid-run GPU health: a gang node that gets a GPU-fault condition is replaced at the next checkpoint boundary.

A node problem detector or the cloud's node agent publishes a GPU fault as a Node condition
(:data:`kfp_gpu.plan.health.GPU_CONDITIONS`, plus the spec's ``health.conditions``). The Training Operator, JobSet
and Kueue do nothing about a condition; EKS node auto repair replaces the node 10 minutes later, killing the job
whatever its checkpoints. The train step instead notes the condition (the newest checkpoint's step at that moment),
lets the job train on until a newer checkpoint exists (:func:`kfp_gpu.plan.health.boundary_due`, bounded by
``health.midrun_max_wait_s``), then stops the job, releases the node (cordon, taint, unclaim:
:func:`kfp_gpu.steps.health_gate.release`) and replaces it through the recovery path, resuming from that checkpoint.
The restart counts against ``recovery.max_preemptions`` (it is a recovery like a preemption's). With
``health.midrun="report"`` the condition is only recorded (ledger ``health_conditions``, timeline
``health-condition``).

:meth:`MidrunHealth.probe` is the gang watch's probe (:meth:`kfp_gpu.cluster.watch.GangWatch.watch_attempt`): it
runs on every watch event once the gang runs and every :data:`EVERY_S` (in memory; the checkpoint store is listed
only while a node is flagged, to find the boundary).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING

from kfp_gpu.plan.health import boundary_due, unhealthy
from kfp_gpu.plan.recovery import Cause, Verdict

if TYPE_CHECKING:
    from kfp_gpu.steps.train_state import TrainState

log = logging.getLogger(__name__)

EVERY_S = 0.25  # how soon after a checkpoint lands the job is stopped (steps trained past it are lost)


class MidrunHealth:
    def __init__(self, st: TrainState) -> None:
        self.st = st
        self.flagged: dict[str, tuple[float, int, str]] = {}  # node -> (seen at, checkpoint step then, condition)

    every_s = EVERY_S

    def _newest_step(self) -> int:
        ck = self.st.checkpoint()
        return int(ck.step) if ck is not None else 0

    def probe(self, now: float) -> Verdict | None:
        """A PREEMPTION verdict for the flagged nodes once their checkpoint boundary came, else None."""
        st, h = self.st, self.st.spec.health
        w = st.watch
        for n in sorted(w.gang):
            fact = w.nodes.get(n)
            why = unhealthy(dict(fact.conditions), h.conditions) if fact is not None else ""
            if why and n not in self.flagged:
                step = self._newest_step()
                self.flagged[n] = (now, step, why)
                st.timeline.event("health-condition", now, node=n, condition=why, checkpoint_step=step,
                                  action=h.midrun)
                st.ledger.setdefault("health_conditions", []).append(
                    {"node": n, "condition": why, "t": now, "checkpoint_step": step, "action": h.midrun})
                st.save_ledger()
                log.warning("job %s: node %s reports %s; %s", st.job, n, why,
                            "replacing it at the next checkpoint" if h.midrun == "replace" else "reported only")
        if not self.flagged or h.midrun != "replace":
            return None
        newest = self._newest_step()
        due = [n for n, (at, step, _) in self.flagged.items()
               if boundary_due(flagged_at_step=step, newest_checkpoint_step=newest, flagged_at=at, now=now,
                               max_wait_s=h.midrun_max_wait_s)]
        if not due:
            return None
        reasons = "; ".join(f"node {n}: {self.flagged[n][2]}" for n in sorted(self.flagged))
        return Verdict(Cause.PREEMPTION, now, tuple(sorted(self.flagged)),
                       f"GPU health: {reasons}; proactive replacement at checkpoint step {newest}")

    def release(self, lost: Iterable[str]) -> None:
        """Release the flagged nodes among ``lost`` (they are replaced next) and forget them."""
        from kfp_gpu.steps.health_gate import release

        for n in lost:
            if n in self.flagged:
                release(self.st.api, n, f"GPU health condition {self.flagged.pop(n)[2]}")
