"""Ownership: the one module of the label, taint, annotation and finalizer keys kfp-gpu writes.

Every object kfp-gpu creates carries the owner labels (:meth:`Owner.labels`: run id, step, lease expiry,
managed), so teardown, the janitor and ``list_owned`` find it by label only. The keys below are the whole
vocabulary; ``cluster/``, ``provisioners/``, ``steps/``, ``gang/`` and the providers import them from here (no
layer imports another for a key). No I/O, no imports beyond the standard library.

Keys of the local rehearsal (the simulator's node labels, KWOK stage annotations) are not here: the core reaches
the rehearsal only through :mod:`kfp_gpu.rehearsal_seam`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

DOMAIN = "kfp-gpu.io"

# --- the owner labels (every object; GCE labels use the `_`-mapped keys of Owner.cloud_labels) ---
LABEL_RUN_ID = "kfp-gpu.io/run-id"
LABEL_STEP = "kfp-gpu.io/step"
LABEL_LEASE = "kfp-gpu.io/lease-expires"  # unix seconds, as a string (label-value safe)
LABEL_MANAGED = "kfp-gpu.io/managed"
RUN_ID_RAW_ANNOTATION = "kfp-gpu.io/run-id-raw"  # the run id verbatim (the label is label_safe'd)

# --- what marks an object as one of ours, by kind ---
LEDGER_LABEL = "kfp-gpu.io/ledger"  # ledger ConfigMaps
LEDGER_GANG_NAMESPACE_LABEL = "kfp-gpu.io/gang-namespace"  # on a ledger: its gang's namespace (cluster/ledger.py)
BALLOON_LABEL = "kfp-gpu.io/balloon"  # warm-pool balloon pods
JOB_LABEL = "kfp-gpu.io/job"  # every pod of a job: the job's name
ATTEMPT = "kfp-gpu.io/attempt"  # TrainJob annotation / pod label: which attempt a pod belongs to
PLACEHOLDER_SET = "kfp-gpu.io/placeholder-set"  # Karpenter placeholder pods of one gang
COMPONENT_LABEL = "kfp-gpu.io/component"  # on a pipeline step's pod
RUN_LEASE_LABEL = "kfp-gpu.io/run-lease"  # ownership Leases of older versions (teardown deletes them)
LEASE_NAMESPACE_ANNOTATION = "kfp-gpu.io/lease-namespace"  # on claimed Nodes: "<namespace>/<run label>"
RELEASED_AT_ANNOTATION = "kfp-gpu.io/released-at"
RESUME_STEP_ANNOTATION = "kfp-gpu.io/resume-step"

# --- claims: taints and the scale-down protection a claim sets ---
CLAIM_TAINT_SUFFIX = ".claims.kfp-gpu.io/run"  # the claim taint key is <namespace> + this
LEGACY_RUN_TAINT_KEY = "kfp-gpu.io/run"  # the claim taint key of older versions: still released by unclaim
# a healthy node the run swaps out (first to stop in two stalls, a straggler): cordoned, its slot released by the
# replacement (kfp_gpu/provisioners/node_pool.py)
SWAP_OUT_ANNOTATION = "kfp-gpu.io/swap-out"
POOL_TAINT_SUFFIX = ".nodepools.kfp-gpu.io/run"  # <namespace> + this: a run's Karpenter NodePool taints its nodes
PROTECTED_BY = "kfp-gpu.io/scale-down-disabled-by"  # the run whose claim set scale-down-disabled

# --- the GpuGang API and tenancy ---
TENANT_LABEL = "kfp-gpu.io/tenant"  # on a namespace: "true" once `kfp-gpu tenant add` ran
TENANT_NAMESPACE_LABEL = "kfp-gpu.io/tenant-namespace"  # on a tenant's GpuPolicy: the namespace it was made for
HEARTBEAT_ANNOTATION = "kfp-gpu.io/heartbeat"  # unix seconds: an owner the controller cannot observe beats here
RELEASE_FINALIZER = "kfp-gpu.io/release"  # the GpuGang's finalizer: release runs before the object goes


@dataclass(frozen=True)
class Owner:
    """Who owns a mutation: the idempotency key of every provider call."""

    run_id: str
    step: str
    lease_expires: float  # unix seconds

    @classmethod
    def for_step(cls, run_id: str, step: str, ttl_s: float, now: float | None = None) -> Owner:
        return cls(run_id, step, (time.time() if now is None else now) + ttl_s)

    def labels(self) -> dict[str, str]:
        """Kubernetes/GCP/AWS-safe ownership labels."""
        return {
            LABEL_MANAGED: "true",
            LABEL_RUN_ID: label_safe(self.run_id),
            LABEL_STEP: label_safe(self.step),
            LABEL_LEASE: str(int(self.lease_expires)),
        }

    def cloud_labels(self) -> dict[str, str]:
        """GCE/GKE resource labels (keys must be [a-z0-9_-], no dots or slashes)."""
        return {k.split("/", 1)[1].replace(".", "_").replace("-", "_"): v for k, v in self.labels().items()}


def label_safe(value: str) -> str:
    """Map any run id to a valid label value (<= 63 chars, [a-z0-9-_.], alnum at both ends)."""
    out = "".join(c if c.isalnum() or c in "-_." else "-" for c in value.lower())[:63]
    return out.strip("-_.") or "x"

# the GPU health gate (kfp_gpu/cluster/probe.py, kfp_gpu/steps/health_gate.py, docs/health.md)
PROBE_LABEL = "kfp-gpu.io/gpu-probe"  # value: the run (label-safe); marks a probe pod for the world too
PROBE_ROUND_LABEL = "kfp-gpu.io/gpu-probe-round"
PROBED_NODE_ANNOTATION = "kfp-gpu.io/probed-node"
UNHEALTHY_TAINT = "kfp-gpu.io/gpu-unhealthy"  # a node kfp-gpu released for a bad GPU (cordoned, unclaimed)
UNHEALTHY_ANNOTATION = "kfp-gpu.io/gpu-unhealthy-reason"
