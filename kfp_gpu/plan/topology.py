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
* Preflight: :func:`fit` says whether a gang fits one domain, naming the domain sizes it saw.
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


def preflight_check(need: int, sizes: Mapping[str, int] | None, *, topology: str, level: str, label: str,
                    headroom: int | None) -> ClusterCheck:
    """Preflight's topology row. ``sizes`` counts the Ready nodes of the gang's shape per domain; ``headroom`` is how
    many more nodes the matching pools may still add (None = unknown). Nodes a scale-up adds land where the cloud
    puts them, so a required gang no existing domain holds is refused only when no pool can add a node; otherwise
    the row is UNKNOWN (never ok)."""
    f = fit(need, sizes, topology=topology, level=level, label=label)
    largest = max(sizes.values(), default=0) if sizes else 0
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
