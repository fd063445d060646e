"""Topology decisions (no I/O): keep a gang inside one network domain (a block, a subblock or a host).

A node says where it sits by one label per level (the scheme's ``topology`` labels, kfp_gpu.cluster.node_labels:
GKE's ``cloud.google.com/gce-topology-block``/``-subblock``/``-host``, EKS's ``topology.k8s.aws/network-node-layer-N``).
The spec's ``topology`` says how hard the rule is: ``required`` never runs the gang across two domains of
``topology_level``, ``preferred`` packs it into one when one can hold it, ``none`` ignores topology.

* Under Kueue, Topology Aware Scheduling places the gang: :func:`kueue_annotations` are the pod set annotations
  (``kueue.x-k8s.io/podset-required-topology`` / ``podset-preferred-topology`` = the level's node label,
  https://kueue.sigs.k8s.io/docs/concepts/topology_aware_scheduling/).
* Without Kueue, kfp-gpu chooses the gang's nodes itself: :func:`choose` picks ``need`` nodes of one domain (the
  survivors' domain first, for a replacement), :func:`survivors_domain` says which domain the survivors hold.
* Preflight: :func:`fit` says whether a gang fits one domain, naming the domain sizes it saw; :func:`preflight_check`
  also reasons about the nodes the pools would add (:class:`PoolReach`): a compact pool (GKE ``placementPolicy``
  COMPACT, an EC2 cluster placement group) puts all its nodes in one block, a pool the cloud spreads gives none.
* Which pools a required gang grows: :func:`placement_pools` (the compact ones; none when every pool spreads).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from kfp_gpu.plan.preflight import ClusterCheck
from kfp_gpu.plan.quota import Verdict

REQUIRED_ANNOTATION = "kueue.x-k8s.io/podset-required-topology"
PREFERRED_ANNOTATION = "kueue.x-k8s.io/podset-preferred-topology"
GROUP_ANNOTATION = "kueue.x-k8s.io/podset-group-name"
CHECK_NAME = "topology"
# The level a compact pool keeps its nodes in. GKE: COMPACT is "node placement in the same availability domain"; EC2:
# a cluster placement group packs instances "close together inside an Availability Zone". Neither names a level:
# that it is one block (GKE gce-topology-block, EKS network-node-layer-2) is our assumption (docs/user-guide.md).
COMPACT_LEVEL = "block"
PLACEMENT_FIX = ("grow a pool that keeps its nodes together: an EKS node group whose launch template's Placement names "
                 "a placement group of strategy 'cluster', or (best effort) a GKE node pool with placementPolicy "
                 "COMPACT")


def kueue_annotations(topology: str, label: str) -> dict[str, str]:
    """The pod set annotations asking Kueue TAS for one domain of ``label``; {} for ``topology="none"``."""
    if topology == "required":
        return {REQUIRED_ANNOTATION: label}
    if topology == "preferred":
        return {PREFERRED_ANNOTATION: label}
    return {}


def group_annotations(annotations: Mapping[str, str], group: str, pod_sets: int) -> dict[str, str]:
    """What a job whose gang is ``pod_sets`` pod sets (a PyTorchJob's Master + Worker) adds so Kueue TAS fits them
    into one domain together: ``kueue.x-k8s.io/podset-group-name`` (a PodSet group is Kueue's unit of topology domain
    fitting; Kueue takes groups of exactly two pod sets, one of a single pod, under a required topology). Without it
    each pod set gets its own domain. {} when the annotations ask no required topology or the gang is one pod set."""
    if pod_sets != 2 or REQUIRED_ANNOTATION not in annotations:
        return {}
    return {GROUP_ANNOTATION: group}


def domains(nodes: Mapping[str, Mapping[str, str]], label: str) -> dict[str, list[str]]:
    """Node names by their ``label`` value (sorted); nodes without the label belong to no domain and are left out."""
    out: dict[str, list[str]] = {}
    for name, labels in nodes.items():
        value = labels.get(label, "")
        if value:
            out.setdefault(value, []).append(name)
    return {d: sorted(names) for d, names in sorted(out.items())}


def survivors_domain(survivors: Sequence[Mapping[str, str]], label: str) -> str:
    """The one ``label`` domain every survivor is in; "" when there are none, one lacks the label, or they span two."""
    values = {s.get(label, "") for s in survivors}
    return values.pop() if len(values) == 1 and "" not in values else ""


def choose(candidates: Mapping[str, Mapping[str, str]], need: int, label: str, *, within: str = "",
           topology: str = "required") -> list[str] | None:
    """``need`` of the ``candidates`` (name -> labels) in one ``label`` domain, or None when no domain holds them.

    ``within`` (the survivors' domain) is taken when it can hold ``need``; else the domain that fits with the fewest
    nodes left over (a small gang does not break up a large domain), ties by domain name. ``topology="preferred"``
    falls back to the whole candidate list (by domain size, then name) when no single domain holds ``need``;
    ``"none"`` takes the first ``need`` names.
    """
    if need <= 0:
        return []
    if topology == "none":
        names = sorted(candidates)
        return names[:need] if len(names) >= need else None
    by_domain = domains(candidates, label)
    if within and len(by_domain.get(within, ())) >= need:
        return by_domain[within][:need]
    fitting = sorted((len(ns) - need, d) for d, ns in by_domain.items() if len(ns) >= need)
    if fitting:
        return by_domain[fitting[0][1]][:need]
    if topology != "preferred" or len(candidates) < need:
        return None
    ordered = sorted(by_domain.items(), key=lambda kv: (kv[0] != within, -len(kv[1]), kv[0]))
    spread = [n for _, ns in ordered for n in ns]
    spread += sorted(n for n in candidates if n not in set(spread))
    return spread[:need]


@dataclass(frozen=True)
class DomainFit:
    """Whether a gang fits one domain: the verdict, one line saying why, and the domain sizes seen."""

    verdict: Verdict
    reason: str
    sizes: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, object]:
        return {"name": CHECK_NAME, "verdict": self.verdict.value, "reason": self.reason, "sizes": dict(self.sizes)}


def sizes_text(sizes: Mapping[str, int]) -> str:
    """``"b-1=2, b-2=3"``: domain sizes, largest first (at most 8, then how many more)."""
    ordered = sorted(sizes.items(), key=lambda kv: (-kv[1], kv[0]))
    text = ", ".join(f"{d}={n}" for d, n in ordered[:8])
    return text + (f" (+{len(ordered) - 8} more)" if len(ordered) > 8 else "")


def fit(need: int, sizes: Mapping[str, int] | None, *, topology: str, level: str, label: str) -> DomainFit:
    """Whether ``need`` nodes fit one ``level`` domain, given ``sizes`` (domain -> nodes of the gang's shape it holds;
    None = could not be read). ``required`` and no domain large enough is SHORT (the gang can never start);
    ``preferred`` is FITS either way (the gang then spans domains); for ``required``, no labelled node at all is
    UNKNOWN, never FITS."""
    if topology == "none":
        return DomainFit(Verdict.FITS, "topology not asked (topology='none')")
    if sizes is None or not sizes:
        why = (f"the nodes' {label} labels could not be read" if sizes is None else f"no node of the gang's shape "
               f"carries {label} yet, so whether a gang of {need} fits one {level} cannot be told before the nodes exist")
        if topology == "preferred":  # the gang runs either way: nothing for preflight to refuse
            return DomainFit(Verdict.FITS, f"{why}; topology='preferred' packs it into one {level} when one can hold it")
        return DomainFit(Verdict.UNKNOWN, why)
    largest = max(sizes.values())
    seen = f"{level} sizes ({label}): {sizes_text(sizes)}"
    if largest >= need:
        return DomainFit(Verdict.FITS, f"a gang of {need} nodes fits one {level}; {seen}", dict(sizes))
    if topology == "preferred":
        return DomainFit(Verdict.FITS, f"a gang of {need} nodes fits no single {level} and will span several "
                         f"(topology='preferred'); {seen}", dict(sizes))
    return DomainFit(Verdict.SHORT, f"a gang of {need} nodes fits no single {level} (topology='required'): the "
                     f"largest holds {largest}; {seen}", dict(sizes))


PREFERENCE = {"compact": 0, "best-effort": 1, "": 2, "spread": 3}  # PoolState.placement -> order for a preferred gang


def placement_pools(placements: Mapping[str, str], topology: str, level: str) -> tuple[list[str], str]:
    """The pools (name -> ``PoolState.placement``: "compact" | "best-effort" | "spread" | "") a gang takes new nodes
    from, and a refusal ("" = none). ``required`` at the compact level takes only the compact pools when there are
    any, else the best-effort compact ones (their nodes share a block while it has room); a ``required`` gang whose
    every pool spreads its nodes is refused (its nodes would land in several domains and the gang could never
    start); ``preferred``: every pool, those that keep their nodes together first (compact, then best-effort, then
    unknown, then spread), so a gang fills a compact pool before it spills. Pools keep the order given (the
    caller's priority, e.g. ``target.pools``) within each kind, and for ``none``."""
    names = list(placements)
    if topology == "preferred":
        return sorted(names, key=lambda n: PREFERENCE.get(placements[n], len(PREFERENCE))), ""
    if topology != "required":
        return names, ""
    for kind in ("compact", "best-effort"):
        held = [n for n in names if placements[n] == kind]
        if held and level == COMPACT_LEVEL:
            return held, ""
    if names and all(placements[n] == "spread" for n in names):
        return [], (f"no matching pool keeps its new nodes in one {level}: {', '.join(names)} "
                    f"{'launches' if len(names) == 1 else 'launch'} them without a cluster placement group, "
                    "and the cloud spreads them")
    return names, ""


@dataclass(frozen=True)
class PoolReach:
    """What a matching pool may add, for preflight: its ``placement`` (``PoolState.placement``), the nodes it may still
    add, and the ``level`` domain its existing nodes hold ("" = none yet: a compact pool then starts a new one)."""

    name: str
    placement: str
    headroom: int
    domain: str = ""
    group: str = ""  # the placement group or policy, for the row's text


def _compact_reach(pools: Sequence[PoolReach], sizes: Mapping[str, int]) -> list[tuple[int, PoolReach]]:
    """(nodes one domain can hold once the pool has grown, pool) for the compact pools, largest first."""
    out = [((sizes.get(p.domain, 0) if p.domain else 0) + p.headroom, p)
           for p in pools if p.placement == "compact" and p.headroom > 0]
    return sorted(out, key=lambda np: (-np[0], np[1].name))


def _with_pools(f: DomainFit, need: int, sizes: Mapping[str, int], pools: Sequence[PoolReach], *, level: str,
                largest: int) -> ClusterCheck | None:
    """The row when the existing nodes do not hold a required gang, reasoning about what the pools would add;
    None when the pools say nothing beyond the existing nodes (no headroom)."""
    growing = [p for p in pools if p.headroom > 0]
    if not growing:
        return None
    reach = _compact_reach(growing, sizes) if level == COMPACT_LEVEL else []
    if reach and reach[0][0] >= need:
        n, p = reach[0]
        where = f"its {level} {p.domain} (now {sizes.get(p.domain, 0)} Ready)" if p.domain else f"one new {level}"
        return ClusterCheck(CHECK_NAME, Verdict.FITS, f"{f.reason}; pool {p.name} can add {p.headroom} node(s) into "
                            f"{where}: {n} >= {need}. Assumed: a compact pool ({p.group or 'compact placement'}) puts "
                            f"all its nodes in one {level} and the cloud has stock there", float(need), float(n))
    if all(p.placement == "spread" for p in growing):
        names = ", ".join(sorted(p.name for p in growing))
        return ClusterCheck(CHECK_NAME, Verdict.SHORT, f"{f.reason}; the nodes pools {names} would add come without a "
                            "cluster placement group, and the cloud spreads them", float(need), float(largest),
                            f"{PLACEMENT_FIX}, or use topology='preferred'")
    unknown = sorted(p.name for p in growing if p.placement != "compact" or level != COMPACT_LEVEL)
    best = f"; the compact pools reach at most {reach[0][0]}" if reach else ""
    loose = sorted(p.name for p in growing if p.placement == "best-effort")
    if loose:  # GKE COMPACT without a max distance: close while the block has room, elsewhere after
        best += (f"; the compact placement of {', '.join(loose)} is best effort (no max distance: once a pool's "
                 f"{level} is full, the cloud puts its new nodes in another)")
    if not unknown:
        return ClusterCheck(CHECK_NAME, Verdict.SHORT, f"{f.reason}{best} (one {level} each)", float(need),
                            float(max(largest, reach[0][0] if reach else 0)),
                            f"raise the compact pools' max size or {PLACEMENT_FIX}")
    return ClusterCheck(CHECK_NAME, Verdict.UNKNOWN, f"{f.reason}{best}; pools {', '.join(unknown)} may add "
                        f"{sum(p.headroom for p in growing if p.name in unknown)} node(s) with no placement guarantee "
                        f"at the {level} level: where they land is the cloud's choice", float(need), float(largest))


def preflight_check(need: int, sizes: Mapping[str, int] | None, *, topology: str, level: str, label: str,
                    headroom: int | None, pools: Sequence[PoolReach] | None = None) -> ClusterCheck:
    """Preflight's topology row. ``sizes`` counts the Ready nodes of the gang's shape per domain; ``headroom`` is how
    many more nodes the matching pools may still add (None = unknown); ``pools`` says how each would place them
    (None = unknown). A required gang no existing domain holds fits when a compact pool can grow one domain to hold
    it (the row names that assumption), is refused when no pool can add a node or every pool spreads its nodes,
    and is UNKNOWN (never ok) when the new nodes land where the cloud puts them."""
    f = fit(need, sizes, topology=topology, level=level, label=label)
    largest = max(sizes.values(), default=0) if sizes else 0
    if topology == "required" and f.verdict is not Verdict.FITS and sizes is not None and pools is not None:
        row = _with_pools(f, need, sizes, pools, level=level, largest=largest)
        if row is not None:
            return row
    if f.verdict is Verdict.SHORT and headroom != 0:
        more = "an unknown number of" if headroom is None else f"up to {headroom}"
        return ClusterCheck(CHECK_NAME, Verdict.UNKNOWN, f"{f.reason}; {more} more node(s) may come from pool "
                            "headroom, and where they land is the cloud's choice", float(need), float(largest))
    fix = "" if f.verdict is not Verdict.SHORT else (
        f"ask for at most {largest} nodes, use topology='preferred', a wider topology_level, or capacity whose "
        f"{level} holds {need} nodes (a compact placement pool or a reservation block)")
    return ClusterCheck(CHECK_NAME, f.verdict, f.reason, float(need), float(largest) if sizes else None, fix)


def kueue_topology(name: str, levels: Sequence[str], version: str = "v1beta2") -> dict[str, object]:
    """The Kueue ``Topology`` an admin creates for TAS: ``levels`` widest first (a scheme's block, subblock, host
    labels), ending with ``kubernetes.io/hostname`` so Kueue assigns each pod its node
    (https://kueue.sigs.k8s.io/docs/concepts/topology_aware_scheduling/). A ResourceFlavor names it in
    ``spec.topologyName``."""
    keys = list(dict.fromkeys([*levels, "kubernetes.io/hostname"]))
    return {"apiVersion": f"kueue.x-k8s.io/{version}", "kind": "Topology", "metadata": {"name": name},
            "spec": {"levels": [{"nodeLabel": k} for k in keys]}}
