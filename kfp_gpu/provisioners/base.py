"""The provisioner contract: how a run gets, keeps and gives back a gang of GPU nodes.

The steps (warm pool, scale-up, train's recovery, teardown) talk only to this contract; which backend serves
a run is chosen once (:func:`kfp_gpu.provisioners.select`) and recorded in the capacity it returns.

Contract (every backend honours it; tests/integration/test_provisioning.py, test_provreq_backend.py,
test_provreq_dws.py and test_kueue_backends.py check it on the node-pool, provisioning-request and
kueue-admission backends):

* **acquire(spec, run_id, request) -> Capacity.** Make ``request.nodes`` GPU nodes (or, for a recovery,
  ``request.keep``'s survivors + ``request.extra``) Ready with ``nvidia.com/gpu`` allocatable and *claimed*
  by the run (run-id label + the run's taint, :func:`kfp_gpu.cluster.nodes.claim`), all or nothing, before
  ``spec.scale_up_deadline_s``. Returns the placement as node names per (pool, zone) so no caller hard-codes a
  cloud's labels; ``Capacity.extra["provisioner"]`` names the backend. With ``request.wait=False`` it only
  submits (the warm pool) and returns an empty capacity.
* **Idempotent by (run_id, request.step).** A retried pod re-attaches: the ledger (node-pool) or a
  deterministic object name (provisioning-request) makes a second call converge on the first one's
  capacity instead of asking twice. Everything created carries the run's ownership labels.
* **Errors are classified** (:mod:`kfp_gpu.errors`): zone-scoped ``CapacityUnavailable`` moves to the next
  candidate zone inside acquire; when every candidate is blocked acquire raises ``CapacityUnavailable`` with
  the failover history; ``ProvisioningTimeout`` past the deadline (after rolling back what it added);
  ``QuotaExceeded``/``PermissionDenied``/``InvalidSpec``/``NotFound`` are permanent.
* **replace(spec, run_id, capacity, lost, ...) -> Capacity** (spot recovery): capacity for the lost nodes;
  returns the run's whole gang (survivors + replacements).
* **before_job(spec, run_id, capacity) -> Capacity**: called right before the job's pods are created. A
  backend whose platform holds the capacity only for a while (a ProvisioningRequest's 10-minute booking)
  checks it here and acquires again when it lapsed; others return ``capacity`` unchanged.
* **pod_annotations(capacity) -> dict**: what the job's pods must carry to consume the capacity.
* **revoked(spec, capacity) -> list[str]**: nodes of ``capacity`` the platform has taken back (a
  ProvisioningRequest's CapacityRevoked) while they may still be listed; the train step treats them as
  preempted. Node-pool capacity is never revoked this way (its losses show on the Nodes).
* **release(spec, run_id) -> Released**: give back everything the backend holds for the run (teardown and the
  janitor). Idempotent; a second call finds nothing. Never raises for objects already gone; errors are
  reported in ``Released.errors``.
* **holds_placeholders: bool** (attribute; False on :class:`NothingExtra`, read through
  :func:`holds_placeholders`): True when ``acquire(wait=False)`` itself places the pods that keep the warm pool's
  capacity (Karpenter launches nodes only for pending pods, so the karpenter backend's placeholders, which
  tolerate its NodePool's taint, *are* the warm pool). The warm-pool step then creates no generic balloons
  (:mod:`kfp_gpu.cluster.balloons`): they would not fit the backend's nodes and could make the platform launch
  other capacity for them.

Capabilities are attributes of the contract, read by the steps instead of comparing backend names (all False on
:class:`NothingExtra`; :func:`kfp_gpu.provisioners.capabilities` gives them for a backend's recorded name without
making one):

* **gang_forms_at_admission: bool**: the gang forms when a queue admits the job (Kueue with a
  ProvisioningRequest admission check): there are no nodes to gate on or pin the job to beforehand, and the nodes
  the job's pods land on become the gang (the train step waits for admission, then claims them).
* **supports_check_capacity: bool**: the backend's capacity comes from a cluster-autoscaler that serves
  ProvisioningRequests for the gang, so preflight may ask a ``check-capacity.autoscaling.x-k8s.io`` request
  directly (other backends ask it only when the cluster's autoscaler serves the matching pools).
* **capacity_via_autoscaler_groups: bool**: the gang's nodes come from the autoscaler's node groups, which need
  not be the cloud's pools (a self-managed autoscaler): preflight leaves a region's pool headroom to the autoscaler
  to judge when no cloud pool matches the target, instead of reporting "no pools".
* **launches_without_pools: bool**: the platform launches the gang's nodes without a pool that exists beforehand
  (Karpenter's NodeClaims for the run's NodePool; GKE's node auto-provisioning creating pools for the run's
  ComputeClass), so no node pool or group of the cloud bounds the gang: preflight judges the cloud's quota only,
  not pool headroom (an EKS cluster where Karpenter alone launches GPU nodes has no managed node group for them).
* **releases_one_node: bool**: ``replace`` gives the platform back a live node the run gives up
  (:func:`kfp_gpu.cluster.nodes.leaving`: swapped out for a stall or a straggler, or released for a bad GPU) before
  it asks for the replacement: the node-pool backend deletes the VM from its group (GKE ``deleteInstances``, EKS
  ``TerminateInstanceInAutoScalingGroup``), the karpenter backend deletes the node's NodeClaim (Karpenter drains and
  terminates the instance). False: the platform offers no call that frees one node of the run's capacity (a
  ProvisioningRequest's spec is immutable; a ComputeClass and Kueue's admission hand nodes to the cluster's
  autoscaler); the node stays cordoned out of the gang (tainted too for a bad GPU), the replacement is asked for
  beside it, and the autoscaler removes it once it is empty and unneeded; the run's ``release`` gives back the rest
  at teardown. The train step records which it was (ledger ``slot_released``).
* **all_or_nothing: bool** (attribute; False on :class:`NothingExtra`): True when the platform grants the whole gang
  at once or nothing (a ProvisioningRequest's atomic and queued-provisioning classes). A backend whose own way adds
  nodes as each can (a GKE ComputeClass's flexStart rule) hands a multi-node flex-start gang to such a backend.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from kfp_gpu.cluster.capacity import Capacity
from kfp_gpu.spec import ProvisioningSpec


@dataclass(frozen=True)
class GangRequest:
    """What one acquire asks for.

    Attributes:
        nodes: the gang size (0: ``spec.nodes``).
        step: the idempotency key's step part (``scale_up``, ``warm_pool``, ``recovery-N``).
        extra: recovery: this many nodes beyond ``keep``'s survivors.
        keep: recovery: the run's surviving nodes, node name -> (pool, zone).
        exclude: Node uids that must not count (lost nodes still listed while they drain).
        allow_spread: spread over zones (None: ``spec.allow_zone_spread``).
        wait: False submits and returns at once (warm pool).
        lease_ttl_s: ownership lease of what is created (None: ``spec.lease_ttl_s``).
        on_zone_blocked: called with a zone the acquire gives up.
    """

    nodes: int = 0
    step: str = "scale_up"
    extra: int | None = None
    keep: Mapping[str, tuple[str, str]] | None = None
    exclude: Sequence[str] = ()
    allow_spread: bool | None = None
    wait: bool = True
    lease_ttl_s: float | None = None
    on_zone_blocked: Callable[[str], None] | None = None


@dataclass
class Released:
    """What a release gave back (teardown's report merges these)."""

    objects: list[str] = field(default_factory=list)  # e.g. "provisioningrequest ns/name"
    pools_restored: dict[str, int] = field(default_factory=dict)  # "pool|zone" -> size
    nodes_deleted: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


class Provisioner(Protocol):
    """See the module docstring for the semantics of each method."""

    name: str
    holds_placeholders: bool
    gang_forms_at_admission: bool
    supports_check_capacity: bool
    capacity_via_autoscaler_groups: bool
    launches_without_pools: bool
    all_or_nothing: bool
    releases_one_node: bool

    def acquire(self, spec: ProvisioningSpec, run_id: str, request: GangRequest) -> Capacity: ...

    def replace(self, spec: ProvisioningSpec, run_id: str, capacity: Capacity, lost: Sequence[str], *,
                extra: int, zone_hint: str, on_demand: bool, attempt: int, lost_uids: Sequence[str]) -> Capacity: ...

    def before_job(self, spec: ProvisioningSpec, run_id: str, capacity: Capacity) -> Capacity: ...

    def pod_annotations(self, capacity: Capacity) -> dict[str, str]: ...

    def revoked(self, spec: ProvisioningSpec, capacity: Capacity) -> list[str]: ...

    def release(self, spec: ProvisioningSpec, run_id: str) -> Released: ...


class NothingExtra:
    """Defaults for a backend whose platform needs nothing before the job, on the pods or about revocations:
    capacity unchanged, no annotations, nothing revoked (node losses show on the Nodes), and the warm pool's
    balloons are the generic ones (``holds_placeholders = False``)."""

    holds_placeholders: bool = False
    gang_forms_at_admission: bool = False
    supports_check_capacity: bool = False
    capacity_via_autoscaler_groups: bool = False
    launches_without_pools: bool = False
    all_or_nothing: bool = False
    releases_one_node: bool = False

    def before_job(self, spec: ProvisioningSpec, run_id: str, capacity: Capacity) -> Capacity:
        return capacity

    def pod_annotations(self, capacity: Capacity) -> dict[str, str]:
        return {}

    def revoked(self, spec: ProvisioningSpec, capacity: Capacity) -> list[str]:
        return []


def holds_placeholders(backend: Provisioner) -> bool:
    """Whether ``backend``'s own warm-pool placeholders hold the warm pool (see the module docstring). Raises:
    nothing."""
    return bool(backend.holds_placeholders)
