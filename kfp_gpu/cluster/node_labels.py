"""How each kind of node says where it came from: the label keys of a node flavour (a *scheme*).

Placement is written once, against a scheme, so no caller hard-codes a cloud's labels: the job, the balloons, the
claims and the ProvisioningRequest's pod template select nodes through the scheme of the capacity the backend
obtained.

- ``gke``: GKE node pools (``cloud.google.com/gke-nodepool``), the accelerator label GKE puts on GPU nodes
  (``cloud.google.com/gke-accelerator``), spot as ``cloud.google.com/gke-spot=true``.
  https://cloud.google.com/kubernetes-engine/docs/how-to/gpus
- ``eks``: EKS managed node groups (``eks.amazonaws.com/nodegroup``, ``eks.amazonaws.com/capacityType`` =
  ``ON_DEMAND`` | ``SPOT``); EKS puts no accelerator label on nodes, so the accelerator is the set of EC2 instance
  types that carry it (``node.kubernetes.io/instance-type``).
  https://docs.aws.amazon.com/eks/latest/userguide/managed-node-groups.html
- ``karpenter``: Karpenter NodePools (``karpenter.sh/nodepool``, ``karpenter.sh/capacity-type`` = ``spot`` |
  ``on-demand`` | ``reserved``), accelerator by instance type as for EKS.
  https://karpenter.sh/docs/concepts/scheduling/#well-known-labels

All schemes share ``topology.kubernetes.io/zone`` and ``node.kubernetes.io/instance-type``.

Network topology (``Scheme.topology``: the label of each level, block -> subblock -> host):

- GKE labels nodes ``cloud.google.com/gce-topology-block``, ``-subblock`` and ``-host`` (the VM's physical
  placement) https://cloud.google.com/ai-hypercomputer/docs/workloads/schedule-gke-workloads-tas
- EKS labels nodes ``topology.k8s.aws/network-node-layer-1`` (top) to ``-3`` (the bottom layer, the nodes closest to
  each other) https://docs.aws.amazon.com/eks/latest/userguide/ml-workload-topology.html ; kfp-gpu's block is layer 2,
  its subblock layer 3, and a host is the node itself (``kubernetes.io/hostname``: one instance per host).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kfp_gpu import accelerators

ZONE = "topology.kubernetes.io/zone"
INSTANCE_TYPE = "node.kubernetes.io/instance-type"


@dataclass(frozen=True)
class Scheme:
    name: str
    pool: str  # the label naming a node's pool / node group / NodePool
    capacity_type: str  # the label saying spot or on-demand
    spot_value: str
    on_demand_value: str
    accelerator: str = ""  # a label whose value names the accelerator; "" = select by instance type
    topology: tuple[str, str, str] = ("", "", "")  # the label of a block, a subblock, a host (module docstring)

    def topology_label(self, level: str) -> str:
        """The node label whose value names the node's ``level`` domain ("block", "subblock" or "host")."""
        return self.topology[("block", "subblock", "host").index(level)]

    def accelerator_selector(self, accelerator: str) -> dict[str, str]:
        """A nodeSelector for the accelerator when one label names it (GKE), else {} (see
        :meth:`accelerator_requirements`). Raises: InvalidSpec for an unknown accelerator."""
        if not self.accelerator:
            return {}
        return {self.accelerator: accelerators.get(accelerator).gke_label}

    def accelerator_requirements(self, accelerator: str) -> list[dict[str, Any]]:
        """matchExpressions selecting the accelerator's instance types, for schemes without an accelerator label.
        Raises: InvalidSpec for an unknown accelerator."""
        if self.accelerator:
            return []
        types = sorted({m.name for m in accelerators.get(accelerator).aws_instances})
        return [{"key": INSTANCE_TYPE, "operator": "In", "values": types}] if types else []

    def pool_requirement(self, pools: Sequence[str]) -> dict[str, Any]:
        return {"key": self.pool, "operator": "In", "values": list(pools)}

    def capacity_type_value(self, spot: bool) -> str:
        return self.spot_value if spot else self.on_demand_value


HOSTNAME = "kubernetes.io/hostname"
GKE_TOPOLOGY = ("cloud.google.com/gce-topology-block", "cloud.google.com/gce-topology-subblock",
                "cloud.google.com/gce-topology-host")
AWS_TOPOLOGY = ("topology.k8s.aws/network-node-layer-2", "topology.k8s.aws/network-node-layer-3", HOSTNAME)
GKE = Scheme("gke", "cloud.google.com/gke-nodepool", "cloud.google.com/gke-spot", "true", "false",
             accelerator="cloud.google.com/gke-accelerator", topology=GKE_TOPOLOGY)
EKS = Scheme("eks", "eks.amazonaws.com/nodegroup", "eks.amazonaws.com/capacityType", "SPOT", "ON_DEMAND",
             topology=AWS_TOPOLOGY)
KARPENTER = Scheme("karpenter", "karpenter.sh/nodepool", "karpenter.sh/capacity-type", "spot", "on-demand",
                   topology=AWS_TOPOLOGY)
SCHEMES: dict[str, Scheme] = {s.name: s for s in (GKE, EKS, KARPENTER)}
POOL_KEYS: tuple[str, ...] = tuple(s.pool for s in SCHEMES.values())


def for_target(kind: str) -> Scheme:
    """The scheme of a target kind's nodes (``spec.target.kind`` value): EKS for "eks", else GKE (the local
    stand-in labels its nodes as GKE does)."""
    return EKS if kind == "eks" else GKE


def get(name: str) -> Scheme:
    """The scheme called ``name``; "" means GKE (capacities written before schemes existed).

    Raises: KeyError naming the known schemes.
    """
    try:
        return SCHEMES[name or "gke"]
    except KeyError:
        raise KeyError(f"unknown node label scheme {name!r}: one of {', '.join(SCHEMES)}") from None


def pool_of(labels: Mapping[str, str]) -> str:
    """The pool a node belongs to, under whichever scheme labelled it ("" if none)."""
    for key in POOL_KEYS:
        if labels.get(key):
            return str(labels[key])
    return ""
