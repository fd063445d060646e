"""The capacity a scale-up produced: the contract between burst_scale_up and train_pytorchjob (also used by
kfp_gpu.cluster.pytorchjob, hence here and not in kfp_gpu.steps)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from kfp_gpu.cluster import node_labels
from kfp_gpu.cluster.nodes import run_toleration
from kfp_gpu.errors import InvalidSpec

GPU_TAINT_KEY = "nvidia.com/gpu"


def parse_toleration(text: str) -> dict[str, str]:
    """``"key=value:Effect"`` / ``"key:Effect"`` / ``"key"`` (spec.target.tolerations) as a pod toleration;
    the effect defaults to NoSchedule."""
    rest, _, effect = text.partition(":")
    key, eq, value = rest.partition("=")
    out = {"key": key, "operator": "Equal" if eq else "Exists", "effect": effect or "NoSchedule"}
    if eq:
        out["value"] = value
    return out


@dataclass(frozen=True)
class Placement:
    pool: str
    zone: str
    nodes: tuple[str, ...]  # Node names Ready for this run in that pool/zone


@dataclass(frozen=True)
class Capacity:
    run_id: str
    placements: tuple[Placement, ...]
    gpus_per_node: int
    accelerator_label: str  # the catalog's GKE accelerator label value (kept for old capacities; see accelerator)
    spot: bool
    timeline_json: str = ""  # kfp_gpu.timeline.Timeline JSON
    extra: dict[str, Any] = field(default_factory=dict)
    scheme: str = "gke"  # the node label scheme of the nodes (kfp_gpu.cluster.node_labels): gke | eks | karpenter
    accelerator: str = ""  # the catalog name (kfp_gpu.accelerators); "" in capacities written before it existed
    # the run's spec.target.namespace: its claim taint (kfp_gpu.cluster.nodes.run_taint) names it. "default" (the
    # spec's default) in capacities written before it existed; the train step sets its own namespace anyway
    namespace: str = "default"

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(n for p in self.placements for n in p.nodes)

    @property
    def pools(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(p.pool for p in self.placements))

    @property
    def labels(self) -> node_labels.Scheme:
        return node_labels.get(self.scheme)

    def node_selector(self) -> dict[str, str]:
        """Pin the job to the provisioned pool (single-pool gangs) or at least the accelerator, in the label keys of
        the capacity's scheme (no cloud's keys hard-coded). A capacity whose gang forms later (no placements yet:
        Kueue provisions it at admission) keeps the spec's own single pool and zone (``extra["pools"]``,
        ``extra["zones"]``), so the autoscaler provisions where the spec says. Schemes without an accelerator label
        (EKS, Karpenter) select the accelerator by instance type: :meth:`node_requirements`."""
        sch = self.labels
        fixed = {str(k): str(v) for k, v in (self.extra.get("node_selector") or {}).items()}  # e.g. a ComputeClass
        if fixed:
            return {**fixed, **self._node_selector(sch)}
        return self._node_selector(sch)

    def _node_selector(self, sch: node_labels.Scheme) -> dict[str, str]:
        if len(self.pools) == 1:
            return {sch.pool: self.pools[0]}
        if not self.placements and len(self.extra.get("pools") or []) == 1:
            return {sch.pool: str(self.extra["pools"][0])}
        out = ({sch.accelerator: self.accelerator_label} if sch.accelerator and not self.accelerator
               else sch.accelerator_selector(self.accelerator) if self.accelerator else {})
        if not self.placements and len(self.extra.get("zones") or []) == 1:
            out[node_labels.ZONE] = str(self.extra["zones"][0])
        return out

    def node_requirements(self) -> list[dict[str, Any]]:
        """Node selector requirements (matchExpressions) the job's pods also need, ANDed with every term of their
        node affinity: the accelerator's instance types under schemes without an accelerator label, when the
        selector does not already name one pool."""
        if len(self.pools) == 1 or not self.accelerator:
            return []
        if not self.placements and len(self.extra.get("pools") or []) == 1:
            return []
        return self.labels.accelerator_requirements(self.accelerator)

    def tolerations(self) -> list[dict[str, str]]:
        """The GPU taint and this run's own claim taint (kfp_gpu.cluster.nodes.run_taint, keyed by
        :attr:`namespace`): the run's pods land on the nodes it claimed, and only there among claimed nodes."""
        extra = [parse_toleration(t) for t in self.extra.get("tolerations", [])]
        return [{"key": GPU_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}, *extra,
                run_toleration(self.run_id, self.namespace)]

    def to_json(self) -> str:
        return json.dumps({
            "run_id": self.run_id,
            "placements": [{"pool": p.pool, "zone": p.zone, "nodes": list(p.nodes)} for p in self.placements],
            "gpus_per_node": self.gpus_per_node, "accelerator_label": self.accelerator_label,
            "spot": self.spot, "timeline": self.timeline_json, "extra": self.extra,
            "scheme": self.scheme, "accelerator": self.accelerator, "namespace": self.namespace,
        }, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Capacity:
        """Raises: InvalidSpec when ``text`` is not a scale-up output."""
        try:
            d = json.loads(text)
            node_labels.get(str(d.get("scheme") or "gke"))
            return cls(
                run_id=str(d["run_id"]),
                placements=tuple(Placement(p["pool"], p["zone"], tuple(p["nodes"])) for p in d["placements"]),
                gpus_per_node=int(d["gpus_per_node"]), accelerator_label=str(d["accelerator_label"]),
                spot=bool(d["spot"]), timeline_json=str(d.get("timeline", "")), extra=dict(d.get("extra", {})),
                scheme=str(d.get("scheme") or "gke"), accelerator=str(d.get("accelerator") or ""),
                namespace=str(d.get("namespace") or "default"),
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise InvalidSpec("capacity_json", (text or "")[:80], f"is not a burst_scale_up output ({exc})") from None
