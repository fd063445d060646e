"""The fake cloud's observable state and test controls, under :class:`~kfp_gpu.providers.fake.FakeProvider`.

Contract: :class:`FakeState` holds everything a test reads or sets - pools (``pool_states``), the quota table
(``quota_rows``), stockout zones, operations and their poll counts, reservations, and the log of state-changing
calls (``calls``, :class:`FakeCall`) - behind one re-entrant lock, so worker threads may call it. Its set-up
helpers (:meth:`FakeState.add_pool`, :meth:`FakeState.set_quota`, :meth:`FakeState.fail`) never count as calls;
every provider method starts at :meth:`FakeState._enter`, which runs ``on_call`` and raises the injected error,
classified like a provider would. The CapacityProvider behaviour over this state is :mod:`kfp_gpu.providers.fake`.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from kfp_gpu import accelerators
from kfp_gpu.errors import CloudError, KfpGpuError, NotFound, Scope
from kfp_gpu.providers.base import (
    Operation,
    OpStatus,
    OwnedResource,
    PoolRef,
    PoolState,
    QuotaAmount,
    ReservationRequest,
)

__all__ = ["FakeCall", "FakeReservation", "FakeState", "region_of"]


@dataclass(frozen=True)
class FakeCall:
    """One state-changing mutation, as recorded in ``FakeProvider.calls``."""

    method: str  # "resize" | "reserve" | "release" | "request_quota_increase"
    target: str  # "pool@zone", reservation name, metric@region...
    args: dict[str, Any] = field(default_factory=dict)
    run_id: str = ""


@dataclass
class FakeReservation:
    request: ReservationRequest
    labels: dict[str, str]
    op_id: str


@dataclass
class _Injected:
    exc: BaseException
    times: int
    zone: str
    region: str


def region_of(zone: str) -> str:
    """``us-central1-a`` -> ``us-central1``; ``us-east-1a`` -> ``us-east-1``."""
    if zone and zone[-1].isalpha() and zone[-2:-1].isdigit():
        return zone[:-1]  # AWS style
    return zone.rsplit("-", 1)[0] if "-" in zone else zone


class FakeState:
    """The fake's state and test controls (see the module docstring); :class:`~kfp_gpu.providers.fake.FakeProvider`
    adds the CapacityProvider methods."""

    def __init__(
        self,
        pools: Iterable[PoolState] = (),
        quotas: Iterable[QuotaAmount] = (),
        *,
        stockout_zones: Iterable[str] = (),
        stockout_async: bool = False,
        regions: Iterable[str] | None = None,
        op_polls: int = 1,
        on_call: Callable[[str], None] | None = None,
    ) -> None:
        self.pool_states: dict[PoolRef, PoolState] = {p.ref: p for p in pools}
        self.quota_rows: list[QuotaAmount] = list(quotas)
        self.stockout_zones: set[str] = set(stockout_zones)
        self.stockout_async = stockout_async
        self.regions: set[str] | None = set(regions) if regions is not None else None
        self.op_polls = op_polls
        self.on_call = on_call
        self.operations: dict[str, Operation] = {}
        self.reservations: dict[str, FakeReservation] = {}
        self.calls: list[FakeCall] = []
        self.quota_requests: dict[str, FakeCall] = {}
        self.owned_resizes: dict[tuple[str, PoolRef], OwnedResource] = {}
        self._polls: dict[str, int] = {}
        self._pending_error: dict[str, Exception] = {}
        self._resize_ops: dict[tuple[str, str, PoolRef, int], str] = {}
        self._resize_from: dict[str, tuple[PoolRef, int]] = {}  # op id -> (pool, size before)
        self._injected: dict[str, list[_Injected]] = {}
        self._ids = itertools.count(1)
        self._lock = threading.RLock()

    # ---- test set-up helpers ---------------------------------------------------------------
    def add_pool(
        self,
        pool: str,
        zone: str,
        *,
        size: int = 0,
        max_size: int = 16,
        accelerator: str = "a100-80gb",
        gpus_per_node: int = 8,
        machine_type: str = "",
        spot: bool = False,
        labels: dict[str, str] | None = None,
        autoscaling: bool = False,
    ) -> PoolState:
        """Add (or replace) a pool; ``autoscaling=True`` reports it as managed by the cluster autoscaler
        (limits 0..``max_size``)."""
        ref = PoolRef(pool, zone, region_of(zone))
        state = PoolState(
            ref, size, max_size, accelerators.get(accelerator).name, gpus_per_node,
            machine_type or f"{accelerator}-{gpus_per_node}g", spot, dict(labels or {}),
            autoscaling=autoscaling, autoscaling_max=max_size if autoscaling else 0,
        )
        with self._lock:
            self.pool_states[ref] = state
        return state

    def set_quota(
        self, metric: str, location: str, limit: float | None, usage: float | None = 0.0, *,
        unit: str = "gpus", status: str = "ok", reason: str = "", lead_time_days: float = 2.0,
    ) -> QuotaAmount:
        """Add or replace the quota row for (metric, location)."""
        row = QuotaAmount(
            metric, location, limit, usage, unit=unit, status=status, reason=reason,
            raise_path=f"fake://quotas/{metric}/{location}", lead_time_days=lead_time_days,
        )
        with self._lock:
            self.quota_rows = [r for r in self.quota_rows if (r.metric, r.location) != (metric, location)]
            self.quota_rows.append(row)
        return row

    def fail(self, method: str, exc: BaseException, *, times: int = 1, zone: str = "", region: str = "") -> None:
        """Make the next ``times`` calls of ``method`` (optionally only for ``zone``/``region``) raise ``exc``.

        ``times=-1`` fails forever. Raw (non-KfpGpuError) exceptions go through :meth:`classify`.
        """
        with self._lock:
            self._injected.setdefault(method, []).append(_Injected(exc, times, zone, region))

    def pool(self, pool: str, zone: str) -> PoolState:
        """Raises: NotFound when the fake has no such pool."""
        with self._lock:
            for ref, state in self.pool_states.items():
                if ref.pool == pool and ref.zone == zone:
                    return state
        raise NotFound(f"fake pool {pool!r} in zone {zone!r} does not exist", remediation="add_pool() it")

    def mutations(self, method: str | None = None) -> list[FakeCall]:
        return [c for c in self.calls if method is None or c.method == method]

    def classify(self, exc: BaseException, *, zone: str = "", region: str = "") -> Exception:
        """KfpGpuErrors pass through; anything else becomes a zone-scoped CloudError."""
        if isinstance(exc, KfpGpuError):
            return exc
        return CloudError(
            f"fake provider: {type(exc).__name__}: {exc}", scope=Scope.ZONE if zone else Scope.REGION,
            zone=zone, region=region,
        )

    # ---- internals -------------------------------------------------------------------------
    def _enter(self, method: str, *, zone: str = "", region: str = "") -> None:
        if self.on_call is not None:
            self.on_call(method)
        with self._lock:
            queue = self._injected.get(method, [])
            for inj in queue:
                if inj.zone and inj.zone != zone:
                    continue
                if inj.region and inj.region != region:
                    continue
                if inj.times > 0:
                    inj.times -= 1
                    if inj.times == 0:
                        queue.remove(inj)
                raise self.classify(inj.exc, zone=zone, region=region)

    def _check_region(self, region: str) -> None:
        if self.regions is not None and region not in self.regions:
            raise NotFound(
                f"region {region!r} does not exist for the fake provider",
                remediation=f"use one of {sorted(self.regions)}", region=region,
            )

    def _new_op(self, kind: str, target: str) -> Operation:
        op = Operation(f"fake-op-{next(self._ids)}", kind, target, OpStatus.PENDING)
        self.operations[op.id] = op
        self._polls[op.id] = 0
        return op
