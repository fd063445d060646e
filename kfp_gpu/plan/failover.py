"""Failover: a classified error blocks a scope; the next unblocked candidate zone is tried.

The error -> scope mapping itself lives in each provider's table (``classify``); here we only read
``KfpGpuError.scope``: ZONE blocks that zone, REGION every zone of the region, PROVIDER everything,
NONE (transient) blocks nothing and means "back off and retry the same zone".
When every candidate is blocked, :meth:`FailoverState.exhausted` builds the error to raise:
a ``CapacityUnavailable`` carrying the whole failover history, or - when the provider itself is
blocked (permissions...) or a region is (a regional quota) - that permanent error, also with the history
attached.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from kfp_gpu.errors import CapacityUnavailable, CloudError, KfpGpuError, Scope


class Action(str, enum.Enum):
    RETRY = "retry"  # transient: back off, same zone
    FAILOVER = "failover"  # try ``Decision.zone``
    GIVE_UP = "give-up"  # raise ``FailoverState.exhausted()``


@dataclass(frozen=True)
class Candidate:
    region: str
    zone: str

    @property
    def label(self) -> str:
        return self.zone or self.region


@dataclass(frozen=True)
class Decision:
    action: Action
    candidate: Candidate | None = None


def as_kfp_error(err: BaseException, zone: str = "") -> KfpGpuError:
    """Unclassified exceptions become a CloudError scoped to the narrowest placement."""
    if isinstance(err, KfpGpuError):
        return err
    return CloudError(f"{type(err).__name__}: {err}", scope=Scope.ZONE if zone else Scope.REGION)


@dataclass
class FailoverState:
    """Blocked scopes plus a JSON-serialisable history of every error seen."""

    blocked_zones: set[str] = field(default_factory=set)
    blocked_regions: set[str] = field(default_factory=set)
    provider_blocked: bool = False
    provider_error: dict[str, Any] | None = None
    history: list[dict[str, Any]] = field(default_factory=list)
    region_error: dict[str, Any] | None = None  # the newest region-scoped error (e.g. a regional quota)

    def is_blocked(self, c: Candidate) -> bool:
        return self.provider_blocked or c.region in self.blocked_regions or (
            bool(c.zone) and c.zone in self.blocked_zones
        )

    def record(self, err: BaseException, where: Candidate, *, at: float | None = None) -> KfpGpuError:
        """Block the scope ``err`` names and append it to the history. Returns the classified error."""
        kerr = as_kfp_error(err, where.zone)
        if kerr.scope is Scope.ZONE:
            if where.zone:
                self.blocked_zones.add(where.zone)
            else:
                self.blocked_regions.add(where.region)
        elif kerr.scope is Scope.REGION:
            self.blocked_regions.add(where.region)
            self.region_error = kerr.to_dict()
        elif kerr.scope is Scope.PROVIDER:
            self.provider_blocked = True
            self.provider_error = kerr.to_dict()
        entry: dict[str, Any] = {
            "region": where.region, "zone": where.zone, "error": type(kerr).__name__,
            "scope": kerr.scope.value, "transient": kerr.transient, "message": kerr.message,
        }
        if at is not None:
            entry["t"] = at
        self.history.append(entry)
        return kerr

    def next_candidate(self, candidates: Sequence[Candidate]) -> Candidate | None:
        """The first candidate (in priority order) not blocked."""
        for c in candidates:
            if not self.is_blocked(c):
                return c
        return None

    def decide(
        self, err: BaseException, where: Candidate, candidates: Sequence[Candidate], *, at: float | None = None
    ) -> Decision:
        """Record ``err`` at ``where`` and say what to do next."""
        kerr = self.record(err, where, at=at)
        if kerr.transient or kerr.scope is Scope.NONE:
            return Decision(Action.RETRY, where)
        nxt = self.next_candidate(candidates)
        return Decision(Action.FAILOVER, nxt) if nxt is not None else Decision(Action.GIVE_UP)

    def exhausted(self, what: str = "the requested GPUs") -> KfpGpuError:
        """The error to raise once nothing is left to try; it carries ``history`` in its fields."""
        tried = ", ".join(dict.fromkeys(h["zone"] or h["region"] for h in self.history)) or "nothing"
        for blocking in (self.provider_error if self.provider_blocked else None, self.region_error):
            if blocking is not None:  # a provider- or region-wide refusal (a quota) is the reason, said as itself
                err = KfpGpuError.from_dict(blocking)
                err.fields["failover_history"] = list(self.history)
                return err
        return CapacityUnavailable(
            f"no candidate zone could provide {what}; tried {tried}",
            remediation=(
                "add zones or regions to the spec, allow_zone_spread=True, use a reservation, "
                "or retry later (see failover_history for each zone's error)"
            ),
            scope=Scope.PROVIDER,
            failover_history=list(self.history),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "blocked_zones": sorted(self.blocked_zones), "blocked_regions": sorted(self.blocked_regions),
            "provider_blocked": self.provider_blocked, "provider_error": self.provider_error,
            "region_error": self.region_error, "history": list(self.history),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> FailoverState:
        return cls(
            set(d.get("blocked_zones", [])), set(d.get("blocked_regions", [])),
            bool(d.get("provider_blocked", False)), d.get("provider_error"), list(d.get("history", [])),
            d.get("region_error"),
        )
