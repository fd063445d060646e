"""pool_activity across providers: the fake (in memory) and EKS (moto in server mode, real HTTP).
GKE's is tested against the stand-in in test_gke_resilience.py."""

from __future__ import annotations

import itertools

import pytest

from kfp_gpu.ownership import Owner
from kfp_gpu.providers.base import CapacityProvider, OpStatus, PoolRef, PoolState
from kfp_gpu.providers.fake import FakeProvider
from tests.providers import test_eks_provider as eks_t

OWNER = Owner("run-3", "recovery", 2_000_000_000.0)
REGION = eks_t.REGION
World = eks_t.World
moto_url = eks_t.moto_url  # the module-scoped moto server fixture
_n = itertools.count()


@pytest.fixture
def world(moto_url: str) -> World:
    return World(moto_url, f"act{next(_n)}")


def _fake(stockout: bool) -> tuple[FakeProvider, PoolRef]:
    ref = PoolRef("l4-a", "us-central1-a", "us-central1")
    state = PoolState(ref, 1, 8, "l4", 1, "g2-standard-4", True)
    fake = FakeProvider(pools=[state], stockout_zones={"us-central1-a"} if stockout else (),
                        stockout_async=True, op_polls=2)
    return fake, ref


def test_fake_reports_creating_while_a_resize_runs_then_settles() -> None:
    fake, ref = _fake(stockout=False)
    assert isinstance(fake, CapacityProvider)
    op = fake.resize(ref, 3, OWNER)
    act = fake.pool_activity(ref)
    assert (act.target, act.running, act.creating, act.busy) == (3, 1, 2, True)
    while not op.done:
        op = fake.operation(op)
    assert op.status is OpStatus.DONE
    act = fake.pool_activity(ref)
    assert (act.target, act.running, act.creating, act.errors) == (3, 3, 0, ())


def test_fake_reports_a_pending_stockout_as_a_creation_error() -> None:
    fake, ref = _fake(stockout=True)
    fake.resize(ref, 2, OWNER)
    act = fake.pool_activity(ref)
    assert act.busy and [e.stockout for e in act.errors] == [True]


def test_eks_node_group_without_an_auto_scaling_group_yet_is_all_creating(world: World) -> None:
    p, ref = world.provider, PoolRef("h100-a", "us-east-1a", REGION)
    assert isinstance(p, CapacityProvider)
    p.resize(ref, 3, OWNER)
    act = p.pool_activity(ref)
    assert (act.target, act.running, act.creating, act.errors) == (3, 0, 3, ())


def test_eks_counts_in_service_instances_of_the_node_groups_asg(world: World) -> None:
    p, ref = world.provider, PoolRef("h100-b", "us-east-1b", REGION)
    ng = p._nodegroup("h100-b", REGION)
    asg_name = ng["resources"]["autoScalingGroups"][0]["name"]
    asg = world.client("autoscaling")
    asg.create_launch_configuration(LaunchConfigurationName="lc-h100", ImageId="ami-12c6146b",
                                    InstanceType="p5.48xlarge")
    asg.create_auto_scaling_group(AutoScalingGroupName=asg_name, LaunchConfigurationName="lc-h100", MinSize=0,
                                  MaxSize=4, DesiredCapacity=2, VPCZoneIdentifier=world.subnets["b"])
    act = p.pool_activity(ref)
    assert (act.target, act.running, act.creating) == (2, 2, 0) and not act.busy
