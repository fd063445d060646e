"""Where a run's capacity comes from: :class:`Target` (cluster, region, pools, namespace, provisioner backend,
tolerations, Kueue queue, ComputeClass) and :class:`TargetKind`.

Contract: a Target is immutable and validated in ``__post_init__``: every bad field is one
:class:`~kfp_gpu.errors.InvalidSpec` naming ``target.<field>``, the value, what is allowed and the fix; sequences
are stored as tuples so it round-trips through JSON. Kept apart so spec.py stays small; import it from
:mod:`kfp_gpu.spec`, whose ProvisioningSpec carries it as ``target``.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

from kfp_gpu.errors import InvalidSpec
from kfp_gpu.spec_sections import as_names, coerce_enum

__all__ = ["AUTOSCALED_POOLS", "PROVISIONERS", "Target", "TargetKind"]

_NAME_RE = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
_QUEUE_RE = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")  # object name that is also a label value
_GCP_REGION_RE = re.compile(r"^[a-z]+-[a-z]+\d+$")
_AWS_REGION_RE = re.compile(r"^[a-z]{2}-[a-z]+-\d+$")
AUTOSCALED_POOLS = ("protect", "refuse")  # Target.autoscaled_pools
PROVISIONERS = ("auto", "node-pool", "provisioning-request", "kueue-admission", "karpenter",
                "compute-class")  # Target.provisioner
_CLASS_RE = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,61}[a-z0-9])?$")  # a ComputeClass name is also a label value
_TOLERATION_RE = re.compile(r"^[A-Za-z0-9][-A-Za-z0-9_./]{0,252}(=[-A-Za-z0-9_.]{0,63})?"
                            r"(:(NoSchedule|PreferNoSchedule|NoExecute))?$")


class TargetKind(str, enum.Enum):
    GKE = "gke"
    EKS = "eks"
    LOCAL = "local"  # the kfp_gpu_rehearsal.sim GKE stand-in backed by KWOK nodes


@dataclass(frozen=True)
class Target:
    """Where capacity comes from.

    ``pools`` are GKE node pool names or EKS managed node group names, in priority order. For
    ``local`` the target is the GKE stand-in (``endpoint``) driving the local control plane.

    ``autoscaled_pools`` says what scale-up does with a pool the cluster autoscaler manages: ``"protect"``
    resizes it and annotates every node the run claims
    ``cluster-autoscaler.kubernetes.io/scale-down-disabled: "true"`` until release; ``"refuse"`` fails
    before any resize of such a pool.

    ``provisioner`` picks how capacity is obtained (the provisioner contract, kfp_gpu.provisioners):
    ``"node-pool"`` resizes the pools directly (dedicated pools); ``"provisioning-request"`` asks the cluster's
    own autoscaler with a ProvisioningRequest (autoscaling.x-k8s.io/v1) for the whole gang; ``"kueue-admission"``
    lets Kueue's ProvisioningRequest AdmissionCheck provision the gang when it admits the job; ``"karpenter"``
    creates a NodePool scoped to the run and lets Karpenter (karpenter.sh/v1) launch the gang; ``"compute-class"``
    (GKE) has the controller create a custom ComputeClass (cloud.google.com/v1) from the capacity chain
    (``capacity`` then ``fallback``) and lets GKE's node auto-provisioning bring the gang (docs/computeclass.md);
    ``"auto"`` (the
    default) detects what the cluster offers at preflight, and the report says which and why.

    ``tolerations`` are taints of the target's GPU pools that the run's pods must tolerate (a dedicated
    training pool's ``key=value:NoSchedule``), as ``"key[=value][:Effect]"`` strings; ``nvidia.com/gpu`` is
    always tolerated.

    ``queue`` is the Kueue LocalQueue the job is submitted to (its ``kueue.x-k8s.io/queue-name`` label); ``""``
    (the default) auto-detects: the namespace's only LocalQueue, or the one named ``default``; none = not gated.
    """

    kind: TargetKind = TargetKind.LOCAL
    cluster: str = "kfp-gpu-local"
    project: str = "local-project"  # GCP project; ignored for EKS
    region: str = "us-central1"
    pools: tuple[str, ...] = ()
    endpoint: str = ""  # API endpoint override (stand-in URL); empty means the real cloud
    kube_context: str = ""  # kubeconfig context; empty means in-cluster or current context
    namespace: str = "default"
    autoscaled_pools: str = "protect"  # "protect" | "refuse" (see the class docstring)
    provisioner: str = "auto"  # "auto" | "node-pool" | "provisioning-request" | "kueue-admission" | "karpenter"
    tolerations: tuple[str, ...] = ()  # "key[=value][:Effect]" taints of the GPU pools to tolerate
    queue: str = ""  # the Kueue LocalQueue the job is submitted to; "" = auto-detect (see the class docstring)
    compute_class: str = ""  # compute-class backend: use this existing ComputeClass; "" = create one for the run

    @property
    def rehearsal(self) -> bool:
        """True for a local rehearsal: the ``local`` kind, or a GKE/EKS target whose ``endpoint`` is a stand-in on
        this machine (``http://127.0.0.1``, ``localhost``, ``[::1]``). Such a target runs on the kfp-gpu dev
        cluster, and its KWOK job pods get a default simulated duration."""
        if self.kind is TargetKind.LOCAL:
            return True
        if not self.endpoint:
            return False
        from urllib.parse import urlsplit

        try:
            host = urlsplit(self.endpoint).hostname
        except ValueError:
            return False
        return host in ("127.0.0.1", "localhost", "::1")

    def __post_init__(self) -> None:
        coerce_enum(self, "kind", TargetKind, "target.kind")
        if self.provisioner not in PROVISIONERS:
            raise InvalidSpec("target.provisioner", self.provisioner,
                              f"allowed: {', '.join(repr(v) for v in PROVISIONERS)}",
                              remediation="use 'auto' to detect, 'node-pool' for dedicated pools, or "
                              "'provisioning-request' where the cluster autoscaler serves ProvisioningRequests")
        object.__setattr__(self, "tolerations", as_names("target.tolerations", self.tolerations))
        for t in self.tolerations:
            if not _TOLERATION_RE.match(t):
                raise InvalidSpec("target.tolerations", t, "must look like 'key=value:NoSchedule', 'key:NoSchedule' "
                                  "or 'key' (effect NoSchedule, PreferNoSchedule or NoExecute)")
        if self.autoscaled_pools not in AUTOSCALED_POOLS:
            raise InvalidSpec("target.autoscaled_pools", self.autoscaled_pools,
                              f"allowed: {', '.join(repr(v) for v in AUTOSCALED_POOLS)}",
                              remediation="set target.autoscaled_pools='protect' (annotate the nodes the run "
                              "holds) or 'refuse' (never resize an autoscaled pool)")
        object.__setattr__(self, "pools", as_names("target.pools", self.pools))
        if not self.cluster:
            raise InvalidSpec("target.cluster", self.cluster, "must be the cluster name")
        region_re = _AWS_REGION_RE if self.kind is TargetKind.EKS else _GCP_REGION_RE
        if not region_re.match(self.region):
            example = "us-east-1" if self.kind is TargetKind.EKS else "us-central1"
            raise InvalidSpec("target.region", self.region, f"must look like {example!r} for {self.kind.value}")
        for p in self.pools:
            if not _NAME_RE.match(p):
                raise InvalidSpec("target.pools", p, "pool names are lowercase RFC 1035 labels")
        if not _NAME_RE.match(self.namespace):
            raise InvalidSpec("target.namespace", self.namespace, "must be a Kubernetes namespace name")
        if self.queue and not (len(self.queue) <= 63 and _QUEUE_RE.match(self.queue)):
            raise InvalidSpec("target.queue", self.queue, "must be a Kueue LocalQueue name (lowercase letters, digits, "
                              "'-' and '.', at most 63 characters, starting and ending alphanumeric)",
                              remediation="set target.queue to the LocalQueue's metadata.name, or '' to auto-detect")
        if self.compute_class and not _CLASS_RE.match(self.compute_class):
            raise InvalidSpec("target.compute_class", self.compute_class, "must be a ComputeClass name (lowercase "
                              "letters, digits, '-' and '.', at most 63 characters)",
                              remediation="set target.compute_class to the ComputeClass's metadata.name, or '' to "
                              "let the controller create one for the run")
        if self.compute_class and self.provisioner not in ("auto", "compute-class"):
            raise InvalidSpec("target.compute_class", self.compute_class, f"only the compute-class backend selects "
                              f"a ComputeClass, not target.provisioner={self.provisioner!r}",
                              remediation="set target.provisioner='compute-class' (or 'auto'), or drop "
                              "target.compute_class")
