"""ProvisioningSpec: what a run needs, validated, immutable, and JSON round-trippable.

The spec travels between DAG steps as a string parameter, so ``to_json``/``from_json`` are lossless:
``ProvisioningSpec.from_json(s.to_json()) == s`` for every valid spec. Validation runs in
``__post_init__``; every failure is an :class:`~kfp_gpu.errors.InvalidSpec` naming the field,
the value, the allowed values and the fix. The target (:class:`Target`) and the sections (warm pool, recovery,
health, cost) live in :mod:`kfp_gpu.spec_target` and :mod:`kfp_gpu.spec_sections`; import them from here.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import re
from dataclasses import dataclass, field
from typing import Any

from kfp_gpu import accelerators
from kfp_gpu.errors import InvalidSpec
from kfp_gpu.spec_sections import HEALTH_MIDRUN as HEALTH_MIDRUN
from kfp_gpu.spec_sections import CostInputs as CostInputs
from kfp_gpu.spec_sections import Health as Health
from kfp_gpu.spec_sections import Recovery as Recovery
from kfp_gpu.spec_sections import WarmPool as WarmPool
from kfp_gpu.spec_sections import as_names, coerce_enum
from kfp_gpu.spec_sections import check_range as _check_range
from kfp_gpu.spec_target import Target as Target
from kfp_gpu.spec_target import TargetKind as TargetKind

SPEC_VERSION = 1
_GCP_ZONE_RE = re.compile(r"^([a-z]+-[a-z]+\d+)-[a-z]$")  # us-central1-a -> us-central1
_AWS_ZONE_RE = re.compile(r"^([a-z]{2}-[a-z]+-\d+)[a-z]$")  # us-east-1a -> us-east-1
MAX_RUN_DURATION_S = 7 * 86400.0  # GKE DWS: maxRunDurationSeconds is at most 7 days
TOPOLOGIES = ("none", "preferred", "required")  # ProvisioningSpec.topology
TOPOLOGY_LEVELS = ("block", "subblock", "host")  # ProvisioningSpec.topology_level, widest first


class CapacityType(str, enum.Enum):
    ON_DEMAND = "on-demand"
    SPOT = "spot"
    RESERVATION = "reservation"
    FLEX_START = "flex-start"


DEFAULT_LEASE_TTL_S = 6 * 3600.0
STALL_TIMEOUT_MIN_S = 1.0
STRAGGLER_POLICIES = ("report", "replace")
LEASE_TTL_MIN_S = 10.0  # heartbeats beat every ttl/4: 2.5 s at the minimum, still well inside the lease


@dataclass(frozen=True)
class ProvisioningSpec:
    """What a run provisions. Every field is validated here, at decoration time (one-line InvalidSpec).

    ``topology`` keeps the gang inside one network domain of ``topology_level`` (GKE: the
    ``cloud.google.com/gce-topology-block``/``-subblock``/``-host`` node labels; EKS: the
    ``topology.k8s.aws/network-node-layer-N`` labels, block = the layer above the instance's switch): ``"required"``
    never runs it across domains (preflight refuses a gang no domain can hold), ``"preferred"`` packs it into one when
    it can, ``"none"`` (the default) ignores topology.
    ``fallback`` (the ``compute-class`` backend): the capacity types GKE tries after ``capacity``, in order, e.g.
    ``capacity="reservation", fallback=("flex-start", "spot", "on-demand")``; each becomes one rule of the run's
    ComputeClass ``priorities``. ``active_migration`` sets the class's ``activeMigration.optimizeRulePriority``:
    GKE replaces nodes of a lower rule with nodes of a preferred one once it has capacity again (each move costs
    the gang a rank: only for jobs that checkpoint).

    ``reservation`` (``capacity="reservation"``): the reservation the gang consumes. On GKE the Compute
    reservation's name, which the node pool's SPECIFIC reservation affinity names; on EKS the EC2 Capacity
    Reservation id (``cr-...``) or Capacity Reservation group ARN that the node group's launch template targets
    (its ``CapacityReservationSpecification``).
    """

    accelerator: str
    nodes: int
    gpus_per_node: int = 8
    capacity: CapacityType = CapacityType.ON_DEMAND
    target: Target = field(default_factory=Target)
    zones: tuple[str, ...] = ()  # candidate zones, priority order; empty = every zone of the region
    reservation: str = ""  # capacity=reservation: GKE reservation name; EKS cr-... id or group ARN (class docstring)
    topology: str = "none"  # "none" | "preferred" | "required": keep the gang in one topology_level domain
    topology_level: str = "block"  # "block" | "subblock" | "host" (kfp_gpu.plan.topology: the node labels)
    fallback: tuple[str, ...] = ()  # capacity types tried after ``capacity``, in order (compute-class backend)
    active_migration: bool = False  # compute-class: GKE moves nodes back to a preferred rule when it frees up
    scale_up_deadline_s: float = 900.0
    max_run_duration_s: float = 0.0  # capacity=flex-start: DWS maxRunDurationSeconds (0 = GKE's default, 7 days)
    allow_zone_spread: bool = False
    warm_pool: WarmPool = field(default_factory=WarmPool)
    recovery: Recovery = field(default_factory=Recovery)
    health: Health = field(default_factory=Health)
    checkpoint_uri: str = ""
    cost: CostInputs = field(default_factory=CostInputs)
    lease_ttl_s: float = DEFAULT_LEASE_TTL_S  # an orphan's label expiry (janitor); an unobservable owner's heartbeat bound
    # stalls and stragglers (docs/stalls.md): seconds without progress, or "auto" (a multiple of the step time)
    stall_timeout: float | str = "auto"
    stragglers: str = "report"  # "report" | "replace" (swap the straggler's node at the next checkpoint)
    straggler_margin: float = 0.2  # slower than the gang's median step time by more than this fraction...
    straggler_window_s: float = 300.0  # ...in every progress sample over this window

    def __post_init__(self) -> None:
        acc = accelerators.get(self.accelerator)
        object.__setattr__(self, "accelerator", acc.name)
        _check_range("nodes", self.nodes, 1, 4096, int)
        _check_range("gpus_per_node", self.gpus_per_node, 1, 16, int)
        coerce_enum(self, "capacity", CapacityType, "capacity")
        object.__setattr__(self, "zones", as_names("zones", self.zones))
        self._check_fallback()
        if self.target.kind is TargetKind.EKS:
            acc.aws_instance_for(self.gpus_per_node)
        else:
            acc.gce_machine_for(self.gpus_per_node)
        self._check_zones()
        _check_range("scale_up_deadline_s", self.scale_up_deadline_s, 0.001, 86400.0, (int, float))
        _check_range("max_run_duration_s", self.max_run_duration_s, 0.0, MAX_RUN_DURATION_S, (int, float))
        if self.max_run_duration_s and CapacityType.FLEX_START not in self.chain:
            raise InvalidSpec("max_run_duration_s", self.max_run_duration_s,
                              "only applies to capacity='flex-start' (DWS maxRunDurationSeconds)",
                              remediation="drop max_run_duration_s or use capacity='flex-start'")
        for name, allowed in (("topology", TOPOLOGIES), ("topology_level", TOPOLOGY_LEVELS)):
            if getattr(self, name) not in allowed:
                raise InvalidSpec(name, getattr(self, name), f"allowed: {', '.join(repr(v) for v in allowed)}",
                                  remediation="topology='required' or 'preferred' with topology_level='block', "
                                  "'subblock' or 'host'; topology='none' ignores the level")
        _check_range("lease_ttl_s", self.lease_ttl_s, LEASE_TTL_MIN_S, 30 * 86400.0, (int, float))
        self._check_stalls()
        if self.capacity is CapacityType.SPOT and self.reservation and not self.fallback:
            raise InvalidSpec(
                "reservation", self.reservation, "spot capacity cannot consume a reservation",
                remediation="drop reservation= or use capacity='reservation'",
            )
        if self.capacity is CapacityType.RESERVATION and not self.reservation:
            raise InvalidSpec(
                "reservation", self.reservation, "capacity='reservation' needs a reservation name",
                remediation="set reservation='my-reservation' or pick another capacity type",
            )
        if self.warm_pool.cloud_reservation and self.capacity is CapacityType.SPOT:
            raise InvalidSpec(
                "warm_pool.cloud_reservation", True, "spot VMs never consume reservations: it would be paid for "
                "beside the nodes", remediation="set warm_pool.cloud_reservation=False or use capacity='on-demand'",
            )
        if self.warm_pool.cloud_reservation and self.capacity is CapacityType.RESERVATION:
            raise InvalidSpec(
                "warm_pool.cloud_reservation", True, f"capacity='reservation' consumes the existing reservation "
                f"{self.reservation!r}; a second one would be paid for twice",
                remediation="set warm_pool.cloud_reservation=False",
            )
        if self.recovery.on_demand_after and self.capacity is not CapacityType.SPOT:
            raise InvalidSpec(
                "recovery.on_demand_after", self.recovery.on_demand_after,
                "on-demand fallback only applies to capacity='spot'",
                remediation="set recovery.on_demand_after=0 or capacity='spot'",
            )
        if self.warm_pool.nodes > self.nodes:
            raise InvalidSpec("warm_pool.nodes", self.warm_pool.nodes, f"must be <= nodes ({self.nodes})")
        if self.checkpoint_uri and not re.match(r"^((gs|s3)://[^/]+|file://.+|/)", self.checkpoint_uri):
            raise InvalidSpec(
                "checkpoint_uri", self.checkpoint_uri, "must be gs://BUCKET/..., s3://BUCKET/..., file://PATH or /PATH",
                remediation="name the bucket (and a prefix): e.g. gs://my-bucket/checkpoints/run-name",
            )

    def _check_fallback(self) -> None:
        """The capacity chain (:func:`kfp_gpu.spec_chain.check`). Raises: InvalidSpec."""
        from kfp_gpu import spec_chain

        object.__setattr__(self, "fallback", as_names("fallback", self.fallback))
        spec_chain.check(self.capacity.value, self.fallback, provisioner=self.target.provisioner,
                         eks=self.target.kind is TargetKind.EKS, reservation=self.reservation,
                         active_migration=self.active_migration)

    @property
    def chain(self) -> tuple[CapacityType, ...]:
        """The capacity types in the order they are tried: ``capacity``, then ``fallback``."""
        return (self.capacity, *(CapacityType(v) for v in self.fallback))

    def _check_stalls(self) -> None:
        if self.stall_timeout != "auto":
            if isinstance(self.stall_timeout, str):
                raise InvalidSpec("stall_timeout", self.stall_timeout, "must be 'auto' or a number of seconds",
                                  remediation="e.g. stall_timeout='auto' or stall_timeout=300")
            _check_range("stall_timeout", self.stall_timeout, STALL_TIMEOUT_MIN_S, 7 * 86400.0, (int, float))
        if self.stragglers not in STRAGGLER_POLICIES:
            raise InvalidSpec("stragglers", self.stragglers, f"allowed: {', '.join(map(repr, STRAGGLER_POLICIES))}")
        _check_range("straggler_margin", self.straggler_margin, 0.01, 10.0, (int, float))
        _check_range("straggler_window_s", self.straggler_window_s, 1.0, 86400.0, (int, float))

    @property
    def stall_timeout_s(self) -> float | None:
        """The stall timeout in seconds, or None for "auto" (kfp_gpu.plan.stall.timeout_for)."""
        return None if isinstance(self.stall_timeout, str) else float(self.stall_timeout)

    def _check_zones(self) -> None:
        zone_re = _AWS_ZONE_RE if self.target.kind is TargetKind.EKS else _GCP_ZONE_RE
        if len(set(self.zones)) != len(self.zones):
            raise InvalidSpec("zones", list(self.zones), "zones must not repeat")
        for z in self.zones:
            m = zone_re.match(z)
            if not m:
                raise InvalidSpec("zones", z, "not a zone name (e.g. 'us-central1-a' or 'us-east-1a')")
            if m.group(1) != self.target.region:
                raise InvalidSpec(
                    "zones", z, f"zone is not in target.region {self.target.region!r}",
                    remediation=f"use zones of {self.target.region} or change target.region to {m.group(1)!r}",
                )

    # ---- derived --------------------------------------------------------------------------
    @property
    def total_gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def spot(self) -> bool:
        return self.capacity is CapacityType.SPOT

    def price_per_gpu_hour(self, *, spot: bool | None = None) -> float:
        if self.cost.price_per_gpu_hour is not None:
            return self.cost.price_per_gpu_hour
        price = accelerators.get(self.accelerator).price
        return price.spot if (self.spot if spot is None else spot) else price.on_demand

    def replace(self, **changes: Any) -> ProvisioningSpec:
        """A validated copy with ``changes`` applied. Raises: InvalidSpec."""
        return dataclasses.replace(self, **changes)

    # ---- JSON -----------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {"version": SPEC_VERSION, **_plain(dataclasses.asdict(self))}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_dict(cls, data: Any) -> ProvisioningSpec:
        """Raises: InvalidSpec naming the offending field for unknown keys, wrong types or bad values."""
        if not isinstance(data, dict):
            raise InvalidSpec("spec", type(data).__name__, "must be a JSON object")
        data = dict(data)
        version = data.pop("version", SPEC_VERSION)
        if version != SPEC_VERSION:
            raise InvalidSpec("version", version, f"this kfp-gpu reads spec version {SPEC_VERSION}")
        spec: ProvisioningSpec = _build(cls, data, "")
        return spec

    @classmethod
    def from_json(cls, text: str) -> ProvisioningSpec:
        """Raises: InvalidSpec when ``text`` is not valid spec JSON."""
        try:
            data = json.loads(text)
        except (TypeError, ValueError) as exc:
            raise InvalidSpec(
                "spec_json", (text or "")[:80], f"is not valid JSON ({exc})",
                remediation="pass ProvisioningSpec.to_json() output, not a hand-edited string",
            ) from None
        return cls.from_dict(data)


_NESTED: dict[str, type[Any]] = {
    "target": Target, "warm_pool": WarmPool, "recovery": Recovery, "cost": CostInputs, "health": Health,
}


def _build(cls: type[Any], data: dict[str, Any], prefix: str) -> Any:
    known = {f.name for f in dataclasses.fields(cls)}
    for key in data:
        if key not in known:
            raise InvalidSpec(f"{prefix}{key}", data[key], f"unknown field; known: {', '.join(sorted(known))}")
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        if key in _NESTED and cls is ProvisioningSpec:
            if not isinstance(value, dict):
                raise InvalidSpec(f"{key}", value, "must be an object")
            value = _build(_NESTED[key], value, f"{key}.")
        elif isinstance(value, list):
            value = tuple(value)
        kwargs[key] = value
    try:
        return cls(**kwargs)
    except TypeError as exc:
        raise InvalidSpec(prefix.rstrip(".") or "spec", data, str(exc)) from None


def _plain(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value
