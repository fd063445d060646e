"""An in-memory CapacityProvider for unit tests of steps, components and plans.

Everything is observable state, so tests assert on *what happened*, not on mocks:

* ``pool_states`` - the pools and their current target sizes;
* ``quota_rows`` - the quota table ``quota()`` answers from (rows may be ``status="unknown"``);
* ``stockout_zones`` - zones where growing a pool or reserving fails with ``CapacityUnavailable``
  (at call time, or - with ``stockout_async=True`` - when the operation is polled, like GKE);
* ``fail(method, exc, times=..)`` - error injection per call, optionally only for one zone/region;
* ``operations`` - every submitted operation; they finish after ``op_polls`` calls to ``operation()``;
* ``reservations`` - reservations with their owner labels;
* ``calls`` - the log of *state-changing* mutations. Idempotent repeats do not appear, so
  "resize to the same size twice" shows up as exactly one ``resize`` call.

``on_call`` (optional) runs at the start of every method, outside the lock: give it a
``threading.Barrier.wait`` to prove calls overlap, or a virtual-latency recorder.

The fake is thread-safe: preflight and scale-up call it from worker threads.
"""

from __future__ import annotations

from dataclasses import replace

from kfp_gpu import accelerators
from kfp_gpu.errors import (
    CapacityUnavailable,
    CloudError,
    InvalidSpec,
    NotFound,
    Scope,
)
from kfp_gpu.ownership import LABEL_RUN_ID, Owner, label_safe
from kfp_gpu.providers.base import (
    Operation,
    OpStatus,
    OwnedResource,
    PoolActivity,
    PoolError,
    PoolRef,
    PoolState,
    QuotaAmount,
    ReservationRequest,
)
from kfp_gpu.providers.fake_state import FakeCall, FakeReservation, FakeState, region_of


def relevant_metrics(accelerator: str, *, spot: bool) -> set[str]:
    """Quota metrics (GCP metric names and AWS quota codes) that govern ``accelerator``."""
    acc = accelerators.get(accelerator)
    out = {
        acc.gcp_quota_metric,  # spot falls back to the standard metric when no preemptible row exists
        accelerators.GCP_ALL_REGIONS_METRIC,
        acc.aws_quota_spot if spot else acc.aws_quota_on_demand,
    }
    if spot:
        out.add(acc.gcp_preemptible_metric)
    if acc.gcp_gpu_family:
        out.add(acc.gcp_gpu_family)
        out.add(accelerators.GCP_GPU_FAMILY_QUOTA_ID)
    return out


class FakeProvider(FakeState):
    """In-memory :class:`~kfp_gpu.providers.base.CapacityProvider`. See the module docstring."""

    name = "fake"
    scheme = "gke"  # its nodes are labelled as GKE labels them (kfp_gpu.cluster.node_labels)

    # ---- CapacityProvider ------------------------------------------------------------------
    def quota(self, accelerator: str, region: str, *, spot: bool) -> list[QuotaAmount]:
        """Rows of ``quota_rows`` for ``region``, its zones and ``global`` that govern ``accelerator``.

        Raises: NotFound (region not in ``regions``), PermissionDenied (injected).
        """
        self._enter("quota", region=region)
        self._check_region(region)
        metrics = relevant_metrics(accelerator, spot=spot)
        with self._lock:
            return [
                r for r in self.quota_rows
                if r.metric in metrics and (r.location in (region, "global") or region_of(r.location) == region)
            ]

    def pools(self, region: str, *, sizes: bool = True) -> list[PoolState]:
        """Raises: NotFound (region not in ``regions``) and anything injected."""
        self._enter("pools", region=region)
        self._check_region(region)
        with self._lock:
            return [p for p in self.pool_states.values() if (p.ref.region or region_of(p.ref.zone)) == region]

    def resize(self, ref: PoolRef, size: int, owner: Owner) -> Operation:
        """Set the absolute size. Repeats with the same owner and size return the same operation.

        Raises: NotFound, InvalidSpec (size outside [0, max]), CapacityUnavailable (stockout zone,
        unless ``stockout_async``), and anything injected.
        """
        self._enter("resize", zone=ref.zone, region=ref.region or region_of(ref.zone))
        with self._lock:
            state = self.pool(ref.pool, ref.zone)
            if size < 0 or size > state.max_size:
                raise InvalidSpec(
                    "size", size, f"pool {ref.pool!r} in {ref.zone} allows 0..{state.max_size} nodes",
                    remediation="raise the pool's max size or ask for fewer nodes",
                )
            key = (owner.run_id, owner.step, state.ref, size)
            if key in self._resize_ops:
                return self.operations[self._resize_ops[key]]
            growing = size > state.size
            if growing and ref.zone in self.stockout_zones and not self.stockout_async:
                raise _stockout(ref.zone, state)
            op = self._new_op("resize", f"{ref.pool}@{ref.zone}")
            self._resize_ops[key] = op.id
            if growing and ref.zone in self.stockout_zones:
                self._pending_error[op.id] = _stockout(ref.zone, state)
            if size != state.size:
                self._resize_from[op.id] = (state.ref, state.size)
                self.pool_states[state.ref] = replace(state, size=size)
                self.calls.append(FakeCall(
                    "resize", op.target, {"from": state.size, "to": size, "step": owner.step}, owner.run_id,
                ))
                self.owned_resizes[(owner.run_id, state.ref)] = OwnedResource(
                    "pool-resize", ref.pool, ref.zone, owner.labels(),
                )
            else:
                self._polls[op.id] = self.op_polls  # nothing to do: done at once
                op = self.operations[op.id] = replace(op, status=OpStatus.DONE)
            return op

    def operation(self, op: Operation) -> Operation:
        """Advance ``op`` one poll; it is DONE (or FAILED with its error) after ``op_polls`` polls.

        Raises: NotFound (unknown id) and anything injected.
        """
        self._enter("operation")
        with self._lock:
            cur = self.operations.get(op.id)
            if cur is None:
                raise NotFound(f"fake operation {op.id!r} does not exist")
            if cur.done:
                return cur
            self._polls[op.id] = self._polls.get(op.id, 0) + 1
            if self._polls[op.id] >= self.op_polls:
                err = self._pending_error.pop(op.id, None)
                cur = replace(cur, status=OpStatus.FAILED if err else OpStatus.DONE, error=err)
            else:
                cur = replace(cur, status=OpStatus.RUNNING)
            self.operations[op.id] = cur
            return cur

    def pool_activity(self, ref: PoolRef, since: float = 0.0) -> PoolActivity:
        """The fake has no VMs: a pool is at its target once its resize ops are done; while one is pending
        the nodes it adds count as creating, and a pending stockout is reported as a creation error.

        Raises: NotFound (no such pool) and anything injected.
        """
        self._enter("pool_activity", zone=ref.zone, region=ref.region or region_of(ref.zone))
        with self._lock:
            state = self.pool(ref.pool, ref.zone)
            pending = [(op_id, before) for op_id, (r, before) in self._resize_from.items()
                       if r == state.ref and not self.operations[op_id].done]
            running = min([before for _, before in pending] + [state.size])
            errors = tuple(
                PoolError("ZONE_RESOURCE_POOL_EXHAUSTED", str(self._pending_error[op_id]), action="CREATING")
                for op_id, _ in pending if op_id in self._pending_error)
            return PoolActivity(state.ref, state.size, running, state.size - running, errors)

    def complete_all(self) -> None:
        """Finish every pending operation (convenience for tests)."""
        for op in list(self.operations.values()):
            while not self.operations[op.id].done:
                self.operation(op)

    def reserve(self, req: ReservationRequest, owner: Owner) -> Operation:
        """Create or re-attach to reservation ``req.name``.

        Raises: CloudError (name taken by another run), CapacityUnavailable (stockout zone), injected errors.
        """
        self._enter("reserve", zone=req.zone, region=region_of(req.zone))
        with self._lock:
            existing = self.reservations.get(req.name)
            if existing is not None:
                if existing.labels.get(LABEL_RUN_ID) == owner.labels()[LABEL_RUN_ID]:
                    return self.operations[existing.op_id]
                raise CloudError(
                    f"reservation {req.name!r} already exists and belongs to run "
                    f"{existing.labels.get(LABEL_RUN_ID)!r}", scope=Scope.ZONE, zone=req.zone,
                )
            if req.zone in self.stockout_zones:
                raise CapacityUnavailable(
                    f"no {req.accelerator} capacity for reservation {req.name!r} in {req.zone}",
                    remediation="try another zone", zone=req.zone,
                )
            op = self._new_op("reserve", req.name)
            self.reservations[req.name] = FakeReservation(req, owner.labels(), op.id)
            self.calls.append(FakeCall("reserve", req.name, {"zone": req.zone, "count": req.count}, owner.run_id))
            return op

    def release(self, owner_run_id: str) -> list[str]:
        """Delete the run's reservations. Returns the names deleted. Raises: injected errors only."""
        self._enter("release")
        with self._lock:
            names = sorted(
                n for n, r in self.reservations.items() if r.labels.get(LABEL_RUN_ID) == label_safe(owner_run_id)
            )
            for n in names:
                del self.reservations[n]
                self.calls.append(FakeCall("release", n, {}, owner_run_id))
            return names

    def list_owned(self, run_id: str | None = None) -> list[OwnedResource]:
        """Reservations and pool resizes owned by ``run_id`` (all runs when None). Raises: injected errors."""
        self._enter("list_owned")
        want = None if run_id is None else label_safe(run_id)
        with self._lock:
            out = [
                OwnedResource("reservation", n, r.request.zone, dict(r.labels))
                for n, r in sorted(self.reservations.items())
            ]
            out += list(self.owned_resizes.values())
            return [o for o in out if want is None or o.labels.get(LABEL_RUN_ID) == want]

    def request_quota_increase(self, metric: str, region: str, value: float, justification: str) -> str:
        """Record a quota request; the same (metric, region, value) returns the same id.

        Raises: InvalidSpec (value not above the current limit), injected errors.
        """
        self._enter("request_quota_increase", region=region)
        with self._lock:
            for r in self.quota_rows:
                if r.metric == metric and r.location == region and r.limit is not None and value <= r.limit:
                    raise InvalidSpec(
                        "value", value, f"must be above the current {metric} limit {r.limit:g} in {region}",
                    )
            key = f"{metric}@{region}={value:g}"
            if key in self.quota_requests:
                return self.quota_requests[key].args["id"]  # type: ignore[no-any-return]
            call = FakeCall("request_quota_increase", f"{metric}@{region}",
                            {"id": f"fake-qr-{next(self._ids)}", "value": value, "justification": justification})
            self.quota_requests[key] = call
            self.calls.append(call)
            return str(call.args["id"])

def _stockout(zone: str, state: PoolState) -> CapacityUnavailable:
    return CapacityUnavailable(
        f"zone {zone} has no {state.machine_type} capacity ({state.accelerator}) right now",
        remediation="retry later or fail over to another zone", zone=zone, pool=state.ref.pool,
    )
