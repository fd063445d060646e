"""Stall and straggler supervision of a running gang, for the train step (docs/stalls.md).

The train step asks :meth:`StallSupervisor.probe` from its watch loop once the whole gang runs. The probe reads the
ranks' progress objects beside the checkpoints (:class:`kfp_gpu.steps.stall_watch.StallWatch`, the trainer's own
write rights: no cluster rights) and turns a stall into a ``Cause.STALL`` verdict, which the step handles like any
other restart: counted against ``recovery.max_preemptions``, the job deleted and recreated from the newest
checkpoint. Before that, :meth:`StallSupervisor.record` writes which ranks stopped first and the last log lines of
every rank (pods/log, the tenant's own namespace) to the ledger, the timeline and the gang's Degraded condition.

Stragglers are reported once per attempt (ledger, timeline, a Degraded report). ``stragglers="replace"`` is not acted
on by this module yet: the report says so.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from kfp_gpu import progress
from kfp_gpu.plan.recovery import Cause, Verdict
from kfp_gpu.plan.stall import Assessment, State
from kfp_gpu.steps.stall_watch import StallWatch, policy_for

log = logging.getLogger("kfp_gpu.steps.train")


class StallSupervisor:
    """One per train step; ``begin`` per attempt."""

    def __init__(self, st: Any, *, scale: float = 1.0, every_s: float = 5.0) -> None:
        self.st = st
        self.every_s = every_s
        self.watch = StallWatch(st.spec.checkpoint_uri, st.spec.nodes * _ranks_per_node(st),
                                policy_for(st.spec, scale=scale))
        self.last: Assessment | None = None
        self.reported: set[int] = set()

    @classmethod
    def for_state(cls, st: Any, *, scale: float = 1.0) -> StallSupervisor | None:
        """None when the run has no checkpoint store (no progress to read)."""
        if not st.spec.checkpoint_uri:
            return None
        try:
            return cls(st, scale=scale, every_s=max(0.05, min(5.0, policy_for(st.spec, scale=scale).floor_s / 4)))
        except Exception as exc:  # noqa: BLE001 - a store we cannot open: the checkpoint path says why, loudly
            log.warning("stall detection off: progress store %s not usable: %s", st.spec.checkpoint_uri, exc)
            return None

    def begin(self, *, clear: bool = True) -> None:
        self.watch.begin(clear=clear)
        self.last, self.reported = None, set()

    def probe(self, now: float) -> Verdict | None:
        a = self.watch.poll()
        self.last = a
        self._stragglers(a)
        if a.state is not State.STALLED:
            return None
        nodes = self.watch.nodes(a.first_stopped)
        where = ", ".join(f"rank {r} on {n}" for r, n in nodes.items()) or ", ".join(map(str, a.first_stopped))
        return Verdict(Cause.STALL, a.stopped_at or now, (), f"stall: {a.reason}; stopped first: {where}")

    def record(self, verdict: Verdict) -> dict[str, Any]:
        """Ledger fields for a stall: first stopped ranks (and their nodes), every rank's last log lines."""
        st, a = self.st, self.last
        first = a.first_stopped if a is not None else ()
        pods = tuple(sorted(p.name for p in st.watch.pods.values() if not p.deleted))
        logs = st.watch.log_tails(pods)
        entry = {"first_stopped": list(first), "first_stopped_nodes": self.watch.nodes(first),
                 "stalled": list(a.stalled) if a is not None else [],
                 "timeout_s": a.timeout_s if a is not None else None, "logs": logs,
                 "detect_latency_s": round(max(0.0, st.watch.decided_at - verdict.at), 4)}
        st.timeline.event("stall", verdict.at, job=st.job, ranks=list(first), reason=verdict.reason)
        return entry

    def _stragglers(self, a: Assessment) -> None:
        new = [r for r in a.stragglers if r not in self.reported]
        if not new:
            return
        self.reported |= set(new)
        st = self.st
        nodes = self.watch.nodes(tuple(new))
        msg = (f"job {st.job}: straggler rank(s) {', '.join(map(str, new))} "
               f"({', '.join(f'{n}' for n in nodes.values()) or 'node unknown'}): step time above the gang median by "
               f"more than {st.spec.straggler_margin:.0%} for {st.spec.straggler_window_s:g} s")
        if st.spec.stragglers == "replace":
            msg += "; stragglers='replace' is not implemented yet: reported only"
        st.ledger.setdefault("stragglers", []).append({"t": time.time(), "ranks": new, "nodes": nodes})
        st.timeline.event("straggler", time.time(), job=st.job, ranks=new)
        progress.report(progress.DEGRADED, "Straggler", msg[:1000], ranks=new)
        log.warning("%s", msg)


def _ranks_per_node(st: Any) -> int:
    """Ranks that report progress per node: the job's processes per node (``nproc_per_node``), 1 when unknown."""
    return int(getattr(st, "ranks_per_node", 1) or 1)
