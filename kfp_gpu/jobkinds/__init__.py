"""Job kinds: the one seam between the train step (and recovery, teardown) and the kind of training job it runs.

``steps/ -> jobkinds (contract: base.py) -> PyTorchJob (kubeflow.org/v1) | TrainJob (trainer.kubeflow.org/v1alpha1)``.
The steps never branch on the kind: they pick one with :func:`for_template` (the JobTemplate's ``kind``) and talk
to it; teardown and the janitor walk :func:`every`. This package sits between steps/ and cluster/: it never
imports kfp_gpu.steps.
"""

from __future__ import annotations

from kfp_gpu.job import JobTemplate
from kfp_gpu.jobkinds.base import JobKind, JobRequest
from kfp_gpu.jobkinds.pytorchjob import PyTorchJobKind
from kfp_gpu.jobkinds.trainjob import TrainJobKind

__all__ = ["JobKind", "JobRequest", "PyTorchJobKind", "TrainJobKind", "every", "for_template"]


def for_template(template: JobTemplate) -> JobKind:
    """The kind ``template.kind`` names (validated by JobTemplate: ``pytorchjob`` or ``trainjob``)."""
    if template.kind == TrainJobKind.NAME:
        return TrainJobKind.of(template)
    return PyTorchJobKind()


def every() -> tuple[JobKind, ...]:
    """One instance of every kind (teardown and the janitor delete a run's jobs of each)."""
    return PyTorchJobKind(), TrainJobKind()
