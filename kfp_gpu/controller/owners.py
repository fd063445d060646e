"""Is the pipeline that owns a gang still there? The controller releases a gang whose owner is gone, at once,
without waiting for any lease.

The owner a step records in ``spec.owner`` (:func:`kfp_gpu.cluster.lease.detect_identity`): the Argo Workflow of a
Kubeflow run (observed: gone when deleted or finished), the ``kfp-gpu run`` process of a local rehearsal
(``local:<host>:<pid>``, observed while the controller runs on that host), or only a step pod. A step pod alone does
not decide: the pods of one run come and go between steps, and only the Workflow (or the local process) spans the
run. An owner the controller cannot observe (another host, no Workflow) never releases a gang by itself; teardown
or deleting the GpuGang does.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping
from typing import Any

from kubernetes import client

from kfp_gpu.cluster.owners import Owners, pid_alive
from kfp_gpu.plan.lease import LOCAL_OWNER, WORKFLOW_OWNER, OwnerRef, OwnerState, local_state


def deciding_owner(owner: Mapping[str, Any], hostname: str) -> OwnerRef | None:
    """The one recorded owner whose end ends the run, or None when none can be observed from ``hostname``."""
    if owner.get("workflow"):
        return OwnerRef(WORKFLOW_OWNER, str(owner["workflow"]))
    local = str(owner.get("local") or "")
    parts = local.split(":")
    if len(parts) == 3 and parts[0] == LOCAL_OWNER and parts[1] == hostname:
        return OwnerRef(LOCAL_OWNER, local)
    return None


def gone(api: client.ApiClient, owner: Mapping[str, Any], hostname: str | None = None) -> str:
    """"" while the owner lives (or cannot be observed); else what is gone, for the gang's Event."""
    host = hostname or socket.gethostname()
    ref = deciding_owner(owner, host)
    if ref is None:
        return ""
    if ref.kind == LOCAL_OWNER:
        state = local_state(ref.ref, host, pid_alive)
    else:
        state = Owners(api).state(ref)
    return str(ref) if state is OwnerState.GONE else ""
