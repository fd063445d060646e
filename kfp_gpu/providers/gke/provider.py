"""GkeProvider: the CapacityProvider for GKE, on the google-cloud-* REST clients.

google.cloud / google.auth are imported lazily (:mod:`kfp_gpu.providers.gke.clients`), so ``import kfp_gpu`` never needs
them. Every SDK call goes through :meth:`GkeProvider._call`, which turns exceptions into
classified :class:`~kfp_gpu.errors.KfpGpuError` via :mod:`kfp_gpu.providers.gke.classify`.
Client-side retries are disabled (``retry=None``); instead every call goes through the one retry loop,
:func:`kfp_gpu.retry.call`: transient errors (429/403 rate limits, 5xx, GKE's "operation in progress")
are retried with jittered back-off, never before the server's ``Retry-After``, within ``retry``
(a :class:`~kfp_gpu.retry.RetryPolicy`); what remains is raised classified. Reads retry, and so do the
mutations that are idempotent: setSize (an absolute size), deleteInstances of named instances (Compute
``requestId`` + ``skipInstancesOnValidationError``) and reservation insert/delete (``requestId``).
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from kfp_gpu import accelerators, fanout
from kfp_gpu import retry as retry_mod
from kfp_gpu.errors import InvalidSpec, KfpGpuError, NotFound
from kfp_gpu.ownership import Owner
from kfp_gpu.providers.base import (
    Operation,
    OpStatus,
    OwnedResource,
    PoolActivity,
    PoolRef,
    PoolState,
    QuotaAmount,
    ReservationRequest,
)
from kfp_gpu.providers.gke import activity, clients, flight, operations
from kfp_gpu.providers.gke import classify as cl
from kfp_gpu.providers.gke import pools as pools_mod
from kfp_gpu.providers.gke import preferences as prefs
from kfp_gpu.providers.gke import quota as quota_mod
from kfp_gpu.providers.gke import reservations as res_mod

log = logging.getLogger(__name__)
T = TypeVar("T")
FRESH_S = 2.0  # a pools() read this recent stands for the pool read a resize would make


class GkeProvider:
    """CapacityProvider for one GKE cluster.

    Args:
        project: GCP project id.
        location: the cluster's location (region for regional clusters, zone for zonal ones).
        cluster: GKE cluster name.
        endpoint: API base URL override (the kfp_gpu_rehearsal.sim stand-in, e.g. ``http://127.0.0.1:8787``);
            "" talks to the real Google APIs.
        credentials: google.auth credentials. None means Application Default Credentials, except
            for a plain ``http://`` endpoint (the local stand-in), which gets the stand-in token of
            ``$KFP_GPU_SIM_GCP_TOKEN`` (anonymous without it) so real tokens never travel unencrypted.
        timeout: per-call timeout, seconds.
        retry: bounds of the retry loop around every call (attempts, total seconds, back-off).
        contact_email: the address Cloud Quotas requires on an increase request (QuotaPreference
            ``contactEmail``); None reads ``$KFP_GPU_QUOTA_CONTACT_EMAIL``.
    """

    name = "gke"
    scheme = "gke"  # node labels (kfp_gpu.cluster.node_labels)

    def __init__(
        self,
        project: str,
        location: str,
        cluster: str,
        *,
        endpoint: str = "",
        credentials: Any = None,
        timeout: float = 30.0,
        retry: retry_mod.RetryPolicy | None = None,
        contact_email: str | None = None,
    ) -> None:
        self.project, self.location, self.cluster = project, location, cluster
        self.endpoint = endpoint.rstrip("/")
        self._credentials = credentials
        self.timeout = timeout
        self.retry = retry or retry_mod.RetryPolicy()
        self.contact_email = (os.environ.get(prefs.CONTACT_EMAIL_ENV, "") if contact_email is None
                              else contact_email).strip()
        self._igms: dict[tuple[str, str], str] = {}  # (pool, zone) -> instance group name
        self._clients: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._resizes: dict[tuple[str, str], tuple[int, Operation, Owner]] = {}
        # (pool, zone) -> (monotonic time, state) of the last pools() read, used once by resize()
        self._seen: dict[tuple[str, str], tuple[float, PoolState]] = {}

    @classmethod
    def from_target(cls, target: Any, *, endpoint: str | None = None, credentials: Any = None) -> GkeProvider:
        """A provider for a :class:`kfp_gpu.spec.Target` (gke or local kind)."""
        return cls(target.project, target.region, target.cluster,
                   endpoint=target.endpoint if endpoint is None else endpoint, credentials=credentials)

    # ---- plumbing -----------------------------------------------------------------------------
    @property
    def cluster_path(self) -> str:
        return f"projects/{self.project}/locations/{self.location}/clusters/{self.cluster}"

    def credentials(self) -> Any:
        """The credentials in use, resolving ADC on first use. Raises: PermissionDenied (none found)."""
        if self._credentials is None:
            self._credentials = clients.credentials_for(self.endpoint)
        return self._credentials

    def client(self, kind: str) -> Any:
        """A cached REST client (kinds: :data:`kfp_gpu.providers.gke.clients.KINDS`).

        Raises: PermissionDenied (no credentials).
        """
        with self._lock:
            if kind in self._clients:
                return self._clients[kind]
        c = clients.build(kind, self.endpoint, self.credentials())
        with self._lock:
            return self._clients.setdefault(kind, c)

    def _call(self, kind: str, method: str, *, at_zone: str = "", at_region: str = "", once: bool = False,
              **kwargs: Any) -> Any:
        """Call ``client(kind).method(**kwargs)`` through the retry loop (no client retry; ``once``: a single
        attempt, for callers that retry themselves); classify failures.

        Only reads and idempotent mutations come here (see the module docstring).

        Raises: KfpGpuError (classified), after the retry bound for transient ones.
        """
        fn: Callable[..., Any] = getattr(self.client(kind), method)

        def attempt() -> Any:
            try:
                return fn(retry=None, timeout=self.timeout, **kwargs)
            except KfpGpuError:
                raise
            except Exception as exc:  # noqa: BLE001 - everything leaving a provider is classified
                raise self.classify(exc, zone=at_zone, region=at_region) from exc

        return attempt() if once else retry_mod.call(attempt, policy=self.retry, what=f"{kind}.{method}")

    def shared_read(self, key: tuple[Any, ...], fn: Callable[[], T]) -> T:
        """``fn()`` (a read), shared with the identical read (``key``) already in flight for the same endpoint
        and credentials (:mod:`kfp_gpu.providers.gke.flight`).

        Raises: whatever ``fn`` raises.
        """
        result: T = flight.shared((self.endpoint, self.identity(), *key), fn)
        return result

    def identity(self) -> Any:
        """Who calls, for sharing reads: the credentials object; for the stand-in its token (one principal per token,
        shared across providers). Raises: PermissionDenied (no credentials)."""
        if self.endpoint.startswith("http://"):
            return getattr(self.credentials(), "token", None) or "anonymous"
        return id(self.credentials())

    def parallel(self, fns: Sequence[Callable[[], T]]) -> list[T | KfpGpuError]:
        """Run ``fns`` concurrently; a KfpGpuError is returned in place of its result."""
        def run(fn: Callable[[], T]) -> T | KfpGpuError:
            try:
                return fn()
            except KfpGpuError as exc:
                return exc
        # the shared pool (nested parallel() calls, quota -> pools, cannot deadlock: see kfp_gpu.fanout)
        return fanout.run_all([functools.partial(run, fn) for fn in fns])

    def classify(self, exc: BaseException, *, zone: str = "", region: str = "") -> Exception:
        """Map a raw SDK exception to a KfpGpuError via the tables in ``classify`` (a ``Retry-After``
        header becomes the error's ``retry_after_s`` field)."""
        return cl.classify_exception(exc, zone=zone, region=region, endpoint=self.endpoint)

    # ---- quota --------------------------------------------------------------------------------
    def quota(self, accelerator: str, region: str, *, spot: bool) -> list[QuotaAmount]:
        """GPU quota amounts for ``accelerator`` in ``region``; see the CapacityProvider contract.

        Raises: PermissionDenied (no credentials at all), NotFound (no such region), InvalidSpec
        (unknown accelerator).
        """
        return quota_mod.read(self, accelerators.get(accelerator), region, spot=spot)

    def request_quota_increase(self, metric: str, region: str, value: float, justification: str) -> str:
        """Ask Cloud Quotas for ``value``: the one QuotaPreference of (metric, region) is created or patched in
        place; returns its resource name. Idempotent; needs ``contact_email``.

        Raises: InvalidSpec (no contact_email, checked before any call; value below the current limit),
        PermissionDenied (needs cloudquotas.quotas.update), CloudError.
        """
        return quota_mod.request_increase(self, metric, region, value, justification)

    # ---- pools --------------------------------------------------------------------------------
    def pools(self, region: str, *, sizes: bool = True) -> list[PoolState]:
        """One PoolState per (GPU node pool, zone) of the cluster inside ``region``; ``sizes=False`` skips
        the instance-group reads (size -1).

        Raises: PermissionDenied, NotFound, RateLimited, TransientCloudError.
        """
        return self.gpu_pools(region, sizes=sizes)

    def gpu_pools(self, region: str, accelerator_types: Sequence[str] = (), *, sizes: bool = True) -> list[PoolState]:
        """Like :meth:`pools`, optionally only pools whose GKE accelerator type is listed.

        The sizes come from one instanceGroupManagers.aggregatedList read beside nodePools.list (one round trip,
        not a get per group after the list); a group the list does not show, or a refused list, falls back to
        instanceGroupManagers.get for that group.

        Raises: PermissionDenied, NotFound, RateLimited, TransientCloudError.
        """
        listed = fanout.spawn(lambda: pools_mod.igm_target_sizes(self)) if sizes else None
        resp = self.shared_read(("list_node_pools", self.cluster_path), functools.partial(
            self._call, "container", "list_node_pools", at_region=region, parent=self.cluster_path))
        rows: list[tuple[Any, str, str]] = []
        for np in resp.node_pools:
            if not np.config.accelerators:
                continue
            if accelerator_types and np.config.accelerators[0].accelerator_type not in accelerator_types:
                continue
            urls = {u.split("/zones/")[1].split("/")[0]: u for u in np.instance_group_urls if "/zones/" in u}
            for zone in list(np.locations) or list(urls):
                if zone.rsplit("-", 1)[0] == region:
                    rows.append((np, zone, urls.get(zone, "")))
        known: dict[tuple[str, str], int] = {}
        if listed is not None and rows:
            try:
                known = listed.result()
            except KfpGpuError as exc:  # e.g. no compute.instanceGroupManagers.list: a get per group instead
                log.info("instanceGroupManagers.aggregatedList refused (%s); reading each group", exc)

        def read(np: Any, zone: str, url: str) -> tuple[int, int | None]:  # both reads of a row, one round
            group = (zone, url.rsplit("/", 1)[-1]) if url else None
            size = -1 if not sizes else known[group] if group in known else self._target_size(np, url)
            return size, pools_mod.reservation_free(self, np, zone)

        got = self.parallel([functools.partial(read, np, zone, url) for np, zone, url in rows])
        out = []
        now = time.monotonic()
        for (np, zone, url), row in zip(rows, got, strict=True):
            if isinstance(row, KfpGpuError):
                raise row
            state = pools_mod.pool_state(np, zone, region, row[0], row[1])
            out.append(state)
            with self._lock:
                if url:
                    self._igms[(np.name, zone)] = url.rsplit("/", 1)[-1]
                if sizes and len(np.locations) <= 1:  # pool() refuses multi-zone pools: keep that check
                    self._seen[(np.name, zone)] = (now, state)
        return out

    def _target_size(self, np: Any, igm_url: str) -> int:
        if not igm_url:
            return int(np.initial_node_count)
        zone = igm_url.split("/zones/")[1].split("/")[0]
        igm = self._call("igm", "get", at_zone=zone, request={
            "project": self.project, "zone": zone, "instance_group_manager": igm_url.rsplit("/", 1)[-1]})
        return int(igm.target_size)

    def pool(self, ref: PoolRef) -> PoolState:
        """The state of one pool in one zone.

        Raises: NotFound (no such pool / zone), PermissionDenied, RateLimited, TransientCloudError.
        """
        region = ref.region or ref.zone.rsplit("-", 1)[0]
        np = self.node_pool(ref)
        zones = list(np.locations)
        if zones and ref.zone not in zones:
            raise NotFound(f"node pool {ref.pool} has no nodes in zone {ref.zone} (its zones: {zones})",
                           remediation="use a zone the pool spans, or add the zone to the pool", zone=ref.zone)
        if len(zones) > 1:
            raise InvalidSpec("pool", ref.pool, f"spans zones {zones}; kfp-gpu resizes single-zone pools",
                              remediation="create one GPU node pool per zone (GKE --node-locations=<zone>)")
        if not np.config.accelerators:
            raise InvalidSpec("pool", ref.pool, "has no GPUs (config.accelerators is empty)")
        url = next((u for u in np.instance_group_urls if f"/zones/{ref.zone}/" in u), "")
        return pools_mod.pool_state(np, ref.zone, region, self._target_size(np, url),
                                    pools_mod.reservation_free(self, np, ref.zone))

    def node_pool(self, ref: PoolRef) -> Any:
        """nodePools.get of ``ref.pool`` (container_v1.NodePool).

        Raises: NotFound naming the pool and listing the cluster's pools, PermissionDenied, RateLimited,
        TransientCloudError.
        """
        return pools_mod.node_pool(self, ref)

    def delete_nodes(self, ref: PoolRef, nodes: Sequence[str]) -> Operation:
        """Remove specific nodes (VMs) of ``ref``, shrinking the pool by that many (Compute
        instanceGroupManagers.deleteInstances, as cluster-autoscaler does). For rollbacks that must
        remove exactly the nodes a run added; idempotent (requestId, already-gone instances skipped).
        Not part of the CapacityProvider protocol.

        Raises: NotFound (listing the cluster's pools), PermissionDenied (compute.instanceGroupManagers.update),
        RateLimited, TransientCloudError, CloudError.
        """
        return pools_mod.delete_nodes(self, ref, nodes)

    def pool_activity(self, ref: PoolRef, since: float = 0.0) -> PoolActivity:
        """What the pool's managed instance group is doing: targetSize, running VMs (currentActions.none),
        VMs being created or recreated (a preempted spot VM is recreated by the group), and the errors of
        listErrors at or after ``since`` (unix seconds).

        Raises: NotFound (no such pool, listing the pools), PermissionDenied, RateLimited, TransientCloudError.
        """
        return activity.pool_activity(self, ref, since)

    def resize(self, ref: PoolRef, size: int, owner: Owner) -> Operation:
        """Set the node count of ``ref`` (nodePools.setSize); idempotent on the absolute size.

        A repeat of the last size this provider set returns the existing Operation; a pool already
        at ``size`` returns a DONE no-op Operation without calling setSize. An Operation that is
        born failed (e.g. a stockout GKE reports at once) is raised as its classified error.

        A pool that consumes only specific reservations is not grown beyond their free VMs (a
        provider-scoped CapacityUnavailable naming them, before any setSize).

        Raises: QuotaExceeded (region/provider), CapacityUnavailable (zone; provider for an exhausted
        reservation), InvalidSpec (size out of [0, max]), PermissionDenied, NotFound, RateLimited, TransientCloudError, CloudError.
        """
        key = (ref.pool, ref.zone)
        with self._lock:
            prev = self._resizes.get(key)
        same = prev is not None and prev[0] == size
        if prev is not None and same and not prev[1].done:
            return prev[1]  # still converging to this very size
        state = self._just_read(ref) or self.pool(ref)
        if not 0 <= size <= state.max_size:
            raise InvalidSpec(f"size[{ref.pool}/{ref.zone}]", size, f"must be in [0, {state.max_size}] (pool max)")
        pools_mod.check_reservation(state, size)
        if state.size == size and (prev is None or prev[1].done):
            if prev is not None and same and prev[1].status is OpStatus.DONE:
                return prev[1]
            op = Operation(f"noop:{ref.pool}:{ref.zone}:{size}", "resize", f"{ref.pool}/{ref.zone}", OpStatus.DONE)
        else:
            op = pools_mod.set_size(self, ref, size)
        with self._lock:
            self._resizes[key] = (size, op, owner)
        if op.status is OpStatus.FAILED and op.error is not None:
            raise op.error
        return op

    def _just_read(self, ref: PoolRef) -> PoolState | None:
        """The state a :meth:`pools` read returned for ``ref`` less than ``FRESH_S`` ago, once: the resize
        that follows a plan made from that read does not read the pool again (two round trips saved)."""
        with self._lock:
            seen = self._seen.pop((ref.pool, ref.zone), None)
        if seen is None or time.monotonic() - seen[0] > FRESH_S:
            return None
        return seen[1]

    def operation(self, op: Operation) -> Operation:
        """Poll ``op``; a FAILED result carries its classified error (checked from error,
        statusMessage and node pool conditions, not only status). A resize that finished DONE is
        checked against the instance group's listErrors since the operation started: a stockout there
        comes back as a DONE Operation whose ``error`` is a zone-scoped CapacityUnavailable saying how
        many instances run (partial success; the group keeps retrying the rest), a QUOTA_EXCEEDED instance
        error (GCE checks quota per VM creation, not at setSize) as a QuotaExceeded naming the metric.

        Raises: RateLimited, TransientCloudError, PermissionDenied.
        """
        return operations.poll(self, op)

    # ---- reservations -------------------------------------------------------------------------
    def reserve(self, req: ReservationRequest, owner: Owner) -> Operation:
        """Create (or re-attach to) the reservation ``req.name`` (derived from the owner when empty), with
        ``specificReservationRequired=false``: the VMs a resize then adds to a pool in that zone with a matching
        shape and reservation affinity ANY (GKE's default) consume it instead of paying for it twice. Owner
        labels travel in the description (Compute reservations have no labels).

        Raises: QuotaExceeded, CapacityUnavailable, PermissionDenied, CloudError.
        """
        return res_mod.reserve(self, req, owner)

    def release(self, owner_run_id: str) -> list[str]:
        """Delete every reservation owned by the run; returns the names deleted.

        Raises: PermissionDenied, TransientCloudError.
        """
        return res_mod.release(self, owner_run_id)

    def list_owned(self, run_id: str | None = None) -> list[OwnedResource]:
        """Reservations (from Compute) and pool resizes made by this process, for ``run_id``.

        Raises: PermissionDenied, TransientCloudError.
        """
        owned = res_mod.list_owned(self, run_id)
        with self._lock:
            for (pool, zone), (size, op, owner) in self._resizes.items():
                labels = owner.labels()
                if run_id is None or owner.run_id == run_id:
                    owned.append(OwnedResource("pool-resize", f"{pool}={size}", zone, {**labels, "op": op.id}))
        return owned
