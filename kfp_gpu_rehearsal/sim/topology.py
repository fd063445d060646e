"""Where a simulated VM physically sits: its block, sub-block and host, and compact placement (docs/sim.md, "Topology").

GCE places a VM on a host; hosts form sub-blocks, sub-blocks form blocks, and GKE labels each node with the three
(``cloud.google.com/gce-topology-block``, ``-subblock``, ``-host``;
https://cloud.google.com/ai-hypercomputer/docs/workloads/schedule-gke-workloads-tas,
https://cloud.google.com/compute/docs/instances/view-instance-topology). A node pool with a compact placement policy
(``placementPolicy.type: COMPACT``, https://cloud.google.com/kubernetes-engine/docs/how-to/compact-placement) puts
its VMs close together: here, in one block. Compute Engine keeps them there only when the policy sets a max distance
("When you require densely colocated resources, specify a max distance in the policy. When you want densely
colocated resources based on best-effort availability, don't specify a max distance",
https://cloud.google.com/ai-hypercomputer/docs/placement-policy-and-workload-policy): a *strict* pool's VM that its
block has no host for is not created, a *best-effort* pool's lands in another block (the block it spilled into
while that has room, else the one with the most free hosts). An EC2 cluster placement group is strict. A VM of a pool without a policy lands wherever there is room:
here, the block with the most free hosts, so an unplaced pool's VMs scatter across blocks.

The scenario's ``topology:`` block sets the sizes: ``block_nodes`` hosts per block, ``subblock_nodes`` hosts per
sub-block, ``blocks`` blocks per zone (0 = as many as needed). No ``topology:`` block = no labels (the default).
One host runs one GPU VM (the A3/A4 machine types take a whole host), and a block holds one machine type: hosts are
counted per *site* (zone + machine type, :func:`site`).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from kfp_gpu.errors import InvalidSpec

BLOCK = "cloud.google.com/gce-topology-block"
SUBBLOCK = "cloud.google.com/gce-topology-subblock"
HOST = "cloud.google.com/gce-topology-host"
COMPACT = "COMPACT"
AWS_LAYER = "topology.k8s.aws/network-node-layer-{}"


@dataclass(frozen=True)
class TopologySpec:
    block_nodes: int = 0  # hosts per block; 0 = the world has no topology (nodes carry no topology labels)
    subblock_nodes: int = 0  # hosts per sub-block (divides block_nodes); 0 = block_nodes
    blocks: int = 0  # blocks per zone; 0 = as many as needed

    @property
    def enabled(self) -> bool:
        return self.block_nodes > 0


def parse_topology(data: Any, f: str = "topology") -> TopologySpec:
    """Validate the scenario's ``topology:`` block. Raises: InvalidSpec naming the field."""
    from kfp_gpu_rehearsal.sim.worldspec import num, obj

    if data is None:
        return TopologySpec()
    t = obj(data, f, {"block_nodes", "subblock_nodes", "blocks"})
    block = int(num(t.get("block_nodes", 0), f"{f}.block_nodes", 1))
    sub = int(num(t.get("subblock_nodes", block), f"{f}.subblock_nodes", 1))
    if block % sub:
        raise InvalidSpec(f"{f}.subblock_nodes", sub, f"must divide block_nodes ({block}): a block is whole sub-blocks")
    return TopologySpec(block, sub, int(num(t.get("blocks", 0), f"{f}.blocks", 0)))


def parse_placement(data: Any, f: str) -> str:
    """A pool's ``placement_policy`` (``compact`` or none). Raises: InvalidSpec naming the field."""
    value = str(data or "").upper()
    if value not in ("", COMPACT):
        raise InvalidSpec(f, data, "allowed: 'compact' (GKE placementPolicy.type COMPACT) or omit it")
    return value


def parse_max_distance(data: Any, f: str, placement: str) -> int:
    """A compact pool's ``placement_max_distance`` (its policy's ``groupPlacementPolicy.maxDistance``, 1-3; absent:
    none, best effort). Raises: InvalidSpec naming the field."""
    if data is None:
        return 0
    if placement != COMPACT:
        raise InvalidSpec(f, data, "needs placement_policy: compact (a max distance is a compact policy's)")
    if isinstance(data, bool) or not isinstance(data, int) or not 1 <= data <= 3:
        raise InvalidSpec(f, data, "must be 1, 2 or 3 (Compute Engine's maxDistance), or omit it for best effort")
    return data


def placement_policy_name(pool: str) -> str:
    """The Compute Engine resource policy a strict compact pool names (``placementPolicy.policyName``)."""
    return f"{pool}-compact"


def site(zone: str, machine_type: str) -> str:
    """Where hosts are counted: a zone's blocks of one machine type."""
    return f"{zone}/{machine_type}"


def _id(*parts: str) -> str:
    return hashlib.sha1("/".join(parts).encode()).hexdigest()[:12]


class Hosts:
    """The hosts of every zone: which VM runs where, and the block each compact pool is held to (lock held by the
    caller: :class:`kfp_gpu_rehearsal.sim.state.SimState`'s)."""

    def __init__(self, spec: TopologySpec, project: str) -> None:  # project: what makes block ids unique
        self.spec, self.project = spec, project
        self.used: dict[str, dict[int, set[int]]] = {}  # site -> block -> taken host slots
        self.where: dict[str, tuple[str, int, int]] = {}  # VM name -> (site, block, slot)
        self.pool_block: dict[str, int] = {}  # compact pool -> its block
        self.spill_block: dict[str, int] = {}  # best-effort compact pool -> the block it spilled into last

    def free(self, zone: str, block: int) -> int:
        return self.spec.block_nodes - len(self.used.get(zone, {}).get(block, ()))

    def _blocks(self, zone: str) -> list[int]:
        have = sorted(self.used.get(zone, {}))
        count = self.spec.blocks or (max(have, default=-1) + 2)  # one empty block beyond the used ones
        return list(range(count))

    def room(self, zone: str, pool: str, compact: bool, need: int, strict: bool = True) -> int | None:
        """Hosts a strict compact ``pool`` can still get (its block's free hosts, or the largest free block before its
        first VM); None for a pool without compact placement, a best-effort one, or a world without topology."""
        if not (compact and strict and self.spec.enabled):
            return None
        if pool in self.pool_block:
            return self.free(zone, self.pool_block[pool])
        return max((self.free(zone, b) for b in self._blocks(zone)), default=0)

    def place(self, zone: str, pool: str, name: str, compact: bool, need: int = 1,
              strict: bool = True) -> dict[str, str] | None:
        """Put VM ``name`` on a free host and return its node labels ({} without topology, the same labels when it is
        placed already); None when a strict compact pool's block is full (or no block of the zone has room). A
        best-effort compact pool (``strict`` False) whose block is full spills: into the block it spilled into while
        that has room, else the one with the most."""
        if not self.spec.enabled:
            return {}
        if name in self.where:
            return self.labels(name)
        frees = {b: self.free(zone, b) for b in self._blocks(zone) if self.free(zone, b) > 0}
        own = self.pool_block.get(pool) if compact else None
        if own is not None and (strict or own in frees):  # a compact pool's block
            if own not in frees:
                return None
            block = own
        elif not frees:
            return None
        elif own is not None:  # best effort, its block full
            spill = self.spill_block.get(pool)
            block = self.spill_block[pool] = spill if spill in frees else max(frees, key=lambda b: (frees[b], -b))
        elif compact:  # the first VM of a compact pool: the tightest block with room for all it asked, else the largest
            fits = [b for b, f in frees.items() if f >= need]
            block = min(fits, key=lambda b: (frees[b], b)) if fits else max(frees, key=lambda b: (frees[b], -b))
            self.pool_block[pool] = block
        else:  # no placement policy: the block with the most free hosts (VMs scatter)
            block = max(frees, key=lambda b: (frees[b], -b))
        taken = self.used.setdefault(zone, {}).setdefault(block, set())
        slot = min(set(range(self.spec.block_nodes)) - taken)
        taken.add(slot)
        self.where[name] = (zone, block, slot)
        return self.labels(name)

    def labels(self, name: str) -> dict[str, str]:
        zone, block, slot = self.where[name]
        sub = slot // (self.spec.subblock_nodes or self.spec.block_nodes)
        b = _id(self.project, zone, str(block))
        return {BLOCK: b, SUBBLOCK: _id(b, str(sub)), HOST: _id(b, "host", str(slot))}

    def aws_labels(self, name: str) -> dict[str, str]:
        """The EKS network topology labels of VM ``name`` (placed), block = layer 2, sub-block = layer 3, the site's
        whole hierarchy = layer 1 (https://docs.aws.amazon.com/eks/latest/userguide/ml-workload-topology.html)."""
        g = self.labels(name)
        top = _id(self.project, self.where[name][0])
        return {AWS_LAYER.format(1): f"nn-{top}", AWS_LAYER.format(2): f"nn-{g[BLOCK]}",
                AWS_LAYER.format(3): f"nn-{g[SUBBLOCK]}"}

    def release(self, name: str) -> None:
        where = self.where.pop(name, None)
        if where is not None:
            zone, block, slot = where
            self.used[zone][block].discard(slot)
