"""PoolState.autoscaling: GKE from nodePools.get/list ``autoscaling`` (the stand-in reports it as GKE does),
EKS from the cluster-autoscaler auto-discovery tag on the node group's Auto Scaling group (moto)."""

from __future__ import annotations

from typing import Any

from kfp_gpu.providers.eks.provider import CA_ENABLED_TAG
from kfp_gpu.providers.gke import GkeProvider
from tests.providers.test_eks_provider import REGION as AWS_REGION
from tests.providers.test_eks_provider import World, moto_url, world  # noqa: F401 (fixtures)
from tests.sim._helpers import CLUSTER, PROJECT, REGION, running, scenario


def test_gke_pools_report_the_autoscaling_block() -> None:
    data = scenario()
    for p in data["pools"]:
        if p["name"] == "l4-a":
            p["autoscaling"] = {"enabled": True, "min_nodes": 1, "max_nodes": 64}
        elif p["name"] == "l4-b":
            p["autoscaling"] = {"enabled": True, "min_nodes": 0, "max_nodes": 32, "total": True}
        elif p["name"] == "l4-c":
            p["autoscaling"] = {"enabled": False}
        elif p["name"] == "l4-f":
            p.pop("autoscaling", None)
    with running(data) as sim:
        pools = {p.ref.pool: p for p in GkeProvider(PROJECT, REGION, CLUSTER, endpoint=sim.url).pools(REGION)}
    a, b, c, f = pools["l4-a"], pools["l4-b"], pools["l4-c"], pools["l4-f"]
    assert (a.autoscaling, a.autoscaling_min, a.autoscaling_max) == (True, 1, 64)
    assert (b.autoscaling, b.autoscaling_min, b.autoscaling_max) == (True, 0, 32)
    assert (c.autoscaling, c.autoscaling_min, c.autoscaling_max) == (False, 0, 0)
    assert (f.autoscaling, f.autoscaling_min, f.autoscaling_max) == (False, 0, 0)


def _tag_asg(w: World, nodegroup: str) -> str:
    """Create the node group's Auto Scaling group in moto (its EKS model names one but does not create it),
    tagged for cluster-autoscaler auto-discovery."""
    eks, asg = w.client("eks"), w.client("autoscaling")
    ng: dict[str, Any] = eks.describe_nodegroup(clusterName=w.provider.cluster, nodegroupName=nodegroup)["nodegroup"]
    name = ng["resources"]["autoScalingGroups"][0]["name"]
    w.client("ec2").create_launch_template(LaunchTemplateName=f"lt-{name}",
                                               LaunchTemplateData={"ImageId": "ami-12c6146b", "InstanceType": "p5.48xlarge"})
    asg.create_auto_scaling_group(
        AutoScalingGroupName=name, LaunchTemplate={"LaunchTemplateName": f"lt-{name}"}, MinSize=0, MaxSize=4,
        DesiredCapacity=0, AvailabilityZones=[f"{AWS_REGION}a"],
        Tags=[{"Key": CA_ENABLED_TAG, "Value": "true", "PropagateAtLaunch": False,
               "ResourceId": name, "ResourceType": "auto-scaling-group"}])
    return str(name)


def test_eks_node_group_is_autoscaled_only_with_the_cluster_autoscaler_tag(world: World) -> None:  # noqa: F811
    before = {p.ref.pool: p.autoscaling for p in world.provider.pools(AWS_REGION)}
    assert before == {"h100-a": False, "h100-b": False}  # no ASG tag (moto creates no ASG): not autoscaled
    _tag_asg(world, "h100-a")
    pools = {p.ref.pool: p for p in world.provider.pools(AWS_REGION)}
    a = pools["h100-a"]
    assert (a.autoscaling, a.autoscaling_min, a.autoscaling_max) == (True, 0, 4)
    assert pools["h100-b"].autoscaling is False
