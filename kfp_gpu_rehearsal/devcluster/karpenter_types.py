"""The instance types the dev cluster's Karpenter (kwok provider) can launch: AWS GPU instances, as on EC2.

The kwok provider reads them from the JSON file passed with ``--instance-types-file-path``
(:func:`instance_types_file`; format of ``sigs.k8s.io/karpenter/kwok/examples/aws_instance_types.json``): per type its
name, ``resources`` (``cpu``, ``memory``, ``nvidia.com/gpu``, ``pods``, ``ephemeral-storage``), architecture and OS, and
its ``offerings``: one per zone and capacity type, each with a price (USD per instance-hour) and requirements.

Shapes (GPUs, vCPUs, memory) are AWS's (docs/local-cluster.md cites the pages): p4d.24xlarge (8x A100 40GB, 96 vCPU,
1152 GiB), p5.48xlarge (8x H100, 192 vCPU, 2048 GiB) and the g6 sizes (NVIDIA L4). Every offering also carries the
labels the AWS provider puts on GPU nodes (``karpenter.k8s.aws/instance-gpu-{name,count,manufacturer}``), so a
NodePool may require a GPU name and count instead of an instance type, as on EKS.

Prices: on-demand is the us-east-1 list price per instance (:data:`ON_DEMAND_USD`, the same in every zone, as on
AWS); spot is on-demand times the catalog's spot/on-demand ratio for that GPU (:mod:`kfp_gpu.accelerators`) times a
per-zone factor (:data:`SPOT_ZONE_FACTOR`: spot prices differ by zone).

Stockouts (:data:`STOCKOUTS`): those offerings are written ``"Available": false``. With ``KWOK_OFFERING_STOCKOUTS=true``
(set by the profile; :mod:`kfp_gpu_rehearsal.devcluster.karpenter` patches the provider to honour it) Karpenter still schedules
onto them, and a launch that allows only out-of-stock offerings fails with an ``InsufficientCapacityError``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kfp_gpu import accelerators

REGION = "us-east-1"
ZONES = ("us-east-1a", "us-east-1b", "us-east-1c")
CAPACITY_TYPES = ("on-demand", "spot")
CAPACITY_TYPE_LABEL = "karpenter.sh/capacity-type"
ZONE_LABEL = "topology.kubernetes.io/zone"
GPU_NAME_LABEL = "karpenter.k8s.aws/instance-gpu-name"
GPU_COUNT_LABEL = "karpenter.k8s.aws/instance-gpu-count"
GPU_MANUFACTURER_LABEL = "karpenter.k8s.aws/instance-gpu-manufacturer"
GPU_RESOURCE = "nvidia.com/gpu"


@dataclass(frozen=True)
class InstanceType:
    name: str
    accelerator: str  # kfp_gpu.accelerators catalog name
    gpu_name: str  # value of karpenter.k8s.aws/instance-gpu-name
    gpus: int
    vcpus: int
    memory_gib: int


INSTANCE_TYPES: tuple[InstanceType, ...] = (
    InstanceType("p4d.24xlarge", "a100-40gb", "a100", 8, 96, 1152),
    InstanceType("p5.48xlarge", "h100-80gb", "h100", 8, 192, 2048),
    InstanceType("g6.xlarge", "l4", "l4", 1, 4, 16),
    InstanceType("g6.2xlarge", "l4", "l4", 1, 8, 32),
    InstanceType("g6.4xlarge", "l4", "l4", 1, 16, 64),
    InstanceType("g6.8xlarge", "l4", "l4", 1, 32, 128),
    InstanceType("g6.16xlarge", "l4", "l4", 1, 64, 256),
    InstanceType("g6.12xlarge", "l4", "l4", 4, 48, 192),
    InstanceType("g6.24xlarge", "l4", "l4", 4, 96, 384),
    InstanceType("g6.48xlarge", "l4", "l4", 8, 192, 768),
)

# us-east-1 on-demand Linux list prices, USD per instance-hour (aws.amazon.com/ec2/pricing/on-demand; approximate,
# as the catalog's, see kfp_gpu.accelerators.PRICE_AS_OF).
ON_DEMAND_USD: dict[str, float] = {
    "p4d.24xlarge": 32.7726,
    "p5.48xlarge": 55.04,
    "g6.xlarge": 0.8048,
    "g6.2xlarge": 0.9776,
    "g6.4xlarge": 1.3232,
    "g6.8xlarge": 2.0144,
    "g6.16xlarge": 3.3968,
    "g6.12xlarge": 4.6016,
    "g6.24xlarge": 6.6752,
    "g6.48xlarge": 13.3504,
}
SPOT_ZONE_FACTOR: dict[str, float] = {"us-east-1a": 1.0, "us-east-1b": 0.93, "us-east-1c": 1.08}

# (instance type, zone, capacity type) out of stock: a launch allowed only these fails with insufficient capacity.
STOCKOUTS: frozenset[tuple[str, str, str]] = frozenset({
    ("p4d.24xlarge", "us-east-1c", "spot"),
    ("p5.48xlarge", "us-east-1a", "spot"),
    ("p5.48xlarge", "us-east-1b", "spot"),
    ("p5.48xlarge", "us-east-1a", "on-demand"),
    ("g6.48xlarge", "us-east-1b", "on-demand"),
})


def get(name: str) -> InstanceType:
    """Raises: KeyError naming the instance types there are."""
    for t in INSTANCE_TYPES:
        if t.name == name:
            return t
    raise KeyError(f"instance type {name!r} is not in the dev cluster's Karpenter catalog: "
                   f"choose from {', '.join(t.name for t in INSTANCE_TYPES)}")


def price(t: InstanceType, zone: str, capacity_type: str) -> float:
    """USD per instance-hour of an offering."""
    od = ON_DEMAND_USD[t.name]
    if capacity_type == "on-demand":
        return od
    p = accelerators.get(t.accelerator).price
    return round(od * p.spot / p.on_demand * SPOT_ZONE_FACTOR[zone], 4)


def in_stock(name: str, zone: str, capacity_type: str) -> bool:
    return (name, zone, capacity_type) not in STOCKOUTS


def _req(key: str, value: str) -> dict[str, Any]:
    return {"key": key, "operator": "In", "values": [value]}


def entry(t: InstanceType) -> dict[str, Any]:
    """One instance type of the kwok provider's file."""
    offerings = [{
        "Price": price(t, zone, ct),
        "Available": in_stock(t.name, zone, ct),
        "Requirements": [_req(CAPACITY_TYPE_LABEL, ct), _req(ZONE_LABEL, zone),
                         _req(GPU_NAME_LABEL, t.gpu_name), _req(GPU_COUNT_LABEL, str(t.gpus)),
                         _req(GPU_MANUFACTURER_LABEL, "nvidia")],
    } for zone in ZONES for ct in CAPACITY_TYPES]
    return {
        "name": t.name,
        "offerings": offerings,
        "architecture": "amd64",
        "operatingSystems": ["linux"],
        "resources": {"cpu": str(t.vcpus), "memory": f"{t.memory_gib}Gi", GPU_RESOURCE: str(t.gpus),
                      "pods": "110", "ephemeral-storage": "100Gi"},
    }


def instance_types() -> list[dict[str, Any]]:
    return [entry(t) for t in INSTANCE_TYPES]


def instance_types_file(path: Path) -> Path:
    """Write the file (only when its content changed: the profile's fingerprint covers it). Returns ``path``."""
    text = json.dumps(instance_types(), indent=1, sort_keys=True) + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists() or path.read_text() != text:
        path.write_text(text)
    return path
