"""The AWS stand-in's world in virtual time (no sleeps), through real boto3 clients where the wire matters.
One test per modelled behaviour of docs/sim.md, "AWS stand-in"."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

from kfp_gpu import iam
from kfp_gpu_rehearsal.sim.aws import AwsSimServer
from kfp_gpu_rehearsal.sim.aws.nodes import MemoryNodes
from kfp_gpu_rehearsal.sim.aws.scenario import from_dict
from kfp_gpu_rehearsal.sim.clock import Timeline, compress

CLUSTER = "kfp-gpu-eks"


def scenario(**over: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "cluster": CLUSTER, "zones": ["us-east-1a", "us-east-1b"],
        "nodegroups": [
            {"name": "spot-a", "instance_type": "p4d.24xlarge", "zone": "us-east-1a", "capacity_type": "SPOT",
             "max_size": 4, "boot": {"dist": "fixed", "median_s": 200}},
            {"name": "od-b", "instance_type": "p4d.24xlarge", "zone": "us-east-1b", "max_size": 4,
             "boot": {"dist": "fixed", "median_s": 200}},
        ],
        "quotas": {"L-417A185B": 1152, "L-7212CCBC": 1152},
    }
    base.update(over)
    return base


@pytest.fixture
def world() -> Iterator[tuple[AwsSimServer, dict[str, Any], Timeline]]:
    with _sim(scenario()) as made:
        yield made


@contextlib.contextmanager
def _sim(raw: dict[str, Any]) -> Iterator[tuple[AwsSimServer, dict[str, Any], Timeline]]:
    tl = Timeline(virtual=True)
    sim = AwsSimServer(from_dict(raw), timeline=tl)
    url = sim.start()
    kw = dict(region_name="us-east-1", endpoint_url=url, aws_access_key_id=iam.SIM_AWS_KEY_ID, aws_secret_access_key="s",
              config=Config(retries={"total_max_attempts": 1}))
    clients = {s: boto3.client(s, **kw) for s in ("eks", "autoscaling", "ec2", "service-quotas")}  # type: ignore[call-overload]
    try:
        yield sim, clients, tl
    finally:
        sim.stop()


def advance(sim: AwsSimServer, tl: Timeline, real_s: float) -> None:
    tl.advance(compress(real_s))
    sim.world.drain_backend()


def ng(c: dict[str, Any], name: str) -> dict[str, Any]:
    return dict(c["eks"].describe_nodegroup(clusterName=CLUSTER, nodegroupName=name)["nodegroup"])


def grow(c: dict[str, Any], name: str, n: int, token: str = "") -> dict[str, Any]:
    kw = {"clientRequestToken": token} if token else {}
    return dict(c["eks"].update_nodegroup_config(clusterName=CLUSTER, nodegroupName=name,
                                                 scalingConfig={"minSize": 0, "maxSize": 4, "desiredSize": n}, **kw))


def test_update_is_asynchronous_and_a_second_one_is_refused_while_updating(world: Any) -> None:
    sim, c, tl = world
    upd = grow(c, "spot-a", 2, "tok")["update"]
    assert upd["status"] == "InProgress" and ng(c, "spot-a")["status"] == "UPDATING"
    assert ng(c, "spot-a")["scalingConfig"]["desiredSize"] == 0  # not applied yet
    assert grow(c, "spot-a", 2, "tok")["update"]["id"] == upd["id"]  # same token = same update
    with pytest.raises(ClientError) as err:
        grow(c, "spot-a", 3)
    assert err.value.response["Error"]["Code"] == "ResourceInUseException"
    assert err.value.response["ResponseMetadata"]["HTTPStatusCode"] == 409
    advance(sim, tl, 40)
    assert ng(c, "spot-a")["status"] == "ACTIVE" and ng(c, "spot-a")["scalingConfig"]["desiredSize"] == 2


def test_instances_boot_for_minutes_then_register_eks_labelled_nodes(world: Any) -> None:
    sim, c, tl = world
    grow(c, "spot-a", 2)
    advance(sim, tl, 40)
    asg = c["autoscaling"].describe_auto_scaling_groups()["AutoScalingGroups"]
    spot = next(g for g in asg if "spot-a" in g["AutoScalingGroupName"])
    assert [i["LifecycleState"] for i in spot["Instances"]] == ["Pending", "Pending"]
    assert not sim.backend.bodies
    advance(sim, tl, 199)
    assert not sim.backend.bodies  # 200 s boot not over yet
    advance(sim, tl, 2)
    nodes: MemoryNodes = sim.backend
    assert len(nodes.bodies) == 2
    body = next(iter(nodes.bodies.values()))
    labels = body["metadata"]["labels"]
    assert labels["eks.amazonaws.com/nodegroup"] == "spot-a"
    assert labels["eks.amazonaws.com/capacityType"] == "SPOT"
    assert labels["topology.kubernetes.io/zone"] == "us-east-1a"
    assert labels["node.kubernetes.io/instance-type"] == "p4d.24xlarge"
    assert not [k for k in labels if k.startswith("cloud.google.com/")]
    iid = body["spec"]["providerID"].rsplit("/", 1)[-1]
    assert body["spec"]["providerID"] == f"aws:///us-east-1a/{iid}"
    assert body["spec"]["taints"] == [{"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}]
    assert body["status"]["allocatable"]["nvidia.com/gpu"] == "0"  # device plugin not registered yet
    advance(sim, tl, 61)
    assert set(nodes.gpus.values()) == {8}
    inst = c["ec2"].describe_instances(InstanceIds=[iid])["Reservations"][0]["Instances"][0]
    assert inst["InstanceLifecycle"] == "spot" and inst["PrivateDnsName"] == body["metadata"]["name"]


def test_a_stockout_fails_launches_in_the_asg_and_the_nodegroup_health_then_retries() -> None:
    raw = scenario(stockouts=[{"zone": "us-east-1a", "instance_type": "p4d.24xlarge", "end_s": 90}])
    with _sim(raw) as (sim, c, tl):
        grow(c, "spot-a", 1)
        grow(c, "od-b", 1)
        advance(sim, tl, 40)
        issues = ng(c, "spot-a")["health"]["issues"]
        assert issues and issues[0]["code"] == "AsgInstanceLaunchFailures"
        assert "InsufficientInstanceCapacity" in issues[0]["message"] and "us-east-1a" in issues[0]["message"]
        assert not ng(c, "od-b")["health"]["issues"]  # the other AZ has stock
        name = ng(c, "spot-a")["resources"]["autoScalingGroups"][0]["name"]
        acts = c["autoscaling"].describe_scaling_activities(AutoScalingGroupName=name)["Activities"]
        assert acts[0]["StatusCode"] == "Failed"
        assert "We currently do not have sufficient p4d.24xlarge capacity" in acts[0]["StatusMessage"]
        advance(sim, tl, 61)  # the ASG retries after the stockout ended
        assert not ng(c, "spot-a")["health"]["issues"]


def test_vcpu_quota_is_enforced_at_launch() -> None:
    with _sim(scenario(quotas={"L-417A185B": 96})) as (sim, c, tl):
        assert c["service-quotas"].get_service_quota(ServiceCode="ec2", QuotaCode="L-417A185B")["Quota"]["Value"] == 96
        grow(c, "od-b", 2)
        advance(sim, tl, 40)
        issues = ng(c, "od-b")["health"]["issues"]
        assert "VcpuLimitExceeded" in issues[0]["message"]
        assert len(c["ec2"].describe_instances()["Reservations"]) == 1


def test_terminate_with_decrement_removes_that_instance_and_shrinks(world: Any) -> None:
    sim, c, tl = world
    grow(c, "od-b", 3)
    advance(sim, tl, 300)
    name = ng(c, "od-b")["resources"]["autoScalingGroups"][0]["name"]
    ids = [i["InstanceId"] for i in c["autoscaling"].describe_auto_scaling_groups(
        AutoScalingGroupNames=[name])["AutoScalingGroups"][0]["Instances"]]
    victim = ids[0]  # the oldest: Auto Scaling's own scale-in would have picked the newest
    c["autoscaling"].terminate_instance_in_auto_scaling_group(InstanceId=victim, ShouldDecrementDesiredCapacity=True)
    assert ng(c, "od-b")["scalingConfig"]["desiredSize"] == 2
    advance(sim, tl, 46)
    left = [i["InstanceId"] for i in c["autoscaling"].describe_auto_scaling_groups(
        AutoScalingGroupNames=[name])["AutoScalingGroups"][0]["Instances"]]
    assert sorted(left) == sorted(ids[1:])
    with pytest.raises(ClientError) as err:
        c["autoscaling"].terminate_instance_in_auto_scaling_group(InstanceId=victim,
                                                                  ShouldDecrementDesiredCapacity=True)
    assert err.value.response["Error"]["Code"] == "ValidationError"


def test_spot_interruption_drains_then_terminates_after_two_minutes_and_is_replaced(world: Any) -> None:
    sim, c, tl = world
    grow(c, "spot-a", 1)
    advance(sim, tl, 300)
    node = next(iter(sim.backend.bodies))
    doc = sim.interrupt(node)
    sim.world.drain_backend()
    assert doc["noticeS"] == 120 and sim.backend.drained == [node]
    advance(sim, tl, 119)
    assert node not in sim.backend.deleted
    advance(sim, tl, 2)
    assert node in sim.backend.deleted
    assert ng(c, "spot-a")["scalingConfig"]["desiredSize"] == 1  # desired kept: a replacement launches
    advance(sim, tl, 201)
    assert len(sim.backend.bodies) == 1 and node not in sim.backend.bodies


def test_throttling_answers_each_service_in_its_own_shape() -> None:
    raw = scenario(throttle={"read_burst": 2, "read_refill_per_s": 0.001, "write_burst": 1,
                             "write_refill_per_s": 0.001})
    with _sim(raw) as (_unused, c, _tl):
        calls = {
            "ec2": (lambda: c["ec2"].describe_instances(), "RequestLimitExceeded", 503),
            "autoscaling": (lambda: c["autoscaling"].describe_auto_scaling_groups(), "Throttling", 400),
            "eks": (lambda: c["eks"].list_nodegroups(clusterName=CLUSTER), "ThrottlingException", 429),
            "service-quotas": (lambda: c["service-quotas"].get_service_quota(ServiceCode="ec2",
                                                                             QuotaCode="L-417A185B"),
                               "TooManyRequestsException", 400),
        }
        for fn, code, status in calls.values():
            fn()
            fn()
            with pytest.raises(ClientError) as err:
                fn()
            assert err.value.response["Error"]["Code"] == code
            assert err.value.response["ResponseMetadata"]["HTTPStatusCode"] == status


def test_unknown_nodegroup_is_resource_not_found(world: Any) -> None:
    _sim_, c, _tl = world
    with pytest.raises(ClientError) as err:
        ng(c, "nope")
    assert err.value.response["Error"]["Code"] == "ResourceNotFoundException"
    assert err.value.response["ResponseMetadata"]["HTTPStatusCode"] == 404


def test_throttle_buckets_refill_per_wall_second_not_per_compressed_second() -> None:
    """Requests are real requests in real time: EC2's 20 tokens/s refill is 20 per wall second (refilled per
    compressed second it was 2,400 per wall second and the bucket never bound beyond its burst)."""
    from kfp_gpu_rehearsal.sim.aws.server import Buckets

    now = [0.0]
    buckets = Buckets(from_dict(scenario(throttle={"read_burst": 2, "read_refill_per_s": 20.0})), now=lambda: now[0])
    assert buckets.take("ec2", "DescribeInstances") and buckets.take("ec2", "DescribeInstances")
    assert not buckets.take("ec2", "DescribeInstances")
    now[0] = 0.01  # 1/100 s: 0.2 tokens, not 24
    assert not buckets.take("ec2", "DescribeInstances")
    now[0] = 0.06  # 1.2 tokens
    assert buckets.take("ec2", "DescribeInstances") and not buckets.take("ec2", "DescribeInstances")
    assert buckets.take("ec2", "DescribeSubnets")  # each API has its own bucket
