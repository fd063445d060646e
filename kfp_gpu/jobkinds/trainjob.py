"""The TrainJob (Kubeflow Trainer v2, ``trainer.kubeflow.org/v1alpha1``) job kind: :mod:`kfp_gpu.cluster.trainjob`
behind the job-kind contract (:mod:`kfp_gpu.jobkinds.base`).

:meth:`TrainJobKind.prepare` reads the referenced runtime (ClusterTrainingRuntime or TrainingRuntime): the trainer's
replicated job and its ``podGroupPolicy``. Pods belong to Jobs of a JobSet, not to the TrainJob, so each attempt
carries a fresh ``kfp-gpu.io/attempt`` value (TrainJob annotation, pod label) and the watch matches on it. The
TrainJob's ``Complete`` condition is the watch's ``Succeeded``; suspension is ``spec.suspend``.

Kueue-managed TrainJobs: Kueue (v0.17, built on the Trainer v2.2 Go types) admits and suspends a TrainJob with a
full ``Update`` of the object it decoded, so whatever does not survive a Go round trip changes; ``spec.trainer`` is
immutable (CEL ``self == oldSelf``), so such a change makes the Trainer refuse every admission ("spec.trainer:
field is immutable") and the job waits forever. :func:`as_go_writes_it` writes the body the way the Go types
serialize it (an env var's empty ``value`` left out, empty lists left out, resource quantities in canonical form).
One field cannot be saved that way: Trainer v2.2 has no ``terminationGracePeriodSeconds`` in a runtimePatch, so
Kueue's update drops it, the Trainer rebuilds the JobSet without it, and JobSet refuses the change (its pod
template is immutable but for placement); :meth:`TrainJobKind.build` refuses it on a queued TrainJob.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from decimal import ROUND_CEILING, Decimal
from typing import Any

from kubernetes import client

from kfp_gpu import ownership
from kfp_gpu.cluster import trainjob
from kfp_gpu.errors import CrdMissing, InvalidSpec
from kfp_gpu.job import JobTemplate
from kfp_gpu.job_fields import DEFAULT_RUNTIME, RUNTIME_KINDS
from kfp_gpu.jobkinds.base import JobKind, JobRequest

GRACE = "terminationGracePeriodSeconds"


class TrainJobKind(JobKind):
    NAME = "trainjob"
    resource = trainjob.RESOURCE
    TRAINER_STATUS = True  # trainer.kubeflow.org/v1alpha1 serves status.trainerStatus (feature gate TrainJobStatus)

    def __init__(self, runtime: str = DEFAULT_RUNTIME, runtime_kind: str = RUNTIME_KINDS[0]) -> None:
        self.runtime_ref = (runtime or DEFAULT_RUNTIME, runtime_kind or RUNTIME_KINDS[0])
        self.runtime: trainjob.Runtime | None = None

    @classmethod
    def of(cls, template: JobTemplate) -> TrainJobKind:
        return cls(template.runtime, template.runtime_kind)

    def prepare(self, api: client.ApiClient, namespace: str) -> dict[str, Any]:
        """Read the runtime. Raises: InvalidSpec (no such runtime, or no trainer ``node`` container), CrdMissing,
        KfpGpuError (classified)."""
        self.runtime = self._call(lambda: trainjob.read_runtime(api, namespace, *self.runtime_ref),
                                  f"read {self.runtime_ref[1]} {self.runtime_ref[0]}")
        return {"runtime": self.runtime.name, "runtime_kind": self.runtime.kind,
                "replicated_job": self.runtime.replicated_job,
                "gang_scheduler": self.runtime.gang_scheduler or "none (kfp-gpu's gang pin)"}

    def build(self, req: JobRequest) -> dict[str, Any]:
        """Raises: InvalidSpec (resume_args; ``terminationGracePeriodSeconds`` on a Kueue-queued TrainJob). Uses the
        runtime :meth:`prepare` read (the reference's defaults when it was not called: replicated job and container
        ``node``)."""
        grace = req.template.pod_extra.get(GRACE)
        if req.queue and grace is not None:
            raise InvalidSpec(
                f"train.pod_extra.{GRACE}", grace, f"a TrainJob admitted through Kueue (LocalQueue {req.queue}) cannot "
                "carry it: Kueue v0.17 drops it from the TrainJob's runtimePatch when it admits the job (it knows the "
                "Trainer v2.2 API), and the JobSet then refuses the changed pod template, so the job never runs",
                remediation=f"set {GRACE} in the pod template of the runtime ({self.runtime_ref[1]} "
                f"{self.runtime_ref[0]}) instead, or use kind='pytorchjob'")
        rt = self.runtime or trainjob.Runtime(*self.runtime_ref)
        return as_go_writes_it(trainjob.manifest(
            req.name, capacity=req.capacity, template=req.template, runtime=rt, labels=req.labels, nodes=req.nodes,
            checkpoint_uri=req.checkpoint_uri, resume=req.resume, run_id=req.run_id,
            attempt=trainjob.attempt_id(req.name), dataset_uri=req.dataset_uri, pin=req.pin,
            pod_annotations=req.pod_annotations, local=req.local, queue=req.queue))

    def job_key(self, job: Mapping[str, Any]) -> str:
        return str(((job.get("metadata") or {}).get("annotations") or {}).get(ownership.ATTEMPT, ""))

    def pod_key(self, pod: Mapping[str, Any]) -> str:
        return str(((pod.get("metadata") or {}).get("labels") or {}).get(ownership.ATTEMPT, ""))

    def conditions(self, job: Mapping[str, Any]) -> dict[str, str]:
        return trainjob.conditions(job)

    def suspended(self, job: Mapping[str, Any]) -> bool:
        return bool((job.get("spec") or {}).get("suspend"))

    def crd_missing(self) -> CrdMissing:
        return trainjob.crd_missing()


_BINARY = ("Ki", "Mi", "Gi", "Ti", "Pi", "Ei")
_DECIMAL = {-9: "n", -6: "u", -3: "m", 0: "", 3: "k", 6: "M", 9: "G", 12: "T", 15: "P", 18: "E"}


def canonical_quantity(value: Any) -> str:
    """A resource quantity as Go's ``resource.Quantity`` writes it (``1000m`` -> ``1``, ``0.5`` -> ``500m``,
    ``1024Mi`` -> ``1Gi``, ``8`` -> ``"8"``); an exponent form (``1e3``) or anything unparsable is returned as given."""
    from kubernetes.utils import parse_quantity

    text = str(value).strip()
    if re.fullmatch(r"[+-]?[0-9.]+[eE][+-]?[0-9]+", text):
        return text
    try:
        v = Decimal(parse_quantity(text))
    except ValueError:
        return text
    if text.endswith(_BINARY) and abs(v) >= 1024 and v == v.to_integral_value():
        n, e = int(v), 0
        while e < len(_BINARY) and n % 1024 == 0:
            n, e = n // 1024, e + 1
        return f"{n}{('', *_BINARY)[e]}"
    n, e = int((v * 10**9).to_integral_value(rounding=ROUND_CEILING)), -9
    if n == 0:
        return "0"
    while e < 18 and n % 1000 == 0:
        n, e = n // 1000, e + 3
    return f"{n}{_DECIMAL[e]}"


def as_go_writes_it(body: dict[str, Any]) -> dict[str, Any]:
    """``body`` (a TrainJob) with ``spec.trainer`` and the patches' volumes as the Go types serialize them (see the
    module docstring): no empty ``value`` on an env var, no empty list or map, canonical quantities."""
    out = copy.deepcopy(body)
    spec = out.get("spec") or {}
    tr = spec.get("trainer") or {}
    for e in tr.get("env") or []:
        if e.get("value") == "":
            del e["value"]
    res = tr.get("resourcesPerNode") or {}
    for k in ("limits", "requests"):
        if k in res:
            res[k] = {r: canonical_quantity(q) for r, q in (res[k] or {}).items()}
            if not res[k]:
                del res[k]
    for k in [k for k, v in tr.items() if v in ([], {}, None)]:
        del tr[k]
    for patch in spec.get("runtimePatches") or []:
        for rj in (((patch.get("trainingRuntimeSpec") or {}).get("template") or {}).get("spec") or {}).get(
                "replicatedJobs") or []:
            pod = ((rj.get("template") or {}).get("spec") or {}).get("template") or {}
            for vol in (pod.get("spec") or {}).get("volumes") or []:
                ed = vol.get("emptyDir")
                if isinstance(ed, dict) and "sizeLimit" in ed:
                    ed["sizeLimit"] = canonical_quantity(ed["sizeLimit"])
    return out
