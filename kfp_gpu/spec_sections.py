"""The sections of a :class:`kfp_gpu.spec.ProvisioningSpec` that are specs of their own (warm pool, recovery budget,
GPU health gate, cost inputs), each validated in ``__post_init__`` with one-line :class:`~kfp_gpu.errors.InvalidSpec`
errors naming the field (and their checks, :func:`check_range`, :func:`coerce_enum`); kept apart so spec.py stays
small. Import them from :mod:`kfp_gpu.spec`."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from kfp_gpu.errors import InvalidSpec


@dataclass(frozen=True)
class WarmPool:
    """Balloon capacity held just in time, released when training pods arrive or the TTL ends."""

    nodes: int = 0
    ttl_s: float = 1800.0
    cloud_reservation: bool = False

    def __post_init__(self) -> None:
        check_range("warm_pool.nodes", self.nodes, 0, 1024, int)
        check_range("warm_pool.ttl_s", self.ttl_s, 1.0, 7 * 86400.0, (int, float))


@dataclass(frozen=True)
class Recovery:
    """Our own restart budget (the Training Operator keeps none for preemptions)."""

    max_preemptions: int = 3
    on_demand_after: int = 0  # fall back to on-demand after this many preemptions; 0 = never
    app_failure_retries: int = 1  # application failures (exit 1...) retried at most this often

    def __post_init__(self) -> None:
        check_range("recovery.max_preemptions", self.max_preemptions, 0, 1000, int)
        check_range("recovery.on_demand_after", self.on_demand_after, 0, 1000, int)
        check_range("recovery.app_failure_retries", self.app_failure_retries, 0, 10, int)


HEALTH_MIDRUN = ("replace", "report")


@dataclass(frozen=True)
class Health:
    """The GPU health gate before launch and the mid-run reaction to GPU-health node conditions (docs/health.md).

    ``probe``: run one probe pod per gang node (new or replacement) before the job starts: ``nvidia-smi`` device
    count vs allocatable, ``dcgmi diag -r <dcgm_level>``, and with ``nccl`` a short all-reduce across the gang.
    Bad nodes are released and replaced; the gate gives up after ``max_rounds`` rounds or ``timeout_s`` (each
    round's probes get ``probe_timeout_s``). ``image``: the probe image ("" = the one ``kfp-gpu`` ships,
    images/gpu-probe). ``conditions``: more Node condition types that mean a GPU fault when "True" (besides the
    ones kfp-gpu knows, kfp_gpu/plan/health.py). ``midrun``: "replace" swaps a node that gets such a condition at
    the next checkpoint (within ``midrun_max_wait_s``); "report" only records it.
    """

    probe: bool = False
    dcgm_level: int = 1
    nccl: bool = False
    timeout_s: float = 300.0
    probe_timeout_s: float = 120.0
    max_rounds: int = 3
    image: str = ""
    conditions: tuple[str, ...] = ()
    midrun: str = "replace"
    midrun_max_wait_s: float = 1800.0

    def __post_init__(self) -> None:
        if not isinstance(self.probe, bool):
            raise InvalidSpec("health.probe", self.probe, "must be true or false")
        if not isinstance(self.nccl, bool):
            raise InvalidSpec("health.nccl", self.nccl, "must be true or false")
        check_range("health.dcgm_level", self.dcgm_level, 1, 4, int)
        check_range("health.timeout_s", self.timeout_s, 1.0, 86400.0, (int, float))
        check_range("health.probe_timeout_s", self.probe_timeout_s, 1.0, 86400.0, (int, float))
        check_range("health.max_rounds", self.max_rounds, 1, 100, int)
        check_range("health.midrun_max_wait_s", self.midrun_max_wait_s, 0.0, 7 * 86400.0, (int, float))
        if self.midrun not in HEALTH_MIDRUN:
            raise InvalidSpec("health.midrun", self.midrun, f"allowed: {', '.join(map(repr, HEALTH_MIDRUN))}")
        if not isinstance(self.image, str):
            raise InvalidSpec("health.image", self.image, "must be an image reference string")
        object.__setattr__(self, "conditions", tuple(self.conditions))
        for c in self.conditions:
            if not isinstance(c, str) or not c:
                raise InvalidSpec("health.conditions", c, "must be Node condition type names")


@dataclass(frozen=True)
class CostInputs:
    """Inputs of the three-tier cost-risk model. ``None`` price means the catalog list price."""

    price_per_gpu_hour: float | None = None
    expected_hours: float = 1.0
    sla_penalty_per_hour: float = 0.0

    def __post_init__(self) -> None:
        if self.price_per_gpu_hour is not None:
            check_range("cost.price_per_gpu_hour", self.price_per_gpu_hour, 0.0, 1000.0, (int, float))
        check_range("cost.expected_hours", self.expected_hours, 0.0, 10000.0, (int, float))
        check_range("cost.sla_penalty_per_hour", self.sla_penalty_per_hour, 0.0, 1e9, (int, float))


def check_range(name: str, value: Any, lo: float, hi: float, types: type | tuple[type, ...]) -> None:
    if isinstance(value, bool) or not isinstance(value, types):
        want = "an integer" if types is int else "a number"
        raise InvalidSpec(name, value, f"must be {want} in [{lo:g}, {hi:g}]")
    if not lo <= float(value) <= hi:  # type: ignore[arg-type,unused-ignore]
        raise InvalidSpec(name, value, f"must be in [{lo:g}, {hi:g}]")


def as_names(name: str, value: Any) -> tuple[Any, ...]:
    """``value`` as a tuple, refusing one string where a list is wanted (``zones="us-central1-a"`` would otherwise be
    read as 13 one-letter names). Raises: InvalidSpec naming the field and the fix."""
    if isinstance(value, (str, bytes)):
        raise InvalidSpec(name, value, "must be a list, not one string", remediation=f"write {name}=({value!r},)")
    try:
        return tuple(value)
    except TypeError:
        raise InvalidSpec(name, value, "must be a list", remediation=f"write {name}=(...,) or [...]") from None


def coerce_enum(obj: Any, attr: str, enum_type: type[enum.Enum], name: str) -> None:
    """Store ``obj.attr`` as a member of ``enum_type``; InvalidSpec naming ``name`` and the allowed values."""
    value = getattr(obj, attr)
    try:
        object.__setattr__(obj, attr, enum_type(value))
    except ValueError:
        allowed = ", ".join(repr(e.value) for e in enum_type)
        raise InvalidSpec(name, value, f"allowed: {allowed}") from None
