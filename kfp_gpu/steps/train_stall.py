"""Stall and straggler supervision of a running gang, for the train step (docs/stalls.md).

The train step asks :meth:`StallSupervisor.probe` from its watch loop once the whole gang runs. The probe reads the
ranks' progress objects beside the checkpoints (:class:`kfp_gpu.steps.stall_watch.StallWatch`, the trainer's own
write rights: no cluster rights) and turns a stall into a ``Cause.STALL`` verdict, which the step handles like any
other restart: counted against ``recovery.max_preemptions``, the job deleted and recreated from the newest
checkpoint. Before that, :meth:`StallSupervisor.record` writes which ranks stopped first and the last log lines of
every rank (pods/log, the tenant's own namespace) to the ledger, the timeline and the gang's Degraded condition.
A node whose rank stopped first in two stalls is cordoned and replaced (:meth:`StallSupervisor.remediate`, through
the step's replacement path, as a preempted node is).

Stragglers are reported once per attempt (ledger, timeline, a Degraded report). With ``stragglers="replace"`` the
straggler's node is swapped at the next checkpoint boundary: the first checkpoint newer than the one in force when it
was found is a ``Cause.STRAGGLER`` restart (same budget), and the node is cordoned and replaced as a stalled one.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from kfp_gpu import progress
from kfp_gpu.ownership import SWAP_OUT_ANNOTATION
from kfp_gpu.plan.recovery import Cause, Verdict
from kfp_gpu.plan.stall import Assessment, State, trainer_status
from kfp_gpu.steps.replace import Background
from kfp_gpu.steps.stall_watch import StallWatch, policy_for

log = logging.getLogger("kfp_gpu.steps.train")
PROBE_S = 5.0  # real-world seconds between two looks at the ranks' progress (world time on a rehearsal)


class StallSupervisor:
    """One per train step; ``begin`` per attempt."""

    def __init__(self, st: Any, *, scale: float = 1.0, every_s: float = PROBE_S) -> None:
        self.st = st
        self.every_s = every_s
        self.watch = StallWatch(st.spec.checkpoint_uri, st.spec.nodes * _ranks_per_node(st),
                                policy_for(st.spec, scale=scale))
        self.last: Assessment | None = None
        self.reported: set[int] = set()
        self.swap: dict[str, int] = {}  # stragglers="replace": node -> checkpoint step when it was found slow

    @classmethod
    def for_state(cls, st: Any, *, scale: float | None = None) -> StallSupervisor | None:
        """None when the run has no checkpoint store (no progress to read). ``scale``: the world's time compression
        (default: the rehearsal world's on a rehearsal target, whose ranks report in world time; else 1)."""
        if not st.spec.checkpoint_uri:
            return None
        if scale is None:
            scale = _world_scale(st.spec)
        try:
            return cls(st, scale=scale, every_s=max(0.1, PROBE_S / scale))  # >= 0.1 s: a rehearsal shares the CPU
        except Exception as exc:  # noqa: BLE001 - a store we cannot open: the checkpoint path says why, loudly
            log.warning("stall detection off: progress store %s not usable: %s", st.spec.checkpoint_uri, exc)
            return None

    def begin(self, *, clear: bool = True) -> None:
        self.watch.begin(clear=clear)
        self.last, self.reported, self.swap = None, set(), {}

    def probe(self, now: float) -> Verdict | None:
        if self.st.kind.TRAINER_STATUS:  # Kubeflow Trainer v2: the gang-level progress its status may carry
            try:
                job = self.st.kind.get(self.st.api, self.st.namespace, self.st.job)
                self.watch.observe_trainer_status(trainer_status(job) if job else None, time.time())
            except Exception as exc:  # noqa: BLE001 - advisory; the ranks' own progress is the main signal
                log.debug("trainerStatus of %s not read: %s", self.st.job, exc)
        a = self.watch.poll()
        self.last = a
        self._stragglers(a)
        if a.state is not State.STALLED:
            return self._swap_due(now)
        nodes = self.nodes(a.first_stopped)
        where = ", ".join(f"rank {r} on {n}" for r, n in nodes.items()) or ", ".join(map(str, a.first_stopped))
        return Verdict(Cause.STALL, a.stopped_at or now, (), f"stall: {a.reason}; stopped first: {where}")

    def record(self, verdict: Verdict) -> dict[str, Any]:
        """Ledger fields for a stall: first stopped ranks (and their nodes), every rank's last log lines; for a
        straggler swap, the nodes swapped."""
        st, a = self.st, self.last
        if verdict.cause is Cause.STRAGGLER:
            st.timeline.event("straggler-swap", verdict.at, job=st.job, nodes=sorted(self.swap))
            return {"stragglers_swapped": sorted(self.swap), "first_stopped_nodes": {}}
        first = a.first_stopped if a is not None else ()
        pods = tuple(sorted(p.name for p in st.watch.pods.values() if not p.deleted))
        logs = st.watch.log_tails(pods)
        entry = {"first_stopped": list(first), "first_stopped_nodes": self.nodes(first),
                 "stalled": list(a.stalled) if a is not None else [],
                 "timeout_s": a.timeout_s if a is not None else None, "logs": logs,
                 "trainer_status": dataclasses.asdict(ts) if (ts := self.watch.trainer_status) else None,
                 "detect_latency_s": round(max(0.0, st.watch.decided_at - verdict.at), 4)}
        st.timeline.event("stall", verdict.at, job=st.job, ranks=list(first), reason=verdict.reason)
        return entry

    def nodes(self, ranks: tuple[int, ...]) -> dict[int, str]:
        """The node each of ``ranks`` runs on: the one its progress names, else its pod's (from the watch)."""
        out = {}
        pods = {p.name: p.node for p in self.st.watch.pods.values()}
        for r in ranks:
            rec = self.watch.records.get(r)
            if rec is not None:
                out[r] = rec.node or pods.get(rec.pod, "")
        return {r: n for r, n in out.items() if n}

    def offenders(self) -> list[str]:
        """Gang nodes whose rank was the first to stop in two stalls or more (the ledger counts across tries). The
        gang is the capacity's nodes plus the attempt's (a backend whose gang forms at admission, Kueue's, has no
        nodes in its capacity: the nodes the pods bound to are the gang)."""
        counts = Counter(n for e in self.st.ledger.get("stalls", []) for n in set(e.get("first_stopped_nodes",
                                                                                       {}).values()))
        gang = set(self.st.capacity.nodes) | set(self.st.watch.gang)
        return sorted(n for n, c in counts.items() if c >= 2 and n in gang)

    def _swap_due(self, now: float) -> Verdict | None:
        """stragglers="replace": a checkpoint newer than the one in force when a straggler was found is the boundary
        at which its node is swapped (the restart loses only the steps since that checkpoint)."""
        if not self.swap:
            return None
        ck = self.st.checkpoint()
        if ck is None or int(ck.step) <= min(self.swap.values()):
            return None
        nodes = ", ".join(sorted(self.swap))
        return Verdict(Cause.STRAGGLER, now, (), f"straggler node(s) {nodes}: swapped at checkpoint step {ck.step}")

    def remediate(self, verdict: Verdict, replace: Callable[[list[str]], None]) -> Background | None:
        """After a stall: a node first to stop twice is cordoned (no new pods land there), taken out of the gang and
        replaced (``replace``, the step's replacement path, in the background while the job is torn down). It is
        annotated ``kfp-gpu.io/swap-out``: a backend that ``releases_one_node`` gives it back before it asks for the
        replacement (node-pool: GKE deleteInstances / EKS TerminateInstanceInAutoScalingGroup; karpenter: its NodeClaim
        deleted); on the others the run's claim is removed too (as a bad GPU's node is released, with the claim's
        scale-down protection), so it stays cordoned until the autoscaler removes it, empty (ledger
        ``slot_released``). None when there is no such node."""
        bad = sorted(self.swap) if verdict.cause is Cause.STRAGGLER else self.offenders()
        if not bad:
            return None
        why = "straggler" if verdict.cause is Cause.STRAGGLER else "first to stop in two stalls"
        from kubernetes import client

        from kfp_gpu.cluster.nodes import unclaim

        core = client.CoreV1Api(self.st.api)
        releases = bool(getattr(self.st, "releases_one_node", False))
        for name in bad:
            try:
                core.patch_node(name, {"metadata": {"annotations": {SWAP_OUT_ANNOTATION: "stall"}},
                                       "spec": {"unschedulable": True}})
            except Exception as exc:  # noqa: BLE001 - the replacement goes ahead; the node is out of the gang anyway
                log.warning("could not cordon %s: %s", name, exc)
            if not releases:  # our claim (and its scale-down protection) would keep the autoscaler off it
                try:
                    unclaim(self.st.api, name)
                except Exception as exc:  # noqa: BLE001 - teardown drops the claim at the latest
                    log.warning("could not drop the run's claim on %s (the autoscaler keeps it until teardown): %s",
                                name, exc)
            self.st.timeline.event("cordoned", time.time(), node=name, reason=why)
        entry = self.st.ledger["stalls"][-1]
        entry["cordoned"] = bad
        entry["slot_released"] = releases
        progress.report(progress.DEGRADED, "StalledNode" if verdict.cause is Cause.STALL else "StragglerSwap",
                        f"job {self.st.job}: node(s) {', '.join(bad)} ({why}): cordoned and replaced", nodes=bad)
        return Background(lambda: replace(bad))

    def _stragglers(self, a: Assessment) -> None:
        new = [r for r in a.stragglers if r not in self.reported]
        if not new:
            return
        self.reported |= set(new)
        st = self.st
        nodes = self.nodes(tuple(new))
        msg = (f"job {st.job}: straggler rank(s) {', '.join(map(str, new))} "
               f"({', '.join(f'{n}' for n in nodes.values()) or 'node unknown'}): step time above the gang median by "
               f"more than {st.spec.straggler_margin:.0%} for {st.spec.straggler_window_s:g} s")
        if st.spec.stragglers == "replace":
            ck = st.checkpoint()
            self.swap.update({n: int(ck.step) if ck is not None else 0 for n in nodes.values()})
            msg += "; its node is swapped at the next checkpoint (stragglers='replace')"
        st.ledger.setdefault("stragglers", []).append({"t": time.time(), "ranks": new, "nodes": nodes})
        st.timeline.event("straggler", time.time(), job=st.job, ranks=new)
        progress.report(progress.DEGRADED, "Straggler", msg[:1000], ranks=new)
        log.warning("%s", msg)


def _ranks_per_node(st: Any) -> int:
    """Ranks that report progress per node: the job's processes per node (``nproc_per_node``), 1 when unknown."""
    return int(getattr(st, "ranks_per_node", 1) or 1)


def _world_scale(spec: Any) -> float:
    """The rehearsal world's time compression (its ranks report in world time), 1 on a real cluster."""
    if not spec.target.rehearsal:
        return 1.0
    from kfp_gpu import rehearsal_seam

    return float(rehearsal_seam.load("sim.clock").scale())
