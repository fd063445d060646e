"""The job-kind contract: what the train step, recovery and teardown need from a kind of training job.

A job kind turns one attempt of the run's training (:class:`JobRequest`: the user's JobTemplate, the capacity and
gang, the checkpoint to resume from, ownership labels, the Kueue queue) into a Kubernetes object, and manages that
object by name: create-or-attach, get, foreground delete, wait until it and its pods are gone, and teardown of
every job of a run by its run-id label. It also tells the gang watch how to read the object
(:class:`kfp_gpu.cluster.facts.JobObserver`): which attempt a job and a pod belong to, the job's conditions in the
watch's words (``Succeeded``, ``Failed``, ``Running``), and whether it is suspended (Kueue). The watch then gives
the same verdicts (preemption, application failure, queue eviction, success) for every kind.

Semantics every kind keeps:

- **Idempotent by run id.** The job's name is deterministic (:meth:`JobKind.job_name`); ``create_or_get`` of an
  existing, not-deleting job returns it (a retried step re-attaches) and says it did not create it.
- **Same pods.** Every kind renders its pods with :func:`kfp_gpu.cluster.podtemplate.pod_template`: the same
  container, env (incl. the resume variables), resources (the node's GPUs), tolerations (the run's claim taint),
  node selector, gang pin and annotations; each pod carries the ``kfp-gpu.io/job=<name>`` label (the watch's and
  :meth:`JobKind.wait_gone`'s pod selector) and the ownership labels.
- **Labelled.** The job carries the run's ownership labels (``kfp-gpu.io/run-id``, ``step``, ``lease-expires``),
  so teardown and the janitor find it without the step. With a queue it carries ``kueue.x-k8s.io/queue-name`` and
  is created suspended.
- **Resume.** :meth:`JobKind.resume_step` reads back the step an existing job was created to resume from.
- **Classified API errors.** Every call that reaches the API server goes through
  :func:`kfp_gpu.cluster.apierrors.call`: a 429, a 5xx or a timeout is retried with bounded back-off (never before
  the server's Retry-After), and what still fails is raised as a classified :class:`~kfp_gpu.errors.KfpGpuError`
  (``RateLimited``/``TransientCloudError`` are transient, ``PermissionDenied`` for RBAC, ``CrdMissing`` for a kind
  that is not served), never as a bare ``ApiException``.

Kinds: :class:`kfp_gpu.jobkinds.pytorchjob.PyTorchJobKind` (Training Operator v1) and
:class:`kfp_gpu.jobkinds.trainjob.TrainJobKind` (Trainer v2). Pick one with :func:`kfp_gpu.jobkinds.for_template`.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

from kubernetes import client

from kfp_gpu.cluster import apierrors, customjob
from kfp_gpu.cluster.capacity import Capacity
from kfp_gpu.cluster.facts import JobObserver
from kfp_gpu.cluster.watch import GangWatch
from kfp_gpu.errors import CrdMissing
from kfp_gpu.job import JobTemplate
from kfp_gpu.ownership import JOB_LABEL, LABEL_RUN_ID, RESUME_STEP_ANNOTATION, label_safe

T = TypeVar("T")


@dataclass(frozen=True)
class JobRequest:
    """One attempt of the run's training job, as the train step asks for it.

    ``resume`` is the checkpoint record to resume from (``.step``, and ``.path``/``.format``/``.args()`` when
    :class:`kfp_gpu.checkpoint.resume.Resume`), or None for a fresh start. ``pin`` pins every pod to the
    nodes the run claimed, by its claim label (False when Kueue provisions the gang at admission).
    """

    name: str
    template: JobTemplate
    capacity: Capacity
    labels: Mapping[str, str]
    nodes: int
    run_id: str
    checkpoint_uri: str = ""
    resume: Any = None
    dataset_uri: str = ""
    pod_annotations: Mapping[str, str] = field(default_factory=dict)
    local: bool = False
    queue: str = ""
    pin: bool = True


class JobKind(JobObserver, ABC):
    """One kind of training job (see the module docstring for the semantics every kind keeps)."""

    NAME: ClassVar[str]
    resource: ClassVar[customjob.Resource]
    # the job's status may carry a trainer progress report (Kubeflow Trainer v2 alpha ``status.trainerStatus``)
    TRAINER_STATUS: ClassVar[bool] = False

    @staticmethod
    def job_name(run_id: str, template: str) -> str:
        """Deterministic, DNS-1035-safe name (<= 50 chars) of the run's job for ``template``."""
        from kfp_gpu.cluster.pytorchjob import job_name

        return job_name(run_id, template)

    def prepare(self, api: client.ApiClient, namespace: str) -> dict[str, Any]:
        """Read what the kind needs from the cluster before the first build (TrainJob: its runtime); returns facts
        for the ledger and the report. Call once per step.

        Raises: InvalidSpec (e.g. a runtime that does not exist), CrdMissing, KfpGpuError (classified).
        """
        return {}

    @abstractmethod
    def build(self, req: JobRequest) -> dict[str, Any]:
        """The job's body for one attempt (a plain dict). Raises: InvalidSpec (resume_args)."""

    def create_or_get(self, api: client.ApiClient, namespace: str, body: dict[str, Any]
                      ) -> tuple[dict[str, Any], bool]:
        """Create the job, or return the live one of that name (re-attach). Returns (job, created).

        Raises: CrdMissing (the kind is not served), KfpGpuError (classified, incl. an admission webhook's refusal).
        """
        name = (body.get("metadata") or {}).get("name", "")
        return self._call(lambda: customjob.create_or_get(api, self.resource, namespace, body, self.crd_missing),
                          f"create {self.resource.plural} {namespace}/{name}")

    def get(self, api: client.ApiClient, namespace: str, name: str) -> dict[str, Any] | None:
        """The job or None. Raises: KfpGpuError (classified, non-404)."""
        return self._call(lambda: customjob.get(api, self.resource, namespace, name),
                          f"read {self.resource.plural} {namespace}/{name}")

    def delete(self, api: client.ApiClient, namespace: str, name: str) -> bool:
        """Foreground delete; False when already gone. Raises: KfpGpuError (classified)."""
        return self._call(lambda: customjob.delete(api, self.resource, namespace, name),
                          f"delete {self.resource.plural} {namespace}/{name}")

    def wait_gone(self, api: client.ApiClient, namespace: str, name: str, *, timeout_s: float) -> bool:
        """True once the job and its pods are gone (pods stuck on vanished nodes force-deleted) within
        ``timeout_s``. Raises: KfpGpuError (classified)."""
        return self._call(lambda: customjob.wait_gone(api, self.resource, namespace, name, timeout_s=timeout_s,
                                                      clock=time.time),
                          f"wait for {self.resource.plural} {namespace}/{name} to be gone")

    def pod_selector(self, name: str) -> str:
        return f"{JOB_LABEL}={name}"

    def watch(self, api: client.ApiClient, namespace: str, name: str, *, local_queue: str = "") -> GangWatch:
        """The gang watch of job ``name`` (nodes, its pods, the job; its Workload with a Kueue ``local_queue``)."""
        r = self.resource
        return GangWatch(api, namespace, name, r.group, r.version, r.plural, self.pod_selector(name),
                         local_queue=local_queue, observer=self)

    def resume_step(self, job: Mapping[str, Any]) -> int:
        """The checkpoint step an existing job was created to resume from (0: a fresh start)."""
        ann = (job.get("metadata") or {}).get("annotations") or {}
        try:
            return int(ann.get(RESUME_STEP_ANNOTATION, "0"))
        except ValueError:
            return 0

    def served(self, api: client.ApiClient) -> bool:
        """Whether the cluster serves the kind (discovery). Raises: KfpGpuError (classified, non-404)."""
        r = self.resource
        return self._call(lambda: customjob.served(api, r.group, r.version, r.plural), f"discover {r.group}/{r.version}")

    @abstractmethod
    def crd_missing(self) -> CrdMissing:
        """The error for a cluster that does not serve the kind (names the CRD and how to install it)."""

    def delete_for_run(self, api: client.ApiClient, namespace: str, run_id: str) -> list[str]:
        """Foreground-delete every job of this kind labelled with ``run_id``; their names. Nothing when the kind is
        not served. Raises: KfpGpuError (classified)."""
        names = []
        selector = f"{LABEL_RUN_ID}={label_safe(run_id)}"
        for job in self._call(lambda: customjob.list_for(api, self.resource, namespace, selector),
                              f"list {self.resource.plural} of run {run_id}"):
            name = str(job["metadata"]["name"])
            self.delete(api, namespace, name)
            names.append(name)
        return names

    @staticmethod
    def _call(fn: Callable[[], T], what: str) -> T:
        """One API call of the contract: transient errors retried, the rest raised classified."""
        return apierrors.call(fn, what)
