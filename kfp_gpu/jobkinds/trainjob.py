"""The TrainJob (Kubeflow Trainer v2, ``trainer.kubeflow.org/v1alpha1``) job kind: :mod:`kfp_gpu.cluster.trainjob`
behind the job-kind contract (:mod:`kfp_gpu.jobkinds.base`).

:meth:`TrainJobKind.prepare` reads the referenced runtime (ClusterTrainingRuntime or TrainingRuntime): the trainer's
replicated job and its ``podGroupPolicy``. Pods belong to Jobs of a JobSet, not to the TrainJob, so each attempt
carries a fresh ``kfp-gpu.io/attempt`` value (TrainJob annotation, pod label) and the watch matches on it. The
TrainJob's ``Complete`` condition is the watch's ``Succeeded``; suspension is ``spec.suspend``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kubernetes import client

from kfp_gpu.cluster import trainjob
from kfp_gpu.errors import CrdMissing
from kfp_gpu.job import JobTemplate
from kfp_gpu.job_fields import DEFAULT_RUNTIME, RUNTIME_KINDS
from kfp_gpu.jobkinds.base import JobKind, JobRequest


class TrainJobKind(JobKind):
    NAME = "trainjob"
    resource = trainjob.RESOURCE

    def __init__(self, runtime: str = DEFAULT_RUNTIME, runtime_kind: str = RUNTIME_KINDS[0]) -> None:
        self.runtime_ref = (runtime or DEFAULT_RUNTIME, runtime_kind or RUNTIME_KINDS[0])
        self.runtime: trainjob.Runtime | None = None

    @classmethod
    def of(cls, template: JobTemplate) -> TrainJobKind:
        return cls(template.runtime, template.runtime_kind)

    def prepare(self, api: client.ApiClient, namespace: str) -> dict[str, Any]:
        """Read the runtime. Raises: InvalidSpec (no such runtime, or no trainer ``node`` container), CrdMissing,
        ApiException."""
        self.runtime = trainjob.read_runtime(api, namespace, *self.runtime_ref)
        return {"runtime": self.runtime.name, "runtime_kind": self.runtime.kind,
                "replicated_job": self.runtime.replicated_job,
                "gang_scheduler": self.runtime.gang_scheduler or "none (kfp-gpu's gang pin)"}

    def build(self, req: JobRequest) -> dict[str, Any]:
        """Raises: InvalidSpec (resume_args). Uses the runtime :meth:`prepare` read (the reference's defaults
        when it was not called: replicated job and container ``node``)."""
        rt = self.runtime or trainjob.Runtime(*self.runtime_ref)
        return trainjob.manifest(
            req.name, capacity=req.capacity, template=req.template, runtime=rt, labels=req.labels, nodes=req.nodes,
            checkpoint_uri=req.checkpoint_uri, resume=req.resume, run_id=req.run_id,
            attempt=trainjob.attempt_id(req.name), dataset_uri=req.dataset_uri, gang_nodes=req.gang_nodes,
            pod_annotations=req.pod_annotations, local=req.local, queue=req.queue)

    def job_key(self, job: Mapping[str, Any]) -> str:
        return str(((job.get("metadata") or {}).get("annotations") or {}).get(trainjob.ATTEMPT, ""))

    def pod_key(self, pod: Mapping[str, Any]) -> str:
        return str(((pod.get("metadata") or {}).get("labels") or {}).get(trainjob.ATTEMPT, ""))

    def conditions(self, job: Mapping[str, Any]) -> dict[str, str]:
        return trainjob.conditions(job)

    def suspended(self, job: Mapping[str, Any]) -> bool:
        return bool((job.get("spec") or {}).get("suspend"))

    def crd_missing(self) -> CrdMissing:
        return trainjob.crd_missing()
