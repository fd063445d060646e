"""The GpuGang contract: one namespaced object per pipeline run, the unit of intent, observation and release.

A pipeline step (running as its namespace's ServiceAccount ``kfp-gpu``, a namespaced Role only) writes the
*intent*; the controller (``kfp-gpu controller``, ServiceAccount ``kfp-gpu-system/kfp-gpu-controller``, the only
holder of cluster-scoped rights and of the cloud identity) does the work and reports in ``status``. Conditions are
the API, as in Kueue and ProvisioningRequest.

``spec`` (written by the steps; ``provisioning`` is immutable once set, enforced by the CRD):
    runId           the pipeline run id (label ``kfp-gpu.io/run-id`` too)
    provisioning    the whole :class:`~kfp_gpu.spec.ProvisioningSpec` as JSON (an object), run-time values applied
    accelerator, nodes, gpusPerNode, capacityType, zones, pools, backend, deadlineSeconds, maxRunSeconds,
    recoveryBudget, warmPoolNodes
                    mirrors of ``provisioning`` for printer columns, policy and admission (the controller refuses a
                    gang whose mirrors disagree with ``provisioning``)
    stage           how far the pipeline wants the gang to go: Preflighted < WarmPoolHeld < Provisioned; each step
                    raises it and waits for the condition of that name
    jobs            {name: {job, datasetUri, queueTimeoutS}}: the training jobs the train steps ask the controller
                    to run and supervise on the gang (PyTorchJob or TrainJob, in the gang's namespace)
    release         true: release everything now (teardown); deleting the object does the same (finalizer)
    owner           who runs the pipeline: {pod, podUid, workflow, local, heartbeat} as recorded by
                    :func:`kfp_gpu.gang.client.owner_of`; the controller releases the gang once it is gone. An
                    owner it cannot observe (no Argo Workflow, no local rehearsal process: a Vertex AI pipeline)
                    has ``heartbeat: "true"``: its steps write the annotation ``kfp-gpu.io/heartbeat`` (unix
                    seconds) while they run, and the gang is released once neither a beat nor its creation is
                    within ``provisioning.lease_ttl_s``

``status`` (written by the controller only):
    conditions      PolicyAdmitted, Preflighted, WarmPoolHeld, Provisioned, Degraded, Released (type, status,
                    reason, message, lastTransitionTime, observedGeneration)
    phase           Pending | Preflighting | WarmPool | Provisioning | Ready | Training | Recovering | Releasing |
                    Released | Failed | Denied
    ready           "<ready>/<wanted>" nodes (printer column); backend; zone; gangNodes (names)
    outputs         {step: JSON}: each stage's result, read by the next stage (never passed through a step's argv)
    results         {step: {markdown, metrics}}: what the step prints and logs as KFP metrics
    jobs            {name: {state: Pending|Running|Succeeded|Failed, output, error}}
    error           the last stage error as :meth:`kfp_gpu.errors.KfpGpuError.to_dict` (the step re-raises it)
    timeline, cost  the node timeline (JSON) and the cost so far
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from kfp_gpu.ownership import LABEL_RUN_ID, label_safe

GROUP = "kfp-gpu.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "GpuGang"
PLURAL = "gpugangs"
POLICY_KIND = "GpuPolicy"
POLICY_PLURAL = "gpupolicies"

CONTROLLER_NAMESPACE = "kfp-gpu-system"
CONTROLLER_SA = "kfp-gpu-controller"
STEP_SA = "kfp-gpu"

# stages, in order; a step raises spec.stage to its own and waits for the condition of the same name
PREFLIGHTED = "Preflighted"
WARM_POOL_HELD = "WarmPoolHeld"
PROVISIONED = "Provisioned"
STAGES = (PREFLIGHTED, WARM_POOL_HELD, PROVISIONED)
STEP_OF_STAGE = {PREFLIGHTED: "preflight", WARM_POOL_HELD: "warm_pool", PROVISIONED: "scale_up"}
STAGE_OF_STEP = {v: k for k, v in STEP_OF_STAGE.items()}

POLICY_ADMITTED = "PolicyAdmitted"
DEGRADED = "Degraded"
RELEASED = "Released"
CONDITIONS = (POLICY_ADMITTED, *STAGES, DEGRADED, RELEASED)

JOB_PENDING, JOB_RUNNING, JOB_SUCCEEDED, JOB_FAILED = "Pending", "Running", "Succeeded", "Failed"
JOB_DONE = (JOB_SUCCEEDED, JOB_FAILED)


def gang_name(run_id: str) -> str:
    """The GpuGang of a run: a DNS-1123 name derived from the run id (a hash suffix keeps distinct ids apart)."""
    safe = "".join(c if c.isalnum() else "-" for c in run_id.lower()).strip("-")[:40].strip("-") or "run"
    return f"{safe}-{hashlib.sha256(run_id.encode()).hexdigest()[:8]}"


def stage_index(stage: str) -> int:
    """Position of ``stage`` in :data:`STAGES`; -1 for "" (nothing asked yet)."""
    return STAGES.index(stage) if stage in STAGES else -1


def condition(obj: dict[str, Any], ctype: str) -> dict[str, Any] | None:
    """The condition ``ctype`` of a GpuGang (or any object with status.conditions), or None."""
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == ctype:
            return dict(c)
    return None


def is_true(obj: dict[str, Any], ctype: str) -> bool:
    c = condition(obj, ctype)
    return bool(c and c.get("status") == "True")


def mirrors(provisioning: dict[str, Any]) -> dict[str, Any]:
    """The spec fields mirrored from a ProvisioningSpec's JSON (see the module docstring)."""
    target = provisioning.get("target") or {}
    return {
        "accelerator": provisioning.get("accelerator", ""),
        "nodes": int(provisioning.get("nodes", 0)),
        "gpusPerNode": int(provisioning.get("gpus_per_node", 8)),
        "capacityType": str(provisioning.get("capacity", "on-demand")),
        "zones": list(provisioning.get("zones") or []),
        "pools": list(target.get("pools") or []),
        "backend": str(target.get("provisioner", "auto")),
        "deadlineSeconds": float(provisioning.get("scale_up_deadline_s", 900.0)),
        "maxRunSeconds": float(provisioning.get("max_run_duration_s", 0.0)),
        "recoveryBudget": int((provisioning.get("recovery") or {}).get("max_preemptions", 3)),
        "warmPoolNodes": int((provisioning.get("warm_pool") or {}).get("nodes", 0)),
    }


def body(run_id: str, namespace: str, spec_json: str, owner: dict[str, str]) -> dict[str, Any]:
    """A new GpuGang for ``run_id`` from the (resolved) spec JSON, recording ``owner``."""
    provisioning = json.loads(spec_json)
    return {
        "apiVersion": API_VERSION, "kind": KIND,
        "metadata": {"name": gang_name(run_id), "namespace": namespace,
                     "labels": {LABEL_RUN_ID: label_safe(run_id)}},
        "spec": {"runId": run_id, "provisioning": provisioning, **mirrors(provisioning), "stage": "",
                 "jobs": {}, "release": False, "owner": dict(owner)},
    }
