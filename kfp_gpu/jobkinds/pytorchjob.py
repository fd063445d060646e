"""The PyTorchJob (Training Operator v1, ``kubeflow.org/v1``) job kind: :mod:`kfp_gpu.cluster.pytorchjob` behind
the job-kind contract (:mod:`kfp_gpu.jobkinds.base`). Gang: ``runPolicy.schedulingPolicy.minAvailable`` = nodes, one
Master + (nodes - 1) Workers; pods are owned by the job (the watch matches them by owner uid)."""

from __future__ import annotations

from typing import Any

from kfp_gpu.cluster import pytorchjob
from kfp_gpu.errors import CrdMissing
from kfp_gpu.jobkinds.base import JobKind, JobRequest


class PyTorchJobKind(JobKind):
    NAME = "pytorchjob"
    resource = pytorchjob.RESOURCE

    def build(self, req: JobRequest) -> dict[str, Any]:
        """Raises: InvalidSpec (resume_args)."""
        return pytorchjob.manifest(
            req.name, capacity=req.capacity, template=req.template, labels=req.labels, nodes=req.nodes,
            checkpoint_uri=req.checkpoint_uri, run_id=req.run_id, dataset_uri=req.dataset_uri,
            pin=req.pin, pod_annotations=req.pod_annotations, local=req.local, queue=req.queue,
            resume=req.resume)

    def crd_missing(self) -> CrdMissing:
        return pytorchjob.crd_missing()
