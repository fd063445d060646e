"""GangTracker: the live view of a run's candidate nodes, fed by a Node watch, recording the timeline."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Iterable, Sequence

from kfp_gpu.cluster.nodes import Node, NodeView
from kfp_gpu.ownership import label_safe
from kfp_gpu.plan import topology as topo
from kfp_gpu.plan.scale import PoolObservation
from kfp_gpu.providers.base import PoolState
from kfp_gpu.timeline import NodeState, Timeline


class GangTracker:
    """Thread-safe: the watch thread calls ``on_event``; the step thread waits on ``cond``.

    ``domain_label``/``topology`` (the spec's topology, :mod:`kfp_gpu.plan.topology`): with ``"required"`` the gang
    counts as Ready only when one domain of that label (the run's own nodes' domain, once it holds some) has enough
    claimable nodes; with ``"required"`` or ``"preferred"`` :meth:`pick` chooses the nodes to claim by domain."""

    def __init__(self, run_id: str, pools: Iterable[str], timeline: Timeline, gpus_per_node: int,
                 spot: bool, exclude: Iterable[str] = (), *, domain_label: str = "", topology: str = "none") -> None:
        self.domain_label, self.topology = domain_label, topology if domain_label else "none"
        self.run_label = label_safe(run_id)
        # Node uids already given up (preempted) though the API may still show them. By uid, not name: a
        # managed instance group recreates a VM under the same name, and that fresh Node is a valid replacement
        self.exclude = frozenset(exclude)
        self.pools = set(pools)
        self.timeline = timeline
        self.gpus_per_node = gpus_per_node
        self.spot = spot
        self.nodes: dict[str, NodeView] = {}
        self.requested_at: dict[tuple[str, str], float] = {}  # (pool, zone) -> last resize request time
        self.cond = threading.Condition()
        self._claim: Callable[[Node], object] | None = None
        self._claim_zones: set[str] = set()
        self._claim_limit = 0
        self.claim_submitted: set[str] = set()
        self._raw: dict[str, Node] = {}
        self.watch_error: BaseException | None = None  # set when the Node watch was refused (RBAC)

    def seed(self, nodes: Sequence[Node], at: float) -> None:
        for n in nodes:
            self.on_event("ADDED", n, at, preexisting=True)

    def on_event(self, kind: str, node: Node, at: float, *, preexisting: bool = False) -> None:
        if kind == "ERROR":  # the watch was refused (401/403): ``node["error"]``; no node changed
            with self.cond:
                self.watch_error = node.get("error")
                self.cond.notify_all()
            return
        view = NodeView.of(node)
        if view.pool not in self.pools or (view.uid and view.uid in self.exclude):
            return
        with self.cond:
            if kind == "DELETED":
                self.nodes.pop(view.name, None)
                tl = self.timeline.nodes.get(view.name)
                if tl is not None and tl.state is not NodeState.RELEASED:
                    tl.advance(NodeState.RELEASED, at)
            else:
                first = view.name not in self.nodes
                self.nodes[view.name] = view
                self._raw[view.name] = node
                self._maybe_claim(view)
                if first and not (preexisting and view.run_id not in ("", self.run_label)):
                    self._register(view, _created_at(node, at) if preexisting else at, preexisting)
                tl = self.timeline.nodes.get(view.name)
                if tl is not None and view.ready and view.gpus >= self.gpus_per_node:
                    if tl.state is NodeState.REQUESTED:
                        tl.advance(NodeState.REGISTERED, at)
                    if tl.state is NodeState.REGISTERED:
                        tl.advance(NodeState.READY, at)
            self.cond.notify_all()

    def _register(self, view: NodeView, at: float, preexisting: bool) -> None:
        if view.name in self.timeline.nodes:
            return
        tl = self.timeline.node(view.name, pool=view.pool, zone=view.zone, gpus=self.gpus_per_node, spot=self.spot)
        requested = self.requested_at.get((view.pool, view.zone), at)
        tl.times[NodeState.REQUESTED.value] = min(requested, at)
        tl.advance(NodeState.REGISTERED, at)
        if preexisting:
            tl.times["preexisting"] = 1.0

    def claim_early(self, submit: Callable[[Node], object], zones: Iterable[str], limit: int) -> None:
        """Claim nodes *as they turn Ready* (up to ``limit`` more), so claim round trips overlap boot."""
        with self.cond:
            self._claim, self._claim_zones, self._claim_limit = submit, set(zones), limit
            for view in list(self.nodes.values()):
                self._maybe_claim(view)

    def _maybe_claim(self, view: NodeView) -> None:
        if (self._claim is None or view.name in self.claim_submitted or view.run_id
                or len(self.claim_submitted) >= self._claim_limit or view.zone not in self._claim_zones
                or not view.ready or view.deleting or view.going or view.gpus < self.gpus_per_node):
            return
        self.claim_submitted.add(view.name)
        self._claim(self._raw[view.name])

    def mark_requested(self, pool: str, zone: str, at: float) -> None:
        with self.cond:
            self.requested_at.setdefault((pool, zone), at)

    # ---- views, all under the lock --------------------------------------------------------------
    def observations(self, states: Sequence[PoolState]) -> list[PoolObservation]:
        """Pools as *this run* sees them: nodes claimed by other runs are taken out of size and max."""
        with self.cond:
            out = []
            for st in states:
                mine = [n for n in self.nodes.values()
                        if n.pool == st.ref.pool and n.zone == st.ref.zone and not n.deleting]
                others = sum(1 for n in mine if n.run_id not in ("", self.run_label))
                view = dataclasses.replace(st, size=max(0, st.size - others), max_size=max(0, st.max_size - others))
                out.append(PoolObservation(view, nodes=len(mine) - others))
            return out

    def others_in(self, pool: str, zone: str) -> int:
        with self.cond:
            return sum(1 for n in self.nodes.values()
                       if n.pool == pool and n.zone == zone and n.run_id not in ("", self.run_label))

    def claimable(self, zones: Iterable[str] | None = None) -> list[NodeView]:
        """Ready GPU nodes in ``zones`` (every zone when None) that are ours or unclaimed; ours first."""
        with self.cond:
            ok = self._claimable(None if zones is None else set(zones))
        return sorted(ok, key=lambda n: (n.run_id != self.run_label, n.name))

    def _claimable(self, zones: set[str] | None) -> list[NodeView]:
        return [n for n in self.nodes.values()
                if (zones is None or n.zone in zones) and n.ready and not n.deleting and not n.going
                and n.gpus >= self.gpus_per_node
                and n.run_id in ("", self.run_label)]

    def ready_count_locked(self, zones: Iterable[str]) -> int:
        """Like ready_count, for callers already holding ``cond``."""
        ok = self._claimable(set(zones))
        if self.topology != "required":
            return len(ok)
        within = self._ours_domain(ok)
        counts = topo.domains({n.name: self._labels(n.name) for n in ok}, self.domain_label)
        return len(counts.get(within, ())) if within else max((len(v) for v in counts.values()), default=0)

    def _labels(self, name: str) -> dict[str, str]:
        return dict(((self._raw.get(name) or {}).get("metadata") or {}).get("labels") or {})

    def _ours_domain(self, views: Iterable[NodeView]) -> str:
        return topo.survivors_domain([self._labels(n.name) for n in views if n.run_id == self.run_label],
                                     self.domain_label)

    def pick(self, zones: Iterable[str], mine: Sequence[str], more: int) -> list[str] | None:
        """``more`` unclaimed claimable nodes in ``zones`` to add to ``mine`` (the run's nodes), in one domain with
        them (:func:`kfp_gpu.plan.topology.choose`); None when the topology rule cannot be met now."""
        with self.cond:
            ok = [n for n in self._claimable(set(zones)) if n.name not in mine]
            within = topo.survivors_domain([self._labels(n) for n in mine], self.domain_label)
        cands = {n.name: self._labels(n.name) for n in ok}
        if self.topology == "required" and mine:
            if not within:
                return None
            cands = {n: lb for n, lb in cands.items() if lb.get(self.domain_label) == within}
        return topo.choose(cands, more, self.domain_label, within=within, topology=self.topology)

    def claimed(self) -> list[NodeView]:
        with self.cond:
            return sorted((n for n in self.nodes.values()
                           if n.run_id == self.run_label and not n.deleting and not n.going),
                          key=lambda n: n.name)

    def ready_count(self, zones: Iterable[str]) -> int:
        with self.cond:
            return self.ready_count_locked(zones)


def _created_at(node: Node, default: float) -> float:
    """A pre-existing node registered at its creationTimestamp (second precision), not when we first saw it."""
    import datetime as dt

    stamp = (node.get("metadata") or {}).get("creationTimestamp")
    try:
        return min(default, dt.datetime.fromisoformat(str(stamp).replace("Z", "+00:00")).timestamp())
    except ValueError:
        return default
