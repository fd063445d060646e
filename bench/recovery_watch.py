"""The recovery bench's external watch of one job's pods and the simulated trainer that reads it.

:class:`JobPods` is the one watch every recovery side is measured by (same code, same harness clock): every pod of
the job (label ``kfp-gpu.io/job``), with the world's rank annotations (``kfp-gpu.io/stalled-since``,
``kfp-gpu.io/resumes-at``, kfp_gpu_rehearsal/sim/ranks.py). After :meth:`JobPods.arm` it records the side's first reaction
to the loss: a new pod of the job, a surviving pod deleted, or a surviving pod re-rendezvousing.

:class:`Trainer` advances ``rate`` steps/s while the watch says the job trains (bench/recovery_metrics.py) and
commits a checkpoint every ``k`` steps; after the loss it resumes, like every side's trainer script does, from the
newest committed checkpoint, and records when it trained again (``t_train``) and when all ``n`` ranks did
(``t_full``).
"""

from __future__ import annotations

import threading
import time
from datetime import datetime, timezone
from typing import Any

from kubernetes import client, watch

from bench.recovery_metrics import Rank, training_ranks
from kfp_gpu import ownership
from kfp_gpu_rehearsal.sim.ranks import RESUMES_ANNOTATION, STALLED_ANNOTATION

POLL_S = 0.005  # the trainer's look at the watch's state (the resolution of t_train / t_full)


def parse_rfc3339(text: str | None) -> float | None:
    if not text:
        return None
    try:
        return datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=timezone.utc).timestamp()
    except ValueError:
        return None


class JobPods:
    """Watches the pods of one job; the state a :class:`Rank` list is made of, and the first reaction after arming."""

    def __init__(self, api: client.ApiClient, namespace: str, job: str, n: int) -> None:
        self.core = client.CoreV1Api(api)
        self.namespace, self.selector, self.n = namespace, f"{ownership.JOB_LABEL}={job}", n
        self.pods: dict[str, dict[str, Any]] = {}  # uid -> {name, phase, node, live, seen, stalled, resumes}
        self.cond = threading.Condition()
        self.t0: float | None = None
        self.lost_nodes: frozenset[str] = frozenset()
        self.reaction_at: float | None = None
        self.reaction: str = ""
        self.killed_at: float | None = None  # the lost rank's pod no longer Running
        self._stop = threading.Event()
        self._w = watch.Watch()
        self._t = threading.Thread(target=self._run, daemon=True, name=f"jobpods-{job}")

    def start(self) -> JobPods:
        lst = self.core.list_namespaced_pod(self.namespace, label_selector=self.selector)
        now = time.time()
        for p in lst.items:
            self._observe(p, now, "ADDED")
        self._rv = lst.metadata.resource_version
        self._t.start()
        return self

    def arm(self, t0: float, lost_nodes: list[str]) -> None:
        with self.cond:
            self.t0, self.lost_nodes = t0, frozenset(lost_nodes)

    def _react(self, now: float, what: str) -> None:
        if self.reaction_at is None:
            self.reaction_at, self.reaction = now, what

    def _observe(self, p: client.V1Pod, now: float, kind: str) -> None:
        u = p.metadata.uid
        with self.cond:
            rec = self.pods.get(u)
            new = rec is None
            if rec is None:
                rec = self.pods[u] = {"name": p.metadata.name, "seen": now}
            notes = p.metadata.annotations or {}
            was_live, had_resume = rec.get("live", True), rec.get("resumes")
            rec.update(phase=p.status.phase if p.status else None, node=p.spec.node_name or rec.get("node") or "",
                       live=kind != "DELETED" and p.metadata.deletion_timestamp is None,
                       stalled=parse_rfc3339(notes.get(STALLED_ANNOTATION)),
                       resumes=parse_rfc3339(notes.get(RESUMES_ANNOTATION)))
            t0 = self.t0
            if t0 is not None:
                old = rec["seen"] <= t0
                if new:
                    self._react(now, f"new pod {rec['name']}")
                elif old and rec["node"] in self.lost_nodes:
                    if self.killed_at is None and not (rec["live"] and rec["phase"] == "Running"):
                        self.killed_at = now
                elif old and was_live and not rec["live"]:
                    self._react(now, f"surviving pod {rec['name']} deleted")
                elif old and rec["resumes"] is not None and had_resume is None and (rec["stalled"] or 0) >= t0:
                    self._react(now, f"surviving pod {rec['name']} re-rendezvoused")
            self.cond.notify_all()

    def _run(self) -> None:
        rv = self._rv
        while not self._stop.is_set():
            try:
                for ev in self._w.stream(self.core.list_namespaced_pod, self.namespace, label_selector=self.selector,
                                         resource_version=rv, timeout_seconds=300):
                    obj = ev["object"]
                    rv = obj.metadata.resource_version
                    self._observe(obj, time.time(), ev["type"])
                    if self._stop.is_set():
                        return
            except Exception:  # noqa: BLE001 - reconnect
                if self._stop.is_set():
                    return
                time.sleep(0.1)

    def ranks(self) -> list[Rank]:
        with self.cond:
            return [Rank(u, str(r["node"]), float(r["seen"]), bool(r["live"] and r["phase"] == "Running"),
                         r["stalled"], r["resumes"]) for u, r in self.pods.items()]

    def live_running(self) -> list[dict[str, Any]]:
        with self.cond:
            return [dict(r) for r in self.pods.values() if r["live"] and r["phase"] == "Running"]

    def stop(self) -> None:
        self._stop.set()
        self._w.stop()


class Trainer:
    """Simulated trainer progress: ``rate`` steps/s while at least ``need`` ranks train, a checkpoint every ``k``."""

    def __init__(self, pods: JobPods, ckpt_uri: str, rate: float, k: int, need: int) -> None:
        from kfp_gpu.checkpoint.store import CheckpointStore

        self.pods, self.store, self.rate, self.k, self.need = pods, CheckpointStore(ckpt_uri), rate, k, need
        self.step = 0
        self.frozen = False
        self.t0: float | None = None
        self.t_train: float | None = None
        self.t_full: float | None = None
        self.resume_step: int | None = None
        self.cond = threading.Condition()
        self._halt = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True, name="bench-trainer")

    def start(self) -> Trainer:
        self._t.start()
        return self

    def _run(self) -> None:
        tick = 1.0 / self.rate
        nxt: float | None = None
        while not self._halt.is_set():
            time.sleep(POLL_S)
            now = time.time()
            with self.cond:
                frozen, t0 = self.frozen, self.t0
            if frozen and t0 is None:
                continue
            count = training_ranks(self.pods.ranks(), now, t0, self.pods.lost_nodes)
            if count < self.need:
                nxt = None
                continue
            with self.cond:
                if t0 is not None and self.t_train is None:  # training again: from the newest checkpoint
                    self.t_train = now
                    c = self.store.latest()
                    self.resume_step = self.step = int(c.step) if c is not None else 0
                if t0 is not None and self.t_full is None and count >= self.pods.n:
                    self.t_full = now
                self.cond.notify_all()
            if nxt is None:
                nxt = now + tick
            if now < nxt:
                continue
            nxt += tick
            with self.cond:
                self.step += 1
                s = self.step
            if s % self.k == 0:
                self.store.save(s, {"model.pt": f"w{s}".encode()}, meta={"loss": round(10.0 / s, 4)})
            with self.cond:
                self.cond.notify_all()

    def _wait(self, what: str, pred: Any, timeout_s: float) -> None:
        end = time.time() + timeout_s
        with self.cond:
            while not pred():
                left = end - time.time()
                if left <= 0:
                    raise RuntimeError(f"timed out after {timeout_s:g}s waiting for {what}; trainer at step "
                                       f"{self.step}; pods: {[(r['name'], r['phase'], r['node'], r['live'], r['stalled'], r['resumes']) for r in self.pods.pods.values()]}")
                self.cond.wait(min(left, 0.5))

    def run_to(self, step: int, timeout_s: float) -> int:
        """Block until the trainer reached ``step``, then freeze it (the node is about to go). Returns the step."""
        self._wait(f"trainer step {step}", lambda: self.step >= step, timeout_s)
        with self.cond:
            self.frozen = True
            return self.step

    def lost(self, t0: float) -> None:
        """The loss happened at ``t0``: from now on the trainer steps only when the job trains again."""
        with self.cond:
            self.t0 = t0

    def wait_resumed(self, steps: int, timeout_s: float) -> None:
        """Until the job trained again, all ``n`` ranks trained, and ``steps`` steps were made past the resume."""
        self._wait(f"training again (+{steps} steps, all ranks)", lambda: self.t_full is not None
                   and self.resume_step is not None and self.step >= self.resume_step + steps, timeout_s)

    def stop(self) -> None:
        self._halt.set()
