"""Scenario parts that set how the stand-in's world behaves in time (docs/sim.md, "World behaviour").

All durations are **real-world seconds**, compressed by :data:`kfp_gpu_rehearsal.devcluster.worldtime.TIME_SCALE` when the
world runs. Defaults follow the providers' documentation and field reports cited in docs/sim.md.
Also home of the scenario validators (:func:`obj`, :func:`listing`, :func:`num`), shared by
:mod:`kfp_gpu_rehearsal.sim.scenario`.
"""

from __future__ import annotations

import math
import random
import zlib
from dataclasses import dataclass, field
from typing import Any

from kfp_gpu import accelerators
from kfp_gpu.errors import InvalidSpec

# Real-world seconds from the VM create request to its Node registering (VM create + boot + kubelet).
# Median per accelerator; lognormal sigma 0.45 gives the long tail field reports show (p99 ~2.8x median).
BOOT_MEDIAN_S: dict[str, float] = {
    "t4": 150.0, "l4": 150.0, "a100-40gb": 210.0, "a100-80gb": 210.0, "h100-80gb": 270.0, "h200": 300.0,
}
BOOT_SIGMA = 0.45
BOOT_MIN_S = 60.0  # no GPU VM is created, booted and registered in under a minute
NOTICE_S: dict[str, float] = {"gcp": 30.0, "aws": 120.0}  # ACPI soft-off / EC2 spot interruption notice
# From the notice to the kill of a (non-system) pod on the node: GKE's graceful node shutdown gives non-system pods
# shutdownGracePeriod - shutdownGracePeriodCriticalPods = 30 - 15 s; the AWS flavour runs to the instance's end.
POD_GRACE_S: dict[str, float] = {"gcp": 15.0, "aws": 120.0}


@dataclass(frozen=True)
class BootLatency:
    """Real-world seconds from a VM's create request to its Node registering.

    ``dist`` is ``fixed`` or ``lognormal`` (``median_s`` = the median, ``sigma`` = log-space spread).
    """

    dist: str = "fixed"
    median_s: float = 1.0
    sigma: float = 0.0
    seed: int = 0
    min_s: float = 0.0  # floor of a lognormal sample

    def sampler(self) -> random.Random:
        return random.Random(self.seed)

    def sample(self, rng: random.Random) -> float:
        if self.dist == "fixed":
            return self.median_s
        return max(self.min_s, self.median_s * math.exp(rng.gauss(0.0, self.sigma)))


@dataclass(frozen=True)
class Operations:
    """How long GKE/Compute operations take, in real-world seconds: ``pending_s`` PENDING, then
    RUNNING for ``set_size_s`` (nodePools.setSize) or ``delete_instances_s`` (deleteInstances)."""

    pending_s: float = 3.0
    set_size_s: float = 20.0
    delete_instances_s: float = 45.0


@dataclass(frozen=True)
class Autoscaling:
    """A node pool's cluster-autoscaler settings, as nodePools.get reports them (no autoscaler runs)."""

    enabled: bool = False
    min_nodes: int = 0
    max_nodes: int = 0
    total: bool = False  # limits given as totalMin/MaxNodeCount instead of per-zone min/maxNodeCount


AFFINITY_TYPES = {"any": "ANY_RESERVATION", "specific": "SPECIFIC_RESERVATION", "none": "NO_RESERVATION"}
RESERVATION_NAME_KEY = "compute.googleapis.com/reservation-name"


@dataclass(frozen=True)
class ReservationAffinity:
    """A node pool's ``config.reservationAffinity`` (docs/sim.md, "Reservations"). ``consume`` "" = not set:
    GKE renders no affinity and Compute's default, ANY_RESERVATION, applies."""

    consume: str = ""  # "" | "any" | "specific" | "none"
    values: tuple[str, ...] = ()  # reservation names of a "specific" affinity

    @property
    def effective(self) -> str:
        return self.consume or "any"


@dataclass(frozen=True)
class ReservationSpec:
    """A Compute zonal reservation that exists when the world starts. ``in_use``: VMs outside the simulated
    cluster already consume that many of its ``count`` VMs."""

    name: str
    zone: str
    accelerator: str
    gpus_per_node: int
    count: int
    specific: bool = False  # specificReservationRequired: only VMs that name it consume it
    in_use: int = 0
    machine_type: str = ""  # derived from the catalog when empty


# Image pull on a fresh node (docs/sim.md rule 2b). IMAGE_GB is an assumption (a CUDA + PyTorch training image);
# PULL_MIB_S is EBS gp3's documented baseline throughput, the node's boot disk bounding the write of the layers;
# STREAM_FRACTION is an assumption from Harter et al., Slacker (FAST '16): 6.4 % of an image's data is read at start.
IMAGE_GB, PULL_MIB_S, STREAM_FRACTION = 10.0, 125.0, 0.064


@dataclass(frozen=True)
class PullSpec:
    """The kubelet's image pull on a node (real-world units): ``image_gb`` per image, at ``pull_mib_s``; with
    ``streaming`` (GKE Image streaming) a container starts once ``streaming_fraction`` of the image is read."""

    image_gb: float = IMAGE_GB
    pull_mib_s: float = PULL_MIB_S
    streaming: bool = False
    streaming_fraction: float = STREAM_FRACTION

    def pull_s(self) -> float:
        """Real-world seconds from the pull's start to the container's start."""
        full = self.image_gb * 1024.0 / self.pull_mib_s
        return full * self.streaming_fraction if self.streaming else full


def parse_pull(data: Any, f: str = "image_pull", *, streaming: bool = True) -> PullSpec:
    """A scenario's ``image_pull:`` block (absent: the defaults). ``streaming`` False: the cloud has no image
    streaming option. Raises: InvalidSpec naming the field."""
    if data is None:
        return PullSpec()
    keys = {"image_gb", "pull_mib_s"} | ({"streaming", "streaming_fraction"} if streaming else set())
    d = obj(data, f, keys)
    on = d.get("streaming", False)
    if not isinstance(on, bool):
        raise InvalidSpec(f"{f}.streaming", on, "must be true or false")
    frac = num(d.get("streaming_fraction", STREAM_FRACTION), f"{f}.streaming_fraction", 0.0)
    if frac > 1:
        raise InvalidSpec(f"{f}.streaming_fraction", frac, "must be <= 1 (the part of the image read at start)")
    rate = num(d.get("pull_mib_s", PULL_MIB_S), f"{f}.pull_mib_s", 0.001)
    return PullSpec(num(d.get("image_gb", IMAGE_GB), f"{f}.image_gb", 0.0), rate, on, frac)


@dataclass(frozen=True)
class World:
    """World-level timing: provider flavour, device plugin delay, MIG retry period, preemption notice, and the
    pods' grace within it (``pod_grace_s``: from the notice to the kill of a pod on the node), image pulls."""

    cloud: str = "gcp"
    device_plugin_s: float = 90.0
    mig_retry_s: float = 60.0
    notice_s: float = NOTICE_S["gcp"]
    operations: Operations = field(default_factory=Operations)
    pod_grace_s: float = POD_GRACE_S["gcp"]
    image_pull: PullSpec = field(default_factory=PullSpec)


def default_boot(accelerator: str, pool_name: str) -> BootLatency:
    """The realistic boot latency of an accelerator's VMs, seeded by the pool name."""
    return BootLatency("lognormal", BOOT_MEDIAN_S.get(accelerator, 240.0), BOOT_SIGMA,
                       zlib.crc32(pool_name.encode()) % 10_000, BOOT_MIN_S)


def parse_boot(data: Any, f: str, accelerator: str, pool_name: str) -> BootLatency:
    """A pool's ``boot:`` block; absent = :func:`default_boot`. Raises: InvalidSpec naming the field."""
    if data is None:
        return default_boot(accelerator, pool_name)
    b = obj(data, f, {"dist", "median_s", "sigma", "seed", "value_s", "min_s"})
    base = default_boot(accelerator, pool_name)
    dist = str(b.get("dist", "lognormal" if "sigma" in b else "fixed"))
    if dist not in ("fixed", "lognormal"):
        raise InvalidSpec(f"{f}.dist", dist, "allowed: 'fixed', 'lognormal'")
    median = num(b.get("median_s", b.get("value_s", base.median_s)), f"{f}.median_s", 0.0)
    sigma = num(b.get("sigma", base.sigma if dist == "lognormal" else 0.0), f"{f}.sigma", 0.0)
    floor = num(b.get("min_s", base.min_s if dist == "lognormal" and "median_s" not in b else 0.0),
                f"{f}.min_s", 0.0)
    return BootLatency(dist, median, sigma, int(num(b.get("seed", base.seed), f"{f}.seed", 0)), floor)


def parse_autoscaling(data: Any, f: str, pool_max: int) -> Autoscaling:
    """A pool's ``autoscaling:`` block. Raises: InvalidSpec naming the field."""
    if data is None:
        return Autoscaling()
    a = obj(data, f, {"enabled", "min_nodes", "max_nodes", "total"})
    enabled = a.get("enabled", True)
    if not isinstance(enabled, bool):
        raise InvalidSpec(f"{f}.enabled", enabled, "must be true or false")
    lo = int(num(a.get("min_nodes", 0), f"{f}.min_nodes", 0))
    hi = int(num(a.get("max_nodes", pool_max), f"{f}.max_nodes", 0))
    if hi < lo:
        raise InvalidSpec(f"{f}.max_nodes", hi, f"must be >= min_nodes ({lo})")
    if hi > pool_max:
        raise InvalidSpec(f"{f}.max_nodes", hi, f"must be <= the pool's max_nodes ({pool_max})")
    return Autoscaling(enabled, lo, hi, bool(a.get("total", False)))


def parse_affinity(data: Any, f: str) -> ReservationAffinity:
    """A pool's ``reservation_affinity:`` block (``consume: any|specific|none``, ``values: [names]``, as gcloud's
    --reservation-affinity / --reservation). Raises: InvalidSpec naming the field."""
    if data is None:
        return ReservationAffinity()
    a = obj(data, f, {"consume", "values"})
    consume = str(a.get("consume", ""))
    if consume not in AFFINITY_TYPES:
        raise InvalidSpec(f"{f}.consume", consume, f"allowed: {', '.join(AFFINITY_TYPES)}")
    values = tuple(str(v) for v in listing(a.get("values", []), f"{f}.values"))
    if (consume == "specific") != bool(values):
        raise InvalidSpec(f"{f}.values", list(values), "names the reservation(s) of a 'specific' affinity, only")
    return ReservationAffinity(consume, values)


def parse_reservations(data: Any, zones: set[str]) -> tuple[ReservationSpec, ...]:
    """The scenario's ``reservations:`` list. Raises: InvalidSpec naming the field (``reservations[0].count``)."""
    out: list[ReservationSpec] = []
    for i, x in enumerate(listing(data if data is not None else [], "reservations")):
        f = f"reservations[{i}]"
        r = obj(x, f, {"name", "zone", "accelerator", "gpus_per_node", "count", "specific", "in_use", "machine_type"})
        name, zone = str(r.get("name", "")), str(r.get("zone", ""))
        if zone not in zones:
            raise InvalidSpec(f"{f}.zone", zone, f"unknown zone; known: {sorted(zones)}")
        if any(o.name == name and o.zone == zone for o in out):
            raise InvalidSpec(f"{f}.name", name, f"a reservation of that name already exists in {zone}")
        try:
            acc = accelerators.get(str(r.get("accelerator", "")))
        except InvalidSpec as exc:
            raise InvalidSpec(f"{f}.accelerator", r.get("accelerator"), exc.fields["allowed"]) from None
        gpus = int(num(r.get("gpus_per_node", 8), f"{f}.gpus_per_node", 1))
        count = int(num(r.get("count", 1), f"{f}.count", 1))
        in_use = int(num(r.get("in_use", 0), f"{f}.in_use", 0))
        if in_use > count:
            raise InvalidSpec(f"{f}.in_use", in_use, f"must be <= count ({count})")
        out.append(ReservationSpec(name, zone, acc.name, gpus, count, bool(r.get("specific", False)), in_use,
                                   str(r.get("machine_type") or acc.gce_machine_for(gpus).name)))
    return tuple(out)


def parse_world(d: dict[str, Any]) -> World:
    """The top-level world keys of a scenario. Raises: InvalidSpec naming the field."""
    cloud = str(d.get("cloud", "gcp"))
    if cloud not in NOTICE_S:
        raise InvalidSpec("cloud", cloud, f"allowed: {', '.join(sorted(NOTICE_S))}")
    pre = obj(d.get("preemption", {}), "preemption", {"notice_s", "pod_grace_s"})
    o = obj(d.get("operations", {}), "operations", {"pending_s", "set_size_s", "delete_instances_s"})
    dflt = Operations()
    ops = Operations(*(num(o.get(k, getattr(dflt, k)), f"operations.{k}", 0.0)
                       for k in ("pending_s", "set_size_s", "delete_instances_s")))
    notice = num(pre.get("notice_s", NOTICE_S[cloud]), "preemption.notice_s", 0.0)
    grace = num(pre.get("pod_grace_s", min(POD_GRACE_S[cloud], notice)), "preemption.pod_grace_s", 0.0)
    if grace > notice:
        raise InvalidSpec("preemption.pod_grace_s", grace, f"must be <= preemption.notice_s ({notice:g}): the VM is "
                          "gone at the end of the notice, and its pods with it")
    return World(
        cloud, num(d.get("device_plugin_s", World.device_plugin_s), "device_plugin_s", 0.0),
        num(d.get("mig_retry_s", World.mig_retry_s), "mig_retry_s", 0.001), notice, ops, grace,
        parse_pull(d.get("image_pull")),
    )


def obj(data: Any, f: str, keys: set[str] | None = None) -> dict[str, Any]:
    """``data`` as a mapping with only ``keys``. Raises: InvalidSpec naming ``f`` or the unknown key."""
    if not isinstance(data, dict):
        raise InvalidSpec(f, data, "must be a mapping")
    if keys is not None:
        for k in data:
            if k not in keys:
                raise InvalidSpec(f"{f}.{k}", data[k], f"unknown field; known: {', '.join(sorted(keys))}")
    return data


def listing(data: Any, f: str) -> list[Any]:
    """Raises: InvalidSpec when ``data`` is not a list."""
    if not isinstance(data, list):
        raise InvalidSpec(f, data, "must be a list")
    return data


def num(value: Any, f: str, lo: float) -> float:
    """Raises: InvalidSpec when ``value`` is not a number >= ``lo``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidSpec(f, value, f"must be a number >= {lo:g}")
    if value < lo:
        raise InvalidSpec(f, value, f"must be >= {lo:g}")
    return float(value)
