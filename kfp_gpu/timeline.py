"""Per-node lifecycle as an explicit, timestamped state machine (Ray autoscaler v2 style).

Transitions allowed (anything else raises ``ValueError``)::

    REQUESTED  -> REGISTERED | FAILED | RELEASED
    REGISTERED -> READY | FAILED | PREEMPTED | RELEASED
    READY      -> PREEMPTED | RELEASED
    PREEMPTED  -> RELEASED
    FAILED     -> RELEASED

Every transition records its wall-clock timestamp, so latency metrics, the cost report and the
timeline picture are derived from the same data. Timelines are JSON round-trippable: they travel
between steps and into reports.
"""

from __future__ import annotations

import enum
import json
import statistics
from dataclasses import dataclass, field
from typing import Any


class NodeState(str, enum.Enum):
    REQUESTED = "requested"
    REGISTERED = "registered"
    READY = "ready"
    PREEMPTED = "preempted"
    FAILED = "failed"
    RELEASED = "released"


TRANSITIONS: dict[NodeState, frozenset[NodeState]] = {
    NodeState.REQUESTED: frozenset({NodeState.REGISTERED, NodeState.FAILED, NodeState.RELEASED}),
    NodeState.REGISTERED: frozenset(
        {NodeState.READY, NodeState.FAILED, NodeState.PREEMPTED, NodeState.RELEASED}
    ),
    NodeState.READY: frozenset({NodeState.PREEMPTED, NodeState.RELEASED}),
    NodeState.PREEMPTED: frozenset({NodeState.RELEASED}),
    NodeState.FAILED: frozenset({NodeState.RELEASED}),
    NodeState.RELEASED: frozenset(),
}


@dataclass
class NodeTimeline:
    name: str
    pool: str = ""
    zone: str = ""
    gpus: int = 0
    spot: bool = False
    state: NodeState = NodeState.REQUESTED
    times: dict[str, float] = field(default_factory=dict)  # state value -> unix seconds

    def advance(self, to: NodeState, at: float) -> None:
        """Record a transition. Re-entering the current state is a no-op (watch events repeat).

        Raises: ValueError for a transition the table does not allow.
        """
        if to is self.state and to.value in self.times:
            return
        if to not in TRANSITIONS[self.state] and to is not self.state:
            raise ValueError(f"node {self.name}: {self.state.value} -> {to.value} is not allowed")
        self.state = to
        self.times.setdefault(to.value, at)

    def claimed_ready(self, requested_at: float, at: float) -> None:
        """A node first seen Ready when it was claimed: requested at ``requested_at`` (unless already
        recorded), registered and Ready at ``at`` (unless it is Ready already).

        Raises: ValueError for a node in a state that cannot become Ready.
        """
        self.times.setdefault(NodeState.REQUESTED.value, requested_at)
        for st in (NodeState.REGISTERED, NodeState.READY):
            if self.state is not NodeState.READY:
                self.advance(st, at)

    def at(self, state: NodeState) -> float | None:
        return self.times.get(state.value)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "pool": self.pool, "zone": self.zone, "gpus": self.gpus,
            "spot": self.spot, "state": self.state.value, "times": dict(self.times),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> NodeTimeline:
        return cls(
            name=str(d["name"]), pool=str(d.get("pool", "")), zone=str(d.get("zone", "")),
            gpus=int(d.get("gpus", 0)), spot=bool(d.get("spot", False)),
            state=NodeState(d.get("state", "requested")),
            times={str(k): float(v) for k, v in dict(d.get("times", {})).items()},
        )


@dataclass
class Timeline:
    """All nodes of one run plus run-level events (job start/end, preemptions)."""

    run_id: str = ""
    nodes: dict[str, NodeTimeline] = field(default_factory=dict)
    events: list[dict[str, Any]] = field(default_factory=list)  # {"t": .., "kind": .., ...}

    def node(self, name: str, **attrs: Any) -> NodeTimeline:
        tl = self.nodes.get(name)
        if tl is None:
            tl = self.nodes[name] = NodeTimeline(name=name, **attrs)
        return tl

    def event(self, kind: str, at: float, **data: Any) -> None:
        self.events.append({"t": at, "kind": kind, **data})

    def ready_latencies(self) -> list[float]:
        """Seconds from requested to Ready, per node that got there (safe beside a recording thread, as ``to_json``)."""
        out = []
        for n in list(self.nodes.values()):
            r, q = n.at(NodeState.READY), n.at(NodeState.REQUESTED)
            if r is not None and q is not None:
                out.append(r - q)
        return out

    def jitter(self) -> float:
        """Observed scale-up jitter: (max - median) / median of request->Ready latency; 0 if unknown."""
        lat = self.ready_latencies()
        if len(lat) < 2:
            return 0.0
        med = statistics.median(lat)
        return 0.0 if med <= 0 else (max(lat) - med) / med

    def merge(self, other: Timeline) -> Timeline:
        for name, n in other.nodes.items():
            mine = self.nodes.get(name)
            if mine is None:
                self.nodes[name] = NodeTimeline.from_dict(n.to_dict())
            else:
                for k, v in n.times.items():
                    mine.times.setdefault(k, v)
                order = list(NodeState)
                if order.index(n.state) > order.index(mine.state):
                    mine.state = n.state
        self.events.extend(other.events)
        self.events.sort(key=lambda e: float(e["t"]))
        return self

    def scaled(self, factor: float) -> Timeline:
        """A copy whose times are stretched by ``factor`` around the earliest time recorded (node transitions and
        events alike): the timeline of a compressed world (the local rehearsal runs ``factor`` real-world seconds
        per second) in the world's own clock. ``factor`` 1 gives an equal copy. Pure; raises nothing."""
        times = [t for n in self.nodes.values() for t in n.times.values()] + [float(e["t"]) for e in self.events]
        t0 = min(times, default=0.0)

        def stretch(t: float) -> float:
            return t0 + (t - t0) * factor

        out = Timeline(run_id=self.run_id, events=[{**e, "t": stretch(float(e["t"]))} for e in self.events])
        for name, n in self.nodes.items():
            copy = NodeTimeline.from_dict(n.to_dict())
            copy.times = {k: stretch(v) for k, v in n.times.items()}
            out.nodes[name] = copy
        return out

    def to_json(self) -> str:
        """The timeline as JSON. Safe while a watch thread records into it (a step saves its ledger as nodes
        arrive): nodes, events and each node's times are copied first by ``list``/``dict``, each one C call that
        holds the GIL, so no Python-level iteration runs over a dict another thread is growing."""
        nodes = [n.to_dict() for n in list(self.nodes.values())]
        return json.dumps({"run_id": self.run_id, "nodes": nodes, "events": list(self.events)}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Timeline:
        d = json.loads(text) if text else {}
        tl = cls(run_id=str(d.get("run_id", "")), events=list(d.get("events", [])))
        for n in d.get("nodes", []):
            node = NodeTimeline.from_dict(n)
            tl.nodes[node.name] = node
        return tl
