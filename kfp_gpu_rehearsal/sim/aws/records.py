"""The AWS stand-in's records: an EC2 instance, a node group's Auto Scaling group, an AWS error answer, and the
node backend a world drives (Kubernetes Nodes, or none).

Contract: plain mutable records, no behaviour beyond derived fields; :class:`~kfp_gpu_rehearsal.sim.aws.world.AwsWorld`
owns and mutates them under its lock, and the API layer (:mod:`kfp_gpu_rehearsal.sim.aws.api`) renders them.
``Instance.state`` follows EC2 (pending, running, shutting-down, terminated), ``Instance.lifecycle`` the ASG
(Pending, InService, Terminating, Terminated); :func:`iso` is the timestamp format AWS answers with.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Protocol

from kfp_gpu_rehearsal.sim.aws.scenario import NodegroupSpec

__all__ = ["AwsError", "EksNodeBackend", "Group", "Instance", "iso"]


class AwsError(Exception):
    """An AWS error answer: ``code`` as AWS spells it, HTTP ``status``."""

    def __init__(self, code: str, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.code, self.message, self.status = code, message, status


class EksNodeBackend(Protocol):
    def register(self, inst: Instance, ng: NodegroupSpec, cluster: str, gpus_ready: bool) -> None: ...
    def gpus_ready(self, name: str, gpus: int) -> None: ...
    def drain(self, name: str) -> None: ...
    def delete(self, name: str) -> None: ...


@dataclass
class Instance:
    id: str
    nodegroup: str
    zone: str
    instance_type: str
    capacity_type: str
    private_ip: str
    dns: str
    launched: float  # stand-in seconds
    state: str = "pending"  # EC2: pending | running | shutting-down | terminated
    lifecycle: str = "Pending"  # ASG: Pending | InService | Terminating
    notice_deadline: float | None = None
    labels: dict[str, str] = field(default_factory=dict)  # its network topology labels (kfp_gpu_rehearsal.sim.topology)

    @property
    def provider_id(self) -> str:
        return f"aws:///{self.zone}/{self.id}"

    @property
    def live(self) -> bool:
        return self.lifecycle in ("Pending", "InService")


@dataclass
class Group:
    spec: NodegroupSpec
    asg: str
    desired: int
    min_size: int
    max_size: int
    status: str = "ACTIVE"
    updates: dict[str, dict[str, Any]] = field(default_factory=dict)
    tokens: dict[str, str] = field(default_factory=dict)
    issues: list[dict[str, Any]] = field(default_factory=list)
    activities: list[dict[str, Any]] = field(default_factory=list)
    retry_at: float | None = None
    rng: random.Random = field(default_factory=random.Random)


def iso(t: datetime | None = None) -> str:
    return (t or datetime.now(timezone.utc)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
