"""The AWS stand-in's world description: one EKS cluster, its managed node groups, quotas, stockouts,
Spot interruptions, API throttling and timings. Durations are real-world seconds (compressed by
:data:`kfp_gpu_rehearsal.devcluster.worldtime.TIME_SCALE`). See docs/sim.md, "AWS stand-in".
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kfp_gpu import accelerators
from kfp_gpu.errors import InvalidSpec
from kfp_gpu_rehearsal.sim.topology import TopologySpec, parse_topology
from kfp_gpu_rehearsal.sim.worldspec import BootLatency, PullSpec, parse_pull

GPU_TAINT = {"key": "nvidia.com/gpu", "value": "true", "effect": "NO_SCHEDULE"}  # EKS API taint shape
ALWAYS = 1e18


def instance_shapes() -> dict[str, tuple[str, accelerators.MachineShape]]:
    """instance type -> (catalog accelerator, shape) for every GPU instance type the catalog knows."""
    out: dict[str, tuple[str, accelerators.MachineShape]] = {}
    for name in accelerators.names():
        for shape in accelerators.get(name).aws_instances:
            out[shape.name] = (name, shape)
    return out


@dataclass(frozen=True)
class NodegroupSpec:
    name: str
    instance_type: str
    zone: str
    capacity_type: str = "ON_DEMAND"  # ON_DEMAND | SPOT
    min_size: int = 0
    max_size: int = 8
    desired_size: int = 0
    taints: tuple[dict[str, str], ...] = (GPU_TAINT,)
    labels: dict[str, str] = field(default_factory=dict)
    autoscaler_tag: bool = False  # k8s.io/cluster-autoscaler/enabled on its ASG
    boot: BootLatency | None = None  # None: lognormal, median 240 s (p4d/p5 class), sigma 0.45, floor 90 s
    placement_group: str = ""  # its launch template's Placement.GroupName: a cluster placement group


@dataclass(frozen=True)
class Stockout:
    zone: str
    instance_type: str = ""  # "" = every type
    capacity_type: str = ""  # "" = both
    start_s: float = 0.0
    end_s: float = ALWAYS

    def active(self, t: float, zone: str, itype: str, ctype: str) -> bool:
        return (self.zone == zone and self.instance_type in ("", itype) and self.capacity_type in ("", ctype)
                and self.start_s <= t < self.end_s)


@dataclass(frozen=True)
class Interruption:
    at_s: float
    nodegroup: str
    count: int = 1


@dataclass(frozen=True)
class Throttle:
    """A token bucket per (service, API action): ``burst`` tokens, ``refill_per_s`` tokens per real-world second
    (so per compressed second here); read = Describe*/List*/Get*, write = the rest. 0 burst = unlimited.
    Defaults: EC2's documented DescribeHosts bucket (100, 20/s) for reads; 50, 5/s for writes (an assumption)."""

    read_burst: int = 100
    read_refill_per_s: float = 20.0
    write_burst: int = 50
    write_refill_per_s: float = 5.0


@dataclass(frozen=True)
class AwsScenario:
    account: str = "123456789012"
    region: str = "us-east-1"
    cluster: str = "kfp-gpu-eks"
    zones: tuple[str, ...] = ("us-east-1a", "us-east-1b")
    nodegroups: tuple[NodegroupSpec, ...] = ()
    quotas: dict[str, float] = field(default_factory=dict)  # applied Service Quotas values (vCPUs) by code
    stockouts: tuple[Stockout, ...] = ()
    interruptions: tuple[Interruption, ...] = ()
    throttle: Throttle = Throttle()
    update_s: float = 40.0  # EKS UpdateNodegroupConfig: InProgress -> Successful
    launch_retry_s: float = 60.0  # the ASG retries a failed launch this often
    terminate_s: float = 45.0  # shutting-down -> terminated (drain + EC2 shutdown)
    device_plugin_s: float = 60.0  # Node registered -> nvidia.com/gpu allocatable
    notice_s: float = 120.0  # Spot interruption notice -> termination
    api_latency_ms: float = 0.0
    topology: TopologySpec = TopologySpec()  # the network's layer-2 / layer-3 sizes (kfp_gpu_rehearsal.sim.topology)
    image_pull: PullSpec = PullSpec()  # the kubelet's pull on a fresh node (docs/sim.md rule 2b; no image streaming)

    def nodegroup(self, name: str) -> NodegroupSpec | None:
        return next((g for g in self.nodegroups if g.name == name), None)


DEFAULT_QUOTAS = {accelerators.AWS_QUOTA_P_ON_DEMAND: 0.0, accelerators.AWS_QUOTA_P_SPOT: 0.0,
                  accelerators.AWS_QUOTA_G_ON_DEMAND: 0.0, accelerators.AWS_QUOTA_G_SPOT: 0.0}
"""AWS's default values for new accounts (GPU families start at 0 vCPUs; an increase is needed)."""


def default() -> AwsScenario:
    """Two AZs of us-east-1, p4d.24xlarge on-demand and Spot node groups per AZ, 1,152 P vCPUs each way."""
    groups = tuple(
        NodegroupSpec(f"p4d-{ct.lower().replace('_', '')}-{z[-1]}", "p4d.24xlarge", z, ct, max_size=8)
        for ct in ("ON_DEMAND", "SPOT") for z in ("us-east-1a", "us-east-1b"))
    return AwsScenario(nodegroups=groups, quotas={accelerators.AWS_QUOTA_P_ON_DEMAND: 1152.0,
                                                  accelerators.AWS_QUOTA_P_SPOT: 1152.0})


def _build(cls: type[Any], raw: Any, where: str) -> Any:
    if not isinstance(raw, dict):
        raise InvalidSpec(where, raw, "must be a mapping")
    names = {f.name for f in dataclasses.fields(cls)}
    for k in raw:
        if k not in names:
            raise InvalidSpec(f"{where}.{k}", raw[k], f"unknown key; known: {', '.join(sorted(names))}")
    return raw


def from_dict(raw: dict[str, Any]) -> AwsScenario:
    """Validate a scenario mapping. Raises: InvalidSpec naming the field."""
    raw = dict(_build(AwsScenario, raw, "aws_scenario"))
    shapes = instance_shapes()
    zones = tuple(raw.get("zones", AwsScenario.zones))
    groups = []
    for i, g in enumerate(raw.pop("nodegroups", [])):
        g = dict(_build(NodegroupSpec, g, f"nodegroups[{i}]"))
        if g.get("instance_type") not in shapes:
            raise InvalidSpec(f"nodegroups[{i}].instance_type", g.get("instance_type"),
                              f"not a GPU instance type of the catalog: {', '.join(sorted(shapes))}")
        if g.get("zone") not in zones:
            raise InvalidSpec(f"nodegroups[{i}].zone", g.get("zone"), f"must be one of {', '.join(zones)}")
        if g.get("capacity_type", "ON_DEMAND") not in ("ON_DEMAND", "SPOT"):
            raise InvalidSpec(f"nodegroups[{i}].capacity_type", g.get("capacity_type"), "must be ON_DEMAND or SPOT")
        if "boot" in g:
            g["boot"] = BootLatency(**_build(BootLatency, g["boot"], f"nodegroups[{i}].boot"))
        if "taints" in g:
            g["taints"] = tuple(dict(t) for t in g["taints"])
        groups.append(NodegroupSpec(**g))
    stock = tuple(Stockout(**_build(Stockout, s, f"stockouts[{i}]")) for i, s in enumerate(raw.pop("stockouts", [])))
    ints = tuple(Interruption(**_build(Interruption, s, f"interruptions[{i}]"))
                 for i, s in enumerate(raw.pop("interruptions", [])))
    throttle = Throttle(**_build(Throttle, raw.pop("throttle", {}), "throttle"))
    raw["topology"] = parse_topology(raw.get("topology"))
    raw["image_pull"] = parse_pull(raw.get("image_pull"), streaming=False)
    for k in ("update_s", "launch_retry_s", "terminate_s", "device_plugin_s", "notice_s", "api_latency_ms"):
        if k in raw and float(raw[k]) < 0:
            raise InvalidSpec(k, raw[k], "must be >= 0")
    raw["zones"] = zones
    return AwsScenario(nodegroups=tuple(groups), stockouts=stock, interruptions=ints, throttle=throttle, **raw)


def load(source: AwsScenario | str | Path | dict[str, Any] | None) -> AwsScenario:
    """A scenario from an object, a mapping, a YAML path, or None (:func:`default`).

    Raises: InvalidSpec (bad field), OSError (unreadable file).
    """
    if source is None:
        return default()
    if isinstance(source, AwsScenario):
        return source
    if isinstance(source, dict):
        return from_dict(source)
    import yaml

    return from_dict(yaml.safe_load(Path(source).read_text()) or {})
