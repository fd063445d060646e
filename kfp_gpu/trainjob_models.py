"""A ``kubeflow`` SDK TrainJob (Trainer v2) as JobTemplate fields.

Accepts ``kubeflow_trainer_api.models.TrainerV1alpha1TrainJob`` or ``TrainerV1alpha1TrainJobSpec`` (the models the
``kubeflow`` SDK's ``kubeflow.trainer`` builds on), or the same as a plain camelCase dict (``{"apiVersion":
"trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", ...}`` or its ``spec``). kfp-gpu keeps the runtime reference
and the trainer (image, command, args, env, ``resourcesPerNode`` minus the GPUs, ``numProcPerNode``) and the
metadata's name, labels and annotations. It sets the gang size (``numNodes``), placement (a runtime patch of its
own), suspension and the resume env itself, so ``numNodes``, ``runtimePatches``, ``suspend``, ``managedBy``,
``initializer`` and ``activeDeadlineSeconds`` must be empty. The SDK is imported by the caller only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kfp_gpu import job_fields as f
from kfp_gpu.errors import InvalidSpec

_KEPT_SPEC = ("runtimeRef", "trainer")
_TRAINER = ("image", "command", "args", "env", "resourcesPerNode", "numProcPerNode", "numNodes")
_WHY = {
    "runtimePatches": "kfp-gpu writes the placement patch itself; put pod fields in kfp_gpu.train(...) instead",
    "suspend": "kfp-gpu suspends the job itself when it goes to a Kueue queue",
    "managedBy": "kfp-gpu runs the job with the Trainer controller",
    "initializer": "dataset/model initializers are not run by kfp-gpu; pass the dataset to kfp_gpu.train(dataset=)",
    "activeDeadlineSeconds": "kfp-gpu owns restarts and deadlines (recovery budget)",
}


def is_trainjob(job: Any) -> bool:
    """True for a Trainer v2 TrainJob (model or dict) or its spec."""
    d = _plain(job)
    if not isinstance(d, Mapping):
        return False
    return d.get("kind") == "TrainJob" or str(d.get("apiVersion", "")).startswith("trainer.kubeflow.org/") \
        or "runtimeRef" in d or "runtimeRef" in (d.get("spec") or {})


def trainjob_fields(job: Any) -> dict[str, Any]:
    """JobTemplate keyword arguments (``kind="trainjob"``) from a TrainJob or its spec.

    Raises:
        InvalidSpec: naming the part of ``job`` kfp-gpu cannot keep and what to do instead.
    """
    d = _plain(job)
    meta: Mapping[str, Any] = {}
    where = "job"
    if isinstance(d, Mapping) and "runtimeRef" not in d and isinstance(d.get("spec"), Mapping):
        meta, d, where = d.get("metadata") or {}, d["spec"], "job.spec"
    if not isinstance(d, Mapping):
        raise InvalidSpec("job", type(job).__name__, "must be a kubeflow TrainerV1alpha1TrainJob, its spec, or the "
                          "same as a dict")
    for key in sorted(k for k, v in d.items() if k not in _KEPT_SPEC and v):
        raise InvalidSpec(f"{where}.{key}", d[key], _WHY.get(key, "is not supported"), remediation=f"remove {where}.{key}")
    ref = d.get("runtimeRef") or {}
    out: dict[str, Any] = {"kind": "trainjob"}
    if ref.get("name"):
        out["runtime"] = ref["name"]
    if ref.get("kind"):
        out["runtime_kind"] = ref["kind"]
    if ref.get("apiGroup") not in (None, "", "trainer.kubeflow.org"):
        raise InvalidSpec(f"{where}.runtimeRef.apiGroup", ref["apiGroup"], "must be trainer.kubeflow.org")
    tr = d.get("trainer") or {}
    bad = sorted(set(tr) - set(_TRAINER))
    if bad:
        raise InvalidSpec(f"{where}.trainer.{bad[0]}", tr[bad[0]], f"is not supported; kept: {', '.join(_TRAINER)}")
    if tr.get("numNodes") is not None:
        raise InvalidSpec(f"{where}.trainer.numNodes", tr["numNodes"], "kfp-gpu sets it to the gang size (spec.nodes)",
                          remediation="remove numNodes; set ProvisioningSpec(nodes=...)")
    for key, field in (("image", "image"), ("command", "command"), ("args", "args")):
        if tr.get(key):
            out[field] = list(tr[key]) if key != "image" else tr[key]
    env = {e["name"]: {"valueFrom": e["valueFrom"]} if e.get("valueFrom") else e.get("value", "")
           for e in tr.get("env") or []}
    if env:
        out["env"] = env
    res = {k: {r: q for r, q in (v or {}).items() if r != f.GPU_RESOURCE}  # kfp-gpu sets the node's GPUs
           for k, v in (tr.get("resourcesPerNode") or {}).items() if k in ("requests", "limits")}
    res = {k: v for k, v in res.items() if v}
    if res:
        out["resources"] = res
    if tr.get("numProcPerNode") is not None:
        out["nproc_per_node"] = tr["numProcPerNode"]
    if meta.get("name"):
        out["name"] = meta["name"]
    if meta.get("labels"):
        out["labels"] = dict(meta["labels"])
    if meta.get("annotations"):
        out["annotations"] = dict(meta["annotations"])
    return out


def _plain(job: Any) -> Any:
    if isinstance(job, Mapping):
        return job
    if hasattr(job, "to_dict") and hasattr(type(job), "model_fields"):  # the kubeflow SDK's pydantic models
        return _quantities(job.to_dict())
    return job


def _quantities(value: Any) -> Any:
    """The SDK renders a resource quantity as a model; keep its string."""
    if isinstance(value, dict):
        if set(value) == {"actual_instance"} or set(value) == {"actualInstance"}:
            return next(iter(value.values()))
        return {k: _quantities(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_quantities(v) for v in value]
    return value
