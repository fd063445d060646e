"""The train step's state: capacity, budget, ledger, timeline, the Kueue queue, the job kind, and the gang watch."""

from __future__ import annotations

import functools
import json
import logging
import time
from typing import Any

from kubernetes import client

from kfp_gpu.cluster import ledger
from kfp_gpu.cluster.watch import GangWatch
from kfp_gpu.errors import KfpGpuError
from kfp_gpu.jobkinds import JobKind, PyTorchJobKind
from kfp_gpu.ownership import Owner
from kfp_gpu.plan.recovery import Budget, Usage, Verdict
from kfp_gpu.provisioners.base import Provisioner
from kfp_gpu.spec import ProvisioningSpec
from kfp_gpu.steps.capacity import Capacity
from kfp_gpu.steps.health_gate import HealthGate
from kfp_gpu.steps.health_midrun import MidrunHealth
from kfp_gpu.timeline import NodeState, Timeline

log = logging.getLogger("kfp_gpu.steps.train")
STEP = "train"


class TrainState:
    """Everything one train step knows: capacity, budget, ledger, timeline, and the gang watch."""

    def __init__(self, spec: ProvisioningSpec, run_id: str, api: client.ApiClient, capacity: Capacity,
                 job: str, queue: str = "", *, kind: JobKind | None = None) -> None:
        self.spec, self.run_id, self.api, self.capacity, self.job = spec, run_id, api, capacity, job
        self.kind: JobKind = kind or PyTorchJobKind()  # the job-kind seam (kfp_gpu.jobkinds)
        self.namespace = spec.target.namespace
        self._owner = Owner.for_step(run_id, STEP, spec.lease_ttl_s)
        self.timeline = Timeline(run_id=run_id)
        if capacity.timeline_json:
            self.timeline.merge(Timeline.from_json(capacity.timeline_json))
        self.budget = Budget()
        self.usage = Usage(gpus=spec.nodes * capacity.gpus_per_node)
        self.ledger: dict[str, Any] = {}
        self.degraded = False  # a preemption or eviction took part of the gang; cleared once it is whole again
        self.attempt = 0
        self.resume_step = 0
        self.counted: set[tuple[str, float]] = set()  # node incidents already counted as preemptions
        self._usage_closed = True
        self.queue = ""  # the Kueue LocalQueue the job is submitted to ("" when the namespace is not gated)
        self.stall: Any = None  # kfp_gpu.steps.train_stall.StallSupervisor when the run has a checkpoint store
        self.watch = self.use_queue(queue)
        self.health = HealthGate()  # which nodes passed the GPU health probe (spec.health)
        self.midrun = MidrunHealth(self)  # GPU-fault node conditions while the job runs

    def use_queue(self, queue: str) -> GangWatch:
        """Submit the job to Kueue LocalQueue ``queue`` ("" = none): a gang watch that follows its Workload too.
        Call before ``watch.start()``."""
        self.queue = queue
        self.watch = self.kind.watch(self.api, self.namespace, self.job, local_queue=queue)
        return self.watch

    @property
    def owner(self) -> Owner:
        """The step's ownership (the idempotency key of what it creates). The run's liveness is its GpuGang."""
        return self._owner

    @functools.cached_property
    def backend(self) -> Provisioner:
        """The run's provisioner backend, the one its capacity records (it stays the same across attempts and
        replacements), made once per step."""
        from kfp_gpu import provisioners

        return provisioners.select(self.spec, self.api, None, self.capacity)

    @property
    def provisioned_at_admission(self) -> bool:
        """The run's backend forms the gang when a queue admits the job (``gang_forms_at_admission``): no nodes to
        gate on or pin to beforehand; the nodes the pods land on become the gang."""
        from kfp_gpu.provisioners import capabilities

        backend = capabilities(str(self.capacity.extra.get("provisioner", "node-pool")))
        return backend is not None and backend.gang_forms_at_admission

    @property
    def releases_one_node(self) -> bool:
        """The run's backend gives a node the run gives up back to the platform (``releases_one_node``); else the
        node stays cordoned out of the gang until the autoscaler or teardown removes it."""
        from kfp_gpu.provisioners import capabilities

        backend = capabilities(str(self.capacity.extra.get("provisioner", "node-pool")))
        return backend is not None and backend.releases_one_node

    @property
    def running_at(self) -> float | None:
        return self.watch.running_at

    def load_ledger(self) -> None:
        """Continue the budget of an earlier try of this step. Raises: ApiException."""
        self.ledger = ledger.read(self.api, self.namespace, self.run_id, STEP) or {}
        b = self.ledger.get("budget") or {}
        self.budget = Budget(int(b.get("preemptions", 0)), int(b.get("app_failures", 0)), bool(b.get("on_demand")))
        self.attempt = int(self.ledger.get("attempts", 0))
        self.ledger.update(job=self.job, namespace=self.namespace)

    def save_ledger(self) -> None:
        self.ledger["attempts"] = self.attempt
        self.ledger["capacity"] = json.loads(self.capacity.to_json())
        self.ledger["gpu_hours"] = round(self.usage.gpu_hours, 6)
        self.ledger["timeline"] = self.timeline.to_json()  # teardown's cost report reads job intervals here
        self.ledger["spec"] = self.spec.to_json()  # the janitor tears down with the run's own spec
        self.ledger.setdefault("started", time.time())
        try:
            ledger.write(self.api, self.namespace, self.owner, self.ledger)
        except Exception as exc:  # the ledger is a record; losing one write must not kill training
            log.warning("could not write the train ledger: %s", exc)

    def checkpoint(self) -> Any:
        """The newest complete checkpoint of any recognised format (kfp-gpu, Hugging Face Trainer, DCP, Lightning)
        under ``checkpoint_uri``: a :class:`kfp_gpu.checkpoint.resume.Resume` (``.step``, ``.created``, ``.uri`` /
        ``.path``, ``.format``, ``.meta``, ``.env()``, ``.args()``), or None. Partial checkpoints are skipped with a
        warning; a store that cannot be read is logged and counts as none."""
        if not self.spec.checkpoint_uri:
            return None
        try:
            from kfp_gpu.checkpoint import resume
        except ImportError:  # pragma: no cover - the checkpoint package ships with kfp_gpu
            return None
        try:
            return resume.find(self.spec.checkpoint_uri)
        except KfpGpuError as exc:
            log.warning("cannot read checkpoints at %s: %s", self.spec.checkpoint_uri, exc)
            return None

    def close_usage(self, end: float) -> None:
        """Count the current attempt's running interval into GPU-hours (once)."""
        if not self._usage_closed:
            self.usage.add(self.running_at, end)
            self._usage_closed = True

    def begin_attempt(self, job: dict[str, Any], *, resume_step: int, created: bool) -> None:
        self._usage_closed = False
        self.attempt += 1
        self.resume_step = resume_step
        self.watch.begin(job, self.capacity.nodes, self.spec.nodes, adopt=self.provisioned_at_admission)
        now = time.time()
        kind = "job-created" if created else "job-attached"
        self.timeline.event(kind, now, job=self.job, attempt=self.attempt, resume_step=resume_step)
        if self.attempt > 1 and created:
            self.timeline.event("resumed", now, job=self.job, attempt=self.attempt, step=resume_step)
        self.ledger["status"] = "running"
        self.save_ledger()

    def probe(self, now: float) -> Verdict | None:
        """The running gang's own checks, asked by the watch loop: GPU-fault node conditions first (the node is
        known bad), then stalls and stragglers (kfp_gpu.steps.train_stall). The first verdict wins."""
        found = self.midrun.probe(now)
        if found is None and self.stall is not None:
            found = self.stall.probe(now)
        return found

    def watch_attempt(self, *, admission_s: float, placement_s: float) -> str | Verdict:
        """Raises: GangPlacementFailed, TrainingFailed (see GangWatch.watch_attempt)."""
        try:
            return self.watch.watch_attempt(admission_s=admission_s, placement_s=placement_s, probe=self.probe,
                                            probe_every_s=min(self.midrun.every_s,
                                                              self.stall.every_s if self.stall is not None else 5.0))
        finally:
            if self.running_at is not None:
                self.timeline.event("job-running", self.running_at, job=self.job, attempt=self.attempt)
                if self.provisioned_at_admission:
                    self.ledger.setdefault("adopted_nodes", []).append(sorted(self.watch.gang))
                last = (self.ledger.get("preemptions") or [{}])[-1]
                if last and "time_to_resume_s" not in last and last.get("decided_at"):
                    last["time_to_resume_s"] = round(self.running_at - float(last["decided_at"]), 3)

    def mark_node_preempted(self, node: str, at: float) -> None:
        tl = self.timeline.nodes.get(node)
        if tl is not None:
            try:
                tl.advance(NodeState.PREEMPTED, at)
            except ValueError:
                pass
