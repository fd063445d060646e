"""Accelerator catalog: one row per GPU type, with what each cloud calls it.

Prices are *inputs*, not truths: they are approximate public list prices (USD per GPU-hour,
us-central1 / us-east-1) recorded on ``PRICE_AS_OF`` from ``PRICE_SOURCE``. Override them per run
with ``CostInputs.price_per_gpu_hour`` in the spec, or process-wide with :func:`override_price`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from kfp_gpu.errors import InvalidSpec

PRICE_SOURCE = (
    "GCP: cloud.google.com/compute/gpus-pricing (a2/a3/g2 VM list price / GPUs per VM); "
    "AWS: aws.amazon.com/ec2/pricing/on-demand (p4d/p4de/p5/p5en/g6/g4dn, per GPU). "
    "Spot figures are typical observed discounts, not quotes."
)
PRICE_AS_OF = "2026-11-01 (approximate; verify before budgeting)"

# AWS Service Quotas codes (service code "ec2"); these quotas count vCPUs, not instances or GPUs.
AWS_QUOTA_P_ON_DEMAND = "L-417A185B"  # Running On-Demand P instances
AWS_QUOTA_P_SPOT = "L-7212CCBC"  # All P Spot Instance Requests
AWS_QUOTA_G_ON_DEMAND = "L-DB2E81BA"  # Running On-Demand G and VT instances
AWS_QUOTA_G_SPOT = "L-3819A6DF"  # All G and VT Spot Instance Requests

# Cloud Quotas (cloudquotas.googleapis.com) id for per-family GPU quotas that Compute's
# regions.get does not list (H100, H200, B200 families).
GCP_GPU_FAMILY_QUOTA_ID = "GPUS-PER-GPU-FAMILY-per-project-region"
GCP_ALL_REGIONS_METRIC = "GPUS_ALL_REGIONS"


@dataclass(frozen=True)
class MachineShape:
    """A VM/instance type and what it carries."""

    name: str
    gpus: int
    vcpus: int


@dataclass(frozen=True)
class Price:
    """USD per GPU-hour."""

    on_demand: float
    spot: float


@dataclass(frozen=True)
class Accelerator:
    name: str
    gke_label: str  # value of cloud.google.com/gke-accelerator
    gce_machines: tuple[MachineShape, ...]
    gcp_quota_metric: str  # Compute regional metric, e.g. NVIDIA_A100_80GB_GPUS
    gcp_preemptible_metric: str
    gcp_gpu_family: str | None  # Cloud Quotas gpu_family dimension where Compute omits the metric
    aws_instances: tuple[MachineShape, ...]
    aws_quota_on_demand: str
    aws_quota_spot: str
    price: Price

    @property
    def gpus_per_vm_options(self) -> tuple[int, ...]:
        return tuple(sorted({m.gpus for m in self.gce_machines} | {m.gpus for m in self.aws_instances}))

    def gce_machine_for(self, gpus_per_node: int) -> MachineShape:
        """Raises: InvalidSpec if no GCE machine type carries ``gpus_per_node`` of this GPU."""
        for m in self.gce_machines:
            if m.gpus == gpus_per_node:
                return m
        counts = sorted({m.gpus for m in self.gce_machines})
        raise InvalidSpec(
            "gpus_per_node",
            gpus_per_node,
            f"{self.name} on GCE comes in {counts} GPUs per VM",
            remediation=f"set gpus_per_node to one of {counts}" if counts
            else "pick an accelerator GCE offers (this one has no GCE machine type)",
        )

    def aws_instance_for(self, gpus_per_node: int) -> MachineShape:
        """Raises: InvalidSpec if no EC2 instance type carries ``gpus_per_node`` of this GPU."""
        for m in self.aws_instances:
            if m.gpus == gpus_per_node:
                return m
        counts = sorted({m.gpus for m in self.aws_instances})
        raise InvalidSpec(
            "gpus_per_node",
            gpus_per_node,
            f"{self.name} on EC2 comes in {counts} GPUs per instance",
            remediation=f"set gpus_per_node to one of {counts}" if counts
            else "pick an accelerator EC2 offers (this one has no EC2 instance type)",
        )


def _m(*rows: tuple[str, int, int]) -> tuple[MachineShape, ...]:
    return tuple(MachineShape(n, g, c) for n, g, c in rows)


_P = (AWS_QUOTA_P_ON_DEMAND, AWS_QUOTA_P_SPOT)
_G = (AWS_QUOTA_G_ON_DEMAND, AWS_QUOTA_G_SPOT)

_CATALOG: dict[str, Accelerator] = {
    a.name: a
    for a in (
        Accelerator(
            "a100-40gb", "nvidia-tesla-a100",
            _m(("a2-highgpu-1g", 1, 12), ("a2-highgpu-2g", 2, 24), ("a2-highgpu-4g", 4, 48),
               ("a2-highgpu-8g", 8, 96), ("a2-megagpu-16g", 16, 96)),
            "NVIDIA_A100_GPUS", "PREEMPTIBLE_NVIDIA_A100_GPUS", None,
            _m(("p4d.24xlarge", 8, 96)), *_P, Price(3.67, 1.47),
        ),
        Accelerator(
            "a100-80gb", "nvidia-a100-80gb",
            _m(("a2-ultragpu-1g", 1, 12), ("a2-ultragpu-2g", 2, 24), ("a2-ultragpu-4g", 4, 48),
               ("a2-ultragpu-8g", 8, 96)),
            "NVIDIA_A100_80GB_GPUS", "PREEMPTIBLE_NVIDIA_A100_80GB_GPUS", None,
            _m(("p4de.24xlarge", 8, 96)), *_P, Price(5.07, 2.03),
        ),
        Accelerator(
            "h100-80gb", "nvidia-h100-80gb",
            _m(("a3-highgpu-1g", 1, 26), ("a3-highgpu-2g", 2, 52), ("a3-highgpu-4g", 4, 104),
               ("a3-highgpu-8g", 8, 208)),
            "NVIDIA_H100_GPUS", "PREEMPTIBLE_NVIDIA_H100_GPUS", "NVIDIA_H100",
            _m(("p5.48xlarge", 8, 192)), *_P, Price(11.06, 3.72),
        ),
        Accelerator(
            "h200", "nvidia-h200-141gb",
            _m(("a3-ultragpu-8g", 8, 224),),
            "NVIDIA_H200_GPUS", "PREEMPTIBLE_NVIDIA_H200_GPUS", "NVIDIA_H200",
            _m(("p5en.48xlarge", 8, 192),), *_P, Price(10.85, 3.80),
        ),
        Accelerator(
            "l4", "nvidia-l4",
            _m(("g2-standard-4", 1, 4), ("g2-standard-24", 2, 24), ("g2-standard-48", 4, 48),
               ("g2-standard-96", 8, 96)),
            "NVIDIA_L4_GPUS", "PREEMPTIBLE_NVIDIA_L4_GPUS", None,
            _m(("g6.xlarge", 1, 4), ("g6.12xlarge", 4, 48), ("g6.48xlarge", 8, 192)), *_G,
            Price(0.71, 0.28),
        ),
        Accelerator(
            "t4", "nvidia-tesla-t4",
            _m(("n1-standard-8", 1, 8), ("n1-standard-16", 2, 16), ("n1-standard-32", 4, 32)),
            "NVIDIA_T4_GPUS", "PREEMPTIBLE_NVIDIA_T4_GPUS", None,
            _m(("g4dn.xlarge", 1, 4), ("g4dn.12xlarge", 4, 48), ("g4dn.metal", 8, 96)), *_G,
            Price(0.35, 0.14),
        ),
    )
}

_ALIASES: dict[str, str] = {
    "a100": "a100-40gb",
    "h100": "h100-80gb",
    "h200-141gb": "h200",
    **{a.gke_label: a.name for a in _CATALOG.values()},
}


def names() -> tuple[str, ...]:
    return tuple(_CATALOG)


def get(name: str) -> Accelerator:
    """Look up an accelerator by catalog name, alias, or GKE label.

    Raises:
        InvalidSpec: the name is unknown; the message lists the known names.
    """
    key = str(name).strip().lower()
    key = _ALIASES.get(key, key)
    try:
        return _CATALOG[key]
    except KeyError:
        raise InvalidSpec(
            "accelerator", name, f"known accelerators are {', '.join(_CATALOG)}",
            remediation="use a catalog name such as 'a100-80gb' or a GKE label such as 'nvidia-h100-80gb'",
        ) from None


def override_price(name: str, *, on_demand: float | None = None, spot: float | None = None) -> None:
    """Replace the list price of one accelerator for this process (e.g. negotiated discounts).

    Raises:
        InvalidSpec: unknown accelerator, or a negative price.
    """
    acc = get(name)
    for field, value in (("on_demand", on_demand), ("spot", spot)):
        if value is not None and value < 0:
            raise InvalidSpec(f"price.{field}", value, "must be >= 0 USD per GPU-hour")
    price = dataclasses.replace(
        acc.price,
        on_demand=acc.price.on_demand if on_demand is None else on_demand,
        spot=acc.price.spot if spot is None else spot,
    )
    _CATALOG[acc.name] = dataclasses.replace(acc, price=price)
