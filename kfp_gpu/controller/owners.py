"""Is the pipeline that owns a gang still there? The controller releases a gang whose owner is gone, at once,
without waiting for any lease.

The owner a step records in ``spec.owner`` (:func:`kfp_gpu.gang.client.owner_of`): the Argo Workflow of a Kubeflow
run (observed: gone when deleted or finished), the ``kfp-gpu run`` process of a local rehearsal
(``local:<host>:<pid>``, observed while the controller runs on that host), or, for an owner the controller cannot
observe (a Vertex AI pipeline, steps started from another host), a heartbeat: ``spec.owner.heartbeat: "true"``, and
its steps write ``kfp-gpu.io/heartbeat`` (unix seconds) on the gang while they run. Such a gang is released once
neither a beat nor its creation is within the spec's ``lease_ttl_s`` (:func:`kfp_gpu.plan.lease.heartbeat_state`).
A step pod alone does not decide: the pods of one run come and go between steps. Anything else never releases a
gang by itself; teardown or deleting the GpuGang does.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Mapping
from typing import Any

from kubernetes import client

from kfp_gpu import ownership
from kfp_gpu.cluster.facts import parse_time
from kfp_gpu.cluster.owners import Owners, pid_alive
from kfp_gpu.plan.lease import (
    HEARTBEAT_OWNER,
    LOCAL_OWNER,
    WORKFLOW_OWNER,
    OwnerRef,
    OwnerState,
    heartbeat_state,
    local_state,
)
from kfp_gpu.spec import DEFAULT_LEASE_TTL_S


def deciding_owner(owner: Mapping[str, Any], hostname: str) -> OwnerRef | None:
    """The one recorded owner whose end ends the run, or None when none can be observed from ``hostname``."""
    if owner.get("workflow"):
        return OwnerRef(WORKFLOW_OWNER, str(owner["workflow"]))
    local = str(owner.get("local") or "")
    parts = local.split(":")
    if len(parts) == 3 and parts[0] == LOCAL_OWNER and parts[1] == hostname:
        return OwnerRef(LOCAL_OWNER, local)
    if str(owner.get("heartbeat") or "") == "true":
        return OwnerRef(HEARTBEAT_OWNER, ownership.HEARTBEAT_ANNOTATION)
    return None


def _beat(value: Any) -> float | None:
    try:
        return float(value) if value not in (None, "") else None
    except (TypeError, ValueError):
        return None


def gone(api: client.ApiClient, obj: Mapping[str, Any], hostname: str | None = None,
         now: float | None = None) -> str:
    """"" while the owner of the gang ``obj`` lives (or cannot be observed); else what is gone, for the gang's Event."""
    host = hostname or socket.gethostname()
    spec = obj.get("spec") or {}
    ref = deciding_owner(spec.get("owner") or {}, host)
    if ref is None:
        return ""
    if ref.kind == LOCAL_OWNER:
        state = local_state(ref.ref, host, pid_alive)
    elif ref.kind == HEARTBEAT_OWNER:
        meta = obj.get("metadata") or {}
        ttl = float((spec.get("provisioning") or {}).get("lease_ttl_s") or DEFAULT_LEASE_TTL_S)
        state = heartbeat_state(_beat((meta.get("annotations") or {}).get(ownership.HEARTBEAT_ANNOTATION)),
                                parse_time(meta.get("creationTimestamp")), ttl, time.time() if now is None else now)
        return f"the owner's heartbeat (no beat for {ttl:.0f}s, lease_ttl_s)" if state is OwnerState.GONE else ""
    else:
        state = Owners(api).state(ref)
    return str(ref) if state is OwnerState.GONE else ""
