"""Facts from raw Kubernetes objects: the plain dataclasses :mod:`kfp_gpu.plan.recovery` decides on.

Contract: every function here is pure (no I/O, no kubernetes client): it reads a raw object dict as a watch or a
list returns it (``metadata``/``spec``/``status``) and never raises for a missing field (absent means the
default: not ready, no GPUs, no exit code). :func:`node_fact` and :func:`pod_fact` stamp the fact with the
receive time ``at``; :class:`JobObserver` is how the gang watch reads one job kind (the PyTorchJob's way here;
:mod:`kfp_gpu.jobkinds` gives each kind's). The watches that feed them are :mod:`kfp_gpu.cluster.watch`.
"""

from __future__ import annotations

import calendar
import time
from collections.abc import Mapping
from typing import Any

from kfp_gpu.job_fields import GPU_RESOURCE
from kfp_gpu.ownership import LABEL_RUN_ID
from kfp_gpu.plan.readiness import is_ready
from kfp_gpu.plan.recovery import DISRUPTION_CONDITION, NODE_SHUTTING_DOWN, NodeFact, PodFact

__all__ = ["JobObserver", "job_conditions", "node_fact", "parse_time", "pod_fact", "quantity"]


def parse_time(value: Any) -> float | None:
    """RFC 3339 (``2024-01-02T03:04:05Z``) -> unix seconds; None when absent or unparsable."""
    if not value or not isinstance(value, str):
        return None
    text = value.rstrip("Z").split(".")[0]
    try:
        return float(calendar.timegm(time.strptime(text, "%Y-%m-%dT%H:%M:%S")))
    except ValueError:
        return None


def quantity(value: Any) -> float:
    """A Kubernetes quantity for countable resources ("8", "8k", "500m") as a number."""
    text = str(value or "0")
    mult = {"k": 1e3, "M": 1e6, "G": 1e9, "m": 1e-3}
    if text and text[-1] in mult:
        return float(text[:-1]) * mult[text[-1]]
    try:
        return float(text)
    except ValueError:
        return 0.0


def node_fact(obj: Mapping[str, Any], at: float, *, deleted: bool = False) -> NodeFact:
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    shutting_down = any(c.get("type") == "Ready" and c.get("status") != "True"
                        and NODE_SHUTTING_DOWN in str(c.get("message") or "") for c in status.get("conditions") or [])
    return NodeFact(
        name=str(meta.get("name", "")), at=at, exists=not deleted and not meta.get("deletionTimestamp"),
        ready=is_ready(obj), unschedulable=bool(spec.get("unschedulable")),
        taints=tuple(str(t.get("key", "")) for t in spec.get("taints") or []),
        gpus=quantity((status.get("allocatable") or {}).get(GPU_RESOURCE)),
        zone=str((meta.get("labels") or {}).get("topology.kubernetes.io/zone", "")),
        claimed_by=str((meta.get("labels") or {}).get(LABEL_RUN_ID, "")),
        uid=str(meta.get("uid", "")), shutting_down=shutting_down,
        conditions=tuple((str(c.get("type", "")), str(c.get("status", ""))) for c in status.get("conditions") or []
                         if c.get("type") != "Ready"),
    )


def pod_fact(obj: Mapping[str, Any], at: float, *, deleted: bool = False, owner: str | None = None) -> PodFact:
    """A pod as a fact; ``owner`` overrides what it belongs to (default: its first owner reference's uid)."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    disruption = ""
    for c in status.get("conditions") or []:
        if c.get("type") == DISRUPTION_CONDITION and c.get("status") == "True":
            disruption = str(c.get("reason") or DISRUPTION_CONDITION)
    exit_code: int | None = None
    term_reason = ""
    for cs in status.get("containerStatuses") or []:
        term = (cs.get("state") or {}).get("terminated") or (cs.get("lastState") or {}).get("terminated")
        if term and term.get("exitCode") is not None:
            code = int(term["exitCode"])
            if exit_code is None or code != 0:
                exit_code, term_reason = code, str(term.get("reason") or "")
    labels = meta.get("labels") or {}
    owners = meta.get("ownerReferences") or []
    return PodFact(
        name=str(meta.get("name", "")), node=str(spec.get("nodeName") or ""), at=at,
        phase=str(status.get("phase") or "Pending"), exit_code=exit_code, disruption=disruption,
        reason=str(status.get("reason") or term_reason), deleted=deleted,
        terminating=bool(meta.get("deletionTimestamp")),
        role=str(labels.get("training.kubeflow.org/replica-type", "")),
        owner_uid=owner if owner is not None else str(owners[0].get("uid", "")) if owners else "",
    )


class JobObserver:
    """How the watch reads one job kind (the PyTorchJob's way here; :mod:`kfp_gpu.jobkinds` gives each kind's):
    which attempt a job and a pod belong to, the job's true conditions, and whether it is suspended."""

    def job_key(self, job: Mapping[str, Any]) -> str:
        """The attempt a job object is (default: its uid)."""
        return str((job.get("metadata") or {}).get("uid", ""))

    def pod_key(self, pod: Mapping[str, Any]) -> str:
        """The attempt a pod belongs to (default: its first owner reference's uid, the job's)."""
        owners = (pod.get("metadata") or {}).get("ownerReferences") or []
        return str(owners[0].get("uid", "")) if owners else ""

    def conditions(self, job: Mapping[str, Any]) -> dict[str, str]:
        """True conditions by type (``Succeeded``, ``Failed``, ``Running``...) -> reason."""
        return job_conditions(job)

    def suspended(self, job: Mapping[str, Any]) -> bool:
        return bool(((job.get("spec") or {}).get("runPolicy") or {}).get("suspend"))


def job_conditions(job: Mapping[str, Any]) -> dict[str, str]:
    """A job's True conditions by type -> reason (or message)."""
    out: dict[str, str] = {}
    for c in (job.get("status") or {}).get("conditions") or []:
        if c.get("status") == "True":
            out[str(c.get("type"))] = str(c.get("reason") or c.get("message") or "")
    return out
