"""EksProvider.pool_activity: what a managed node group's Auto Scaling group is doing (best effort).

target = the ASG's ``DesiredCapacity``; running = its ``InService`` instances; creating = desired
instances not ``InService`` yet (``Pending*`` or not launched); errors = the ASG's failed scaling activities
(``StatusCode: Failed``, e.g. ``InsufficientInstanceCapacity`` in ``StatusMessage``).

https://docs.aws.amazon.com/autoscaling/ec2/APIReference/API_DescribeAutoScalingGroups.html
https://docs.aws.amazon.com/autoscaling/ec2/APIReference/API_DescribeScalingActivities.html
"""

from __future__ import annotations

import datetime
import re
from typing import TYPE_CHECKING, Any

from kfp_gpu.providers.base import PoolActivity, PoolError, PoolRef

if TYPE_CHECKING:
    from kfp_gpu.providers.eks.provider import EksProvider

_CODE_RE = re.compile(r"\b(InsufficientInstanceCapacity|MaxSpotInstanceCountExceeded|SpotMaxPriceTooLow|"
                      r"VcpuLimitExceeded|InstanceLimitExceeded|Unsupported)\b")


def pool_activity(p: EksProvider, ref: PoolRef, since: float = 0.0) -> PoolActivity:
    """See EksProvider.pool_activity.

    Raises: NotFound, PermissionDenied (autoscaling:DescribeAutoScalingGroups /
    DescribeScalingActivities), RateLimited, TransientCloudError.
    """
    region = ref.region or p.region
    ng = p._nodegroup(ref.pool, region)
    asgs = [str(g["name"]) for g in (ng.get("resources") or {}).get("autoScalingGroups") or [] if g.get("name")]
    desired = int((ng.get("scalingConfig") or {}).get("desiredSize", 0))
    if not asgs:  # the node group has no ASG yet (still creating): nothing runs
        return PoolActivity(ref, desired, 0, desired)
    groups = p._call("autoscaling", "describe_auto_scaling_groups", region=region, zone=ref.zone,
                     AutoScalingGroupNames=asgs).get("AutoScalingGroups", [])
    target = sum(int(g.get("DesiredCapacity", 0)) for g in groups) if groups else desired
    states = [str(i.get("LifecycleState", "")) for g in groups for i in g.get("Instances", [])]
    running = sum(1 for s in states if s == "InService")
    errors: list[PoolError] = []
    for name in asgs:
        acts = p._call("autoscaling", "describe_scaling_activities", region=region, zone=ref.zone,
                       AutoScalingGroupName=name, MaxRecords=50).get("Activities", [])
        errors += [_error(a) for a in acts if a.get("StatusCode") == "Failed"]
    errors = sorted((e for e in errors if not e.at or e.at >= since), key=lambda e: e.at)
    return PoolActivity(ref, target, running, max(0, target - running), tuple(errors))


# Auto Scaling words launch failures without the EC2 code; these are its texts for the codes we classify
# (https://docs.aws.amazon.com/autoscaling/ec2/userguide/ts-as-capacity.html, ts-as-instancelaunchfailure.html)
_TEXTS = (("We currently do not have sufficient", "InsufficientInstanceCapacity"),
          ("There is no Spot capacity available", "InsufficientInstanceCapacity"),
          ("more vCPU capacity than your current vCPU limit", "VcpuLimitExceeded"),
          ("Max spot instance count exceeded", "MaxSpotInstanceCountExceeded"))


def _error(activity: dict[str, Any]) -> PoolError:
    msg = str(activity.get("StatusMessage") or activity.get("Description") or "")
    found = _CODE_RE.search(msg)
    if found is None:
        code = next((c for text, c in _TEXTS if text in msg), "")
        if code:
            start = activity.get("StartTime")
            at = start.timestamp() if isinstance(start, datetime.datetime) else 0.0
            return PoolError(code, msg, action=str(activity.get("Cause", ""))[:200], at=at)
    start = activity.get("StartTime")
    at = start.timestamp() if isinstance(start, datetime.datetime) else 0.0
    return PoolError(found.group(1) if found else "Failed", msg, action=str(activity.get("Cause", ""))[:200], at=at)
