"""The CapacityProvider contract: the only door between kfp-gpu and a cloud.

Contract (every implementation must honour it; tests in tests/providers check it):

* **Asynchronous, eventually consistent.** Mutations (``resize``, ``reserve``, ``release``) *submit*
  and return an :class:`Operation` at once; they never wait for machines to boot. Callers observe
  progress with ``operation()`` (cloud side) and a Kubernetes Node watch (cluster side). A read right
  after a write may not show it yet.
* **Idempotent by (run_id, step).** Repeating a mutation with the same ``Owner`` converges to the same
  state instead of doing it twice: a resize is expressed as an absolute target size computed from the
  ledger, a reservation is named from the owner, a release of something already gone is a no-op. A
  retried pod therefore re-attaches instead of double-provisioning.
* **Classified errors.** Every exception leaving a provider is a :class:`~kfp_gpu.errors.KfpGpuError`
  whose ``scope`` (zone, region, provider, or none for transient) says what it blocks, mapped by the
  provider's error -> scope table. An unrecognised cloud error becomes ``CloudError`` scoped to the
  narrowest placement and carries the verbatim cloud message.
* **Amounts, not booleans.** Quota answers are :class:`QuotaAmount` rows (limit, usage, free). A quota
  that cannot be read is returned with ``status="unknown"`` and the reason; it never counts as "ok".
* **Autoscaling is reported, never fought.** ``PoolState.autoscaling`` is True when the cluster autoscaler
  manages the pool (GKE ``nodePools.get`` ``autoscaling.enabled``; EKS: the node group's Auto Scaling group
  carries the ``k8s.io/cluster-autoscaler/enabled`` tag, best effort), with its node limits in
  ``autoscaling_min``/``autoscaling_max`` (0 when unknown or off). A caller that resizes such a pool must
  either protect the nodes it adds from scale-down or refuse (``Target.autoscaled_pools``).
* **Reservations are consumed, never duplicated.** ``PoolState.reservation_affinity`` says which
  reservations the pool's new VMs consume: "any" (matching automatic reservations first; the cloud default
  when unset, "" = not set), "specific" (only ``reservations``, by name (GKE) or id (EC2); no capacity
  beyond them) or "none". ``reservation_free`` is what those specific reservations still hold (count -
  in use), None when unknown. A reservation ``reserve`` creates is automatic (GCE
  ``specificReservationRequired=false``), so the VMs a resize then adds in that zone consume it.
* **Placement is reported.** ``PoolState.placement`` says whether the pool's new nodes share one network domain:
  "compact" (held there: an EKS node group whose launch template names a placement group of strategy ``cluster``),
  "best-effort" (the cloud puts them close when it can and elsewhere when it cannot: GKE ``COMPACT``, whose max
  distance, the only thing that would hold them, Compute v1 does not expose), "spread" (the cloud
  documents that it spreads them: an EC2 launch without a cluster placement group) or "" (not known: GKE without a
  compact policy). Only "compact" is a guarantee. ``placement_group`` names the group or policy.
* **Owned and labelled.** Everything a provider creates carries the owner labels (run id, step,
  lease expiry) so ``list_owned`` / teardown / the janitor can always find it.

SDK imports (google.cloud, boto3) happen lazily inside ``kfp_gpu/providers/<cloud>/``, never here.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from kfp_gpu.ownership import Owner


@dataclass(frozen=True)
class QuotaAmount:
    """One quota, as an amount. ``free`` is None when the quota could not be read."""

    metric: str
    location: str  # region, zone, or "global"
    limit: float | None
    usage: float | None
    unit: str = "gpus"  # "gpus" or "vcpus"
    status: str = "ok"  # "ok" | "unknown"
    reason: str = ""
    raise_path: str = ""  # console/API path to request more
    lead_time_days: float = 2.0  # typical approval lead time

    @property
    def free(self) -> float | None:
        if self.status != "ok" or self.limit is None or self.usage is None:
            return None
        return max(0.0, self.limit - self.usage)


@dataclass(frozen=True)
class PoolRef:
    """A scalable unit: a GKE node pool in one zone, or an EKS managed node group."""

    pool: str
    zone: str
    region: str = ""


@dataclass(frozen=True)
class PoolState:
    """One pool in one zone. ``autoscaling``: the cluster autoscaler manages it (see the contract)."""

    ref: PoolRef
    size: int  # target size the cloud is converging to
    max_size: int
    accelerator: str  # catalog name
    gpus_per_node: int
    machine_type: str
    spot: bool
    labels: dict[str, str] = field(default_factory=dict)
    autoscaling: bool = False  # the cluster autoscaler may add and remove this pool's nodes
    autoscaling_min: int = 0  # its node limits (per zone, or the pool's total); 0 when off or unknown
    autoscaling_max: int = 0
    reservation_affinity: str = ""  # "any" | "specific" | "none"; "" = not set (the cloud's default: any)
    reservations: tuple[str, ...] = ()  # the reservations a "specific" affinity names
    reservation_free: int | None = None  # VMs those reservations still hold free; None = unknown
    queued_provisioning: bool = False  # GKE queuedProvisioning.enabled: nodes come only through ProvisioningRequests
    placement: str = ""  # where new nodes land (the contract's placement paragraph): "compact" | "best-effort" |
    # "spread" | "" unknown
    placement_group: str = ""  # what keeps them close: the EC2 placement group's name, GKE's "COMPACT" policy


class OpStatus(str, enum.Enum):
    PENDING = "PENDING"
    RUNNING = "RUNNING"
    DONE = "DONE"
    FAILED = "FAILED"


@dataclass(frozen=True)
class Operation:
    """A submitted cloud mutation. ``error`` is set (and classified) when ``status`` is FAILED, and on a
    DONE resize that only half-succeeded: a stockout while the group created the VMs is a zone-scoped
    ``CapacityUnavailable`` whose fields say how many instances run (``running``) of the target."""

    id: str
    kind: str  # "resize" | "reserve" | "release" | "quota-request"
    target: str
    status: OpStatus
    error: Exception | None = None

    @property
    def done(self) -> bool:
        return self.status in (OpStatus.DONE, OpStatus.FAILED)


@dataclass(frozen=True)
class PoolError:
    """One error the pool's instance group hit while creating or recreating a VM (newest last)."""

    code: str  # e.g. ZONE_RESOURCE_POOL_EXHAUSTED, InsufficientInstanceCapacity
    message: str
    instance: str = ""
    action: str = ""  # CREATING | RECREATING (GCE); the scaling activity's cause (AWS)
    at: float = 0.0  # unix seconds

    @property
    def stockout(self) -> bool:
        return self.code.startswith("ZONE_RESOURCE_POOL_EXHAUSTED") or self.code in (
            "InsufficientInstanceCapacity", "GCE_STOCKOUT")

    @property
    def quota(self) -> bool:
        """A quota refused the VM (GCE ``QUOTA_EXCEEDED`` instance error; EC2 vCPU limits)."""
        return self.code in ("QUOTA_EXCEEDED", "VcpuLimitExceeded", "MaxSpotInstanceCountExceeded")


@dataclass(frozen=True)
class PoolActivity:
    """What a pool's instance group is doing: ``target`` VMs wanted, ``running`` up, ``creating`` being
    created or recreated (a preempted spot VM is recreated by the group itself), and recent errors."""

    ref: PoolRef
    target: int
    running: int
    creating: int
    errors: tuple[PoolError, ...] = ()

    @property
    def busy(self) -> bool:
        """The group still works towards ``target`` on its own: do not add capacity for it."""
        return self.creating > 0


@dataclass(frozen=True)
class ReservationRequest:
    name: str
    zone: str
    accelerator: str
    gpus_per_node: int
    count: int
    machine_type: str = ""  # the consuming pool's (PoolState.machine_type); "" = the catalog's machine


@dataclass(frozen=True)
class OwnedResource:
    kind: str  # "reservation" | "pool-resize" | "capacity-reservation"...
    name: str
    location: str
    labels: dict[str, str]


@runtime_checkable
class CapacityProvider(Protocol):
    """See the module docstring for the contract. Every method documents what it raises."""

    name: str
    scheme: str  # how its nodes are labelled: a kfp_gpu.cluster.node_labels scheme name ("gke", "eks")

    def quota(self, accelerator: str, region: str, *, spot: bool) -> list[QuotaAmount]:
        """GPU quota amounts relevant to ``accelerator`` in ``region`` (regional, family and global).

        Never raises for a quota it cannot read: it returns that row with status "unknown".
        Raises: PermissionDenied (no credentials at all), NotFound (no such region).
        """
        ...

    def pools(self, region: str, *, sizes: bool = True) -> list[PoolState]:
        """Scalable units of the target cluster in ``region``.

        ``sizes=False`` lets a provider skip per-pool size reads (one round trip instead of two, for
        preflight); such pools report ``size=-1`` (unknown) and callers count the pool's nodes instead.

        Raises: PermissionDenied, NotFound, RateLimited, TransientCloudError.
        """
        ...

    def resize(self, ref: PoolRef, size: int, owner: Owner) -> Operation:
        """Set the absolute size of one pool in one zone. Idempotent: same size twice is one change.

        Raises: QuotaExceeded (region), CapacityUnavailable (zone), InvalidSpec (size > max),
        PermissionDenied, NotFound, RateLimited, TransientCloudError, CloudError.
        """
        ...

    def operation(self, op: Operation) -> Operation:
        """The current state of ``op``; a FAILED op carries its classified error.

        Raises: RateLimited, TransientCloudError.
        """
        ...

    def pool_activity(self, ref: PoolRef, since: float = 0.0) -> PoolActivity:
        """What the pool's instance group is doing now: target, running, creating/recreating VMs, and the
        creation errors (stockouts...) it hit at or after ``since`` (unix seconds; 0 = all it reports).
        Recovery reads it to avoid adding capacity the group is already recreating.

        Raises: NotFound (no such pool), PermissionDenied, RateLimited, TransientCloudError.
        """
        ...

    def reserve(self, req: ReservationRequest, owner: Owner) -> Operation:
        """Create (or re-attach to) the reservation named ``req.name``: ``req.count`` VMs of the request's
        shape in ``req.zone``, consumed automatically by matching VMs of pools whose affinity is "any".

        Raises: QuotaExceeded, CapacityUnavailable, PermissionDenied, CloudError.
        """
        ...

    def release(self, owner_run_id: str) -> list[str]:
        """Delete every reservation owned by the run. Returns the names deleted; missing ones are no-ops.

        Raises: PermissionDenied, TransientCloudError.
        """
        ...

    def list_owned(self, run_id: str | None = None) -> list[OwnedResource]:
        """Everything this provider created for ``run_id`` (or for any run when None).

        Raises: PermissionDenied, TransientCloudError.
        """
        ...

    def request_quota_increase(self, metric: str, region: str, value: float, justification: str) -> str:
        """File a quota increase request. Returns the request id.

        Raises: PermissionDenied, InvalidSpec (value below current limit), CloudError.
        """
        ...

    def classify(self, exc: BaseException, *, zone: str = "", region: str = "") -> Exception:
        """Map a raw SDK exception to a KfpGpuError using this provider's error -> scope table."""
        ...
