"""The local AWS stand-in: EKS managed node groups, Auto Scaling, EC2 and Service Quotas (docs/sim.md,
"AWS stand-in"), whose instances become KWOK Nodes labelled as EKS labels them."""

from __future__ import annotations

from kfp_gpu_rehearsal.sim.aws.scenario import AwsScenario, load
from kfp_gpu_rehearsal.sim.aws.server import AwsSimServer

__all__ = ["AwsScenario", "AwsSimServer", "load"]
