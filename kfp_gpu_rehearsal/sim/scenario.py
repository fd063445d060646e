"""The stand-in's world as a validated YAML scenario.

A scenario names one project and one GKE cluster, the regions/zones it may use, the GPU node
pools (one zone each), quota limits and usage, boot-latency distributions, stockout windows,
injected API faults, preemption events (:mod:`kfp_gpu_rehearsal.sim.eventspec`), a simulated API round-trip
time, and the world's timing
(:mod:`kfp_gpu_rehearsal.sim.worldspec`: operations, device plugin, MIG retries, preemption notice; durations in
real-world seconds, compressed by :data:`kfp_gpu_rehearsal.devcluster.worldtime.TIME_SCALE`). Every validation
failure is an :class:`~kfp_gpu.errors.InvalidSpec` naming the offending field, e.g.
``pools[2].boot.median_s``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from kfp_gpu import accelerators
from kfp_gpu.errors import InvalidSpec, yaml_problem
from kfp_gpu_rehearsal.sim.dwsspec import DwsSpec, Revocation, parse_dws, parse_queued, parse_revocations
from kfp_gpu_rehearsal.sim.eventspec import (
    ApiSpec,
    Fault,
    PreemptionEvent,
    Stockout,
    parse_api,
    parse_faults,
    parse_preemptions,
    parse_stockouts,
)
from kfp_gpu_rehearsal.sim.gpufaultspec import GpuFaults, parse_gpu_faults
from kfp_gpu_rehearsal.sim.topology import TopologySpec, parse_max_distance, parse_placement, parse_topology
from kfp_gpu_rehearsal.sim.trainingspec import TrainingSpec, parse_training
from kfp_gpu_rehearsal.sim.worldspec import (  # noqa: F401 - BootLatency, Operations re-exported
    Autoscaling,
    BootLatency,
    Operations,
    ReservationAffinity,
    ReservationSpec,
    World,
    parse_affinity,
    parse_autoscaling,
    parse_boot,
    parse_reservations,
    parse_world,
)
from kfp_gpu_rehearsal.sim.worldspec import listing as _list
from kfp_gpu_rehearsal.sim.worldspec import num as _num
from kfp_gpu_rehearsal.sim.worldspec import obj as _obj

_ZONE_RE = re.compile(r"^([a-z]+-[a-z]+\d+)-[a-z]$")
_NAME_RE = re.compile(r"^[a-z]([-a-z0-9]{0,38}[a-z0-9])?$")


@dataclass(frozen=True)
class PoolSpec:
    name: str
    zone: str
    accelerator: str  # catalog name
    gpus_per_node: int = 8
    spot: bool = False
    max_nodes: int = 16
    initial_size: int = 0
    machine_type: str = ""  # derived from the catalog when empty
    boot: BootLatency = field(default_factory=BootLatency)
    autoscaling: Autoscaling = field(default_factory=Autoscaling)
    reservation_affinity: ReservationAffinity = field(default_factory=ReservationAffinity)
    queued_provisioning: bool = False  # GKE queuedProvisioning.enabled (flex-start, DWS): ProvisioningRequests only
    placement: str = ""  # GKE placementPolicy.type: "COMPACT" keeps the pool's VMs in one block (kfp_gpu_rehearsal.sim.topology)
    flex_start: bool = False  # flex-start VMs without queued provisioning (a ComputeClass flexStart rule's pools)
    compute_class: str = ""  # the ComputeClass whose rule node auto-provisioning created this pool for (kfp_gpu_rehearsal.sim.computeclass)
    class_rule: int = -1  # that rule's index in the class's priorities
    placement_max_distance: int = 0  # its compact policy's maxDistance (1-3): strict; 0 = none, best effort (topology)

    @property
    def placement_strict(self) -> bool:
        """A compact policy with a max distance: its VMs never leave their block (kfp_gpu_rehearsal.sim.topology)."""
        return self.placement_max_distance > 0

    @property
    def provisioning_model(self) -> str:
        """The Compute Engine provisioning model of the pool's VMs: spot, flex-start or standard."""
        if self.spot:
            return "spot"
        return "flex-start" if self.queued_provisioning or self.flex_start else "standard"

    @property
    def region(self) -> str:
        m = _ZONE_RE.match(self.zone)
        return m.group(1) if m else ""

    @property
    def quota_metric(self) -> str:
        acc = accelerators.get(self.accelerator)
        return acc.gcp_preemptible_metric if self.spot else acc.gcp_quota_metric


@dataclass(frozen=True)
class QuotaSpec:
    limit: float
    usage: float = 0.0  # consumed by things outside the simulated cluster


@dataclass(frozen=True)
class RegionSpec:
    name: str
    zones: tuple[str, ...]
    quotas: dict[str, QuotaSpec] = field(default_factory=dict)  # Compute regional metrics
    gpu_families: dict[str, float] = field(default_factory=dict)  # Cloud Quotas gpu_family -> limit


@dataclass(frozen=True)
class Scenario:
    project: str = "local-project"
    cluster: str = "kfp-gpu-local"
    regions: dict[str, RegionSpec] = field(default_factory=dict)
    global_quotas: dict[str, QuotaSpec] = field(default_factory=dict)
    pools: tuple[PoolSpec, ...] = ()
    stockouts: tuple[Stockout, ...] = ()
    faults: tuple[Fault, ...] = ()
    preemptions: tuple[PreemptionEvent, ...] = ()
    api_latency_ms: float = 0.0
    node_create_workers: int = 32
    api: ApiSpec = field(default_factory=ApiSpec)
    world: World = field(default_factory=World)  # cloud flavour, operation/boot/notice timing
    dws: DwsSpec = field(default_factory=DwsSpec)  # queued provisioning (kfp_gpu_rehearsal.sim.dwsspec)
    provisioning_revocations: tuple[Revocation, ...] = ()
    reservations: tuple[ReservationSpec, ...] = ()  # Compute reservations that exist at the start
    topology: TopologySpec = field(default_factory=TopologySpec)  # blocks, sub-blocks, hosts (kfp_gpu_rehearsal.sim.topology)
    gpu_faults: GpuFaults = field(default_factory=GpuFaults)  # bad GPUs at birth, Xid events (sim.gpufaultspec)
    training: TrainingSpec | None = None  # simulated ranks' progress, hangs and slow ranks (kfp_gpu_rehearsal.sim.trainingspec)

    def pool(self, name: str) -> PoolSpec:
        """Raises: KeyError for an unknown pool."""
        for p in self.pools:
            if p.name == name:
                return p
        raise KeyError(name)


def load(path: str | Path | None = None) -> Scenario:
    """Load and validate a scenario file. ``None`` loads the bundled ``default.yaml``; a bare name
    such as ``"six-regions"`` loads ``kfp_gpu_rehearsal/sim/scenarios/<name>.yaml``.

    Raises:
        InvalidSpec: the file is missing, not YAML, or fails validation (naming the field).
    """
    bundled = resources.files("kfp_gpu_rehearsal.sim").joinpath("scenarios")
    if path is None or (isinstance(path, str) and not Path(path).exists()
                        and bundled.joinpath(f"{path}.yaml").is_file()):
        text = bundled.joinpath(f"{path or 'default'}.yaml").read_text()
    else:
        try:
            text = Path(path).read_text()
        except OSError as exc:
            names = sorted(p.name.removesuffix(".yaml") for p in bundled.iterdir() if p.name.endswith(".yaml"))
            raise InvalidSpec("scenario", str(path), f"cannot be read ({exc.strerror})",
                              remediation=f"give an existing YAML file or a bundled name: {', '.join(names)}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise InvalidSpec("scenario", str(path), f"is not valid YAML ({yaml_problem(exc)})",
                          remediation="fix the YAML at that line (docs/sim.md, Scenario schema)") from None
    return from_dict(data or {})


def from_dict(data: Any) -> Scenario:
    """Build a validated :class:`Scenario` from plain data.

    Raises:
        InvalidSpec: naming the offending field (``pools[1].zone``, ``regions.us-east1.quotas.X``...).
    """
    d = _obj(data, "scenario", {
        "project", "cluster", "regions", "global_quotas", "pools", "stockouts", "faults",
        "preemptions", "api_latency_ms", "node_create_workers", "api",
        "cloud", "device_plugin_s", "mig_retry_s", "preemption", "operations", "reservations",
        "dws", "provisioning_revocations", "topology", "gpu_faults", "training", "image_pull",
    })
    regions = {
        str(name): _region(str(name), r) for name, r in _obj(d.get("regions", {}), "regions").items()
    }
    gq = {str(k): _quota(v, f"global_quotas.{k}") for k, v in _obj(d.get("global_quotas", {}), "global_quotas").items()}
    pools = tuple(_pool(p, f"pools[{i}]", regions) for i, p in enumerate(_list(d.get("pools", []), "pools")))
    names = [p.name for p in pools]
    for n in names:
        if names.count(n) > 1:
            raise InvalidSpec("pools.name", n, "pool names must be unique")
    zones = {z for r in regions.values() for z in r.zones}
    stockouts = parse_stockouts(d.get("stockouts", []), zones)
    faults = parse_faults(d.get("faults", []))
    events = parse_preemptions(d.get("preemptions", []), names)
    sc = Scenario(
        project=str(d.get("project", "local-project")), cluster=str(d.get("cluster", "kfp-gpu-local")),
        regions=regions, global_quotas=gq, pools=pools, stockouts=tuple(stockouts), faults=tuple(faults),
        preemptions=tuple(events), api_latency_ms=_num(d.get("api_latency_ms", 0.0), "api_latency_ms", 0.0),
        node_create_workers=int(_num(d.get("node_create_workers", 32), "node_create_workers", 1)),
        api=parse_api(d.get("api", {})), world=parse_world(d), dws=parse_dws(d.get("dws")),
        provisioning_revocations=parse_revocations(d.get("provisioning_revocations"),
                                                   {p.name: p.queued_provisioning for p in pools}),
        reservations=parse_reservations(d.get("reservations"), zones),
        topology=parse_topology(d.get("topology")),
        gpu_faults=parse_gpu_faults(d.get("gpu_faults"), names),
        training=parse_training(d.get("training")),
    )
    _check_quota_usage(sc)
    return sc


def _region(name: str, data: Any) -> RegionSpec:
    f = f"regions.{name}"
    r = _obj(data, f, {"zones", "quotas", "gpu_families"})
    zones = tuple(str(z) for z in _list(r.get("zones", []), f"{f}.zones"))
    for z in zones:
        m = _ZONE_RE.match(z)
        if not m or m.group(1) != name:
            raise InvalidSpec(f"{f}.zones", z, f"must be a zone of region {name} (e.g. {name}-a)")
    quotas = {str(k): _quota(v, f"{f}.quotas.{k}") for k, v in _obj(r.get("quotas", {}), f"{f}.quotas").items()}
    fams = {
        str(k): _num(v, f"{f}.gpu_families.{k}", 0.0)
        for k, v in _obj(r.get("gpu_families", {}), f"{f}.gpu_families").items()
    }
    return RegionSpec(name, zones, quotas, fams)


def _quota(data: Any, f: str) -> QuotaSpec:
    if isinstance(data, (int, float)) and not isinstance(data, bool):
        return QuotaSpec(_num(data, f"{f}.limit", 0.0))
    q = _obj(data, f, {"limit", "usage"})
    limit = _num(q.get("limit"), f"{f}.limit", 0.0)
    usage = _num(q.get("usage", 0.0), f"{f}.usage", 0.0)
    if usage > limit:
        raise InvalidSpec(f"{f}.limit", limit, f"quota limit is below its usage ({usage:g})")
    return QuotaSpec(limit, usage)


def _pool(data: Any, f: str, regions: dict[str, RegionSpec]) -> PoolSpec:
    p = _obj(data, f, {
        "name", "zone", "accelerator", "gpus_per_node", "spot", "max_nodes", "initial_size",
        "machine_type", "boot", "autoscaling", "reservation_affinity",
        "queued_provisioning", "placement_policy", "placement_max_distance",
    })
    name = str(p.get("name", ""))
    if not _NAME_RE.match(name):
        raise InvalidSpec(f"{f}.name", name, "must be a lowercase RFC 1035 label of at most 40 chars")
    zone = str(p.get("zone", ""))
    known = sorted(z for r in regions.values() for z in r.zones)
    if zone not in known:
        raise InvalidSpec(f"{f}.zone", zone, f"unknown zone; the scenario's regions have {known}")
    try:
        acc = accelerators.get(str(p.get("accelerator", "")))
    except InvalidSpec as exc:
        raise InvalidSpec(f"{f}.accelerator", p.get("accelerator"), exc.fields["allowed"]) from None
    gpus = int(_num(p.get("gpus_per_node", 8), f"{f}.gpus_per_node", 1))
    try:
        machine = acc.gce_machine_for(gpus).name
    except InvalidSpec as exc:
        raise InvalidSpec(f"{f}.gpus_per_node", gpus, exc.fields["allowed"]) from None
    max_nodes = int(_num(p.get("max_nodes", 16), f"{f}.max_nodes", 0))
    initial = int(_num(p.get("initial_size", 0), f"{f}.initial_size", 0))
    if initial > max_nodes:
        raise InvalidSpec(f"{f}.initial_size", initial, f"must be <= max_nodes ({max_nodes})")
    autoscaling = parse_autoscaling(p.get("autoscaling"), f"{f}.autoscaling", max_nodes)
    queued = parse_queued(p.get("queued_provisioning"), f"{f}.queued_provisioning")
    if queued and not autoscaling.enabled:  # gcloud ... --enable-queued-provisioning --enable-autoscaling
        raise InvalidSpec(f"{f}.autoscaling", p.get("autoscaling"),
                          "a queued-provisioning pool needs autoscaling: {enabled: true} (GKE requires it)")
    if queued and initial:  # GKE: --num-nodes=0; nodes come only through ProvisioningRequests
        raise InvalidSpec(f"{f}.initial_size", initial, "must be 0 for a queued-provisioning pool")
    placement = parse_placement(p.get("placement_policy"), f"{f}.placement_policy")
    return PoolSpec(
        name, zone, acc.name, gpus, bool(p.get("spot", False)), max_nodes, initial,
        str(p.get("machine_type") or machine), parse_boot(p.get("boot"), f"{f}.boot", acc.name, name),
        autoscaling, parse_affinity(p.get("reservation_affinity"), f"{f}.reservation_affinity"), queued,
        placement, placement_max_distance=parse_max_distance(p.get("placement_max_distance"),
                                                             f"{f}.placement_max_distance", placement),
    )


def _check_quota_usage(sc: Scenario) -> None:
    """Initial pool sizes (their GPUs, and vCPUs for CPU metrics) must fit into the quotas the scenario declares."""
    from kfp_gpu_rehearsal.sim import vmquota  # it imports this module

    for rname, region in sc.regions.items():
        for metric, q in region.quotas.items():
            gpus = sum(p.initial_size * p.gpus_per_node for p in sc.pools if p.region == rname and p.quota_metric == metric)
            vcpus = sum(p.initial_size * vmquota.vcpus(p) for p in sc.pools
                        if p.region == rname and metric in vmquota.cpu_metrics(p, region))
            used = q.usage + gpus + vcpus
            if used > q.limit:
                unit = "vCPUs" if vcpus else "GPUs"
                raise InvalidSpec(
                    f"regions.{rname}.quotas.{metric}.limit", q.limit,
                    f"below the usage of the initial pool sizes ({used:g} {unit})",
                )
    for metric, q in sc.global_quotas.items():
        if metric == accelerators.GCP_ALL_REGIONS_METRIC:
            used = q.usage + sum(p.initial_size * p.gpus_per_node for p in sc.pools)
            if used > q.limit:
                raise InvalidSpec(f"global_quotas.{metric}.limit", q.limit, f"below initial usage ({used:g} GPUs)")
