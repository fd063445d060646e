"""EksProvider reads the capacity reservation a node group's launch template targets, and placement takes
only that group for ``capacity="reservation"`` naming the reservation. moto in server mode (launch
templates, EKS node groups) plus the before-send capacity-reservation service of test_eks_provider."""

from __future__ import annotations

import itertools
from typing import Any

from kfp_gpu.plan.placement import matching_pools
from kfp_gpu.providers.base import ReservationRequest
from kfp_gpu.spec import ProvisioningSpec, Target, TargetKind
from tests.providers.test_eks_provider import OWNER, REGION, ROLE, World, moto_url  # noqa: F401 - fixture

_n = itertools.count()


def group_with_template(world: World, name: str, data: dict[str, Any]) -> None:
    ec2, eks = world.client("ec2"), world.client("eks")
    lt = ec2.create_launch_template(LaunchTemplateName=f"{name}-{next(_n)}",
                                    LaunchTemplateData={"InstanceType": "p5.48xlarge", **data})["LaunchTemplate"]
    eks.create_nodegroup(clusterName=world.provider.cluster, nodegroupName=name, nodeRole=ROLE,
                         subnets=[world.subnets["a"]], instanceTypes=["p5.48xlarge"],
                         launchTemplate={"id": lt["LaunchTemplateId"], "version": str(lt["LatestVersionNumber"])},
                         scalingConfig={"minSize": 0, "maxSize": 4, "desiredSize": 0})


def test_launch_template_reservation_target_is_a_specific_affinity(moto_url: str) -> None:  # noqa: F811
    world = World(moto_url, f"res{next(_n)}")
    op = world.provider.reserve(ReservationRequest("team", f"{REGION}a", "h100-80gb", 8, 2), OWNER)
    cr_id = op.id.split("|", 1)[1]
    group_with_template(world, "h100-res", {"CapacityReservationSpecification": {
        "CapacityReservationTarget": {"CapacityReservationId": cr_id}}})
    group_with_template(world, "h100-nores", {"CapacityReservationSpecification": {
        "CapacityReservationPreference": "none"}})
    pools = {p.ref.pool: p for p in world.provider.pools(REGION)}
    res, nores, plain = pools["h100-res"], pools["h100-nores"], pools["h100-a"]
    assert (res.reservation_affinity, res.reservations, res.reservation_free) == ("specific", (cr_id,), 2)
    assert (nores.reservation_affinity, nores.reservations) == ("none", ())
    assert (plain.reservation_affinity, plain.reservation_free) == ("", None)  # no launch template: EC2's open
    target = Target(kind=TargetKind.EKS, region=REGION, cluster=world.provider.cluster)
    spec = ProvisioningSpec("h100-80gb", nodes=2, target=target, capacity="reservation",  # type: ignore[arg-type]
                            reservation=cr_id)
    assert [p.ref.pool for p in matching_pools(spec, list(pools.values()))] == ["h100-res"]
    on_demand = ProvisioningSpec("h100-80gb", nodes=2, target=target)
    assert "h100-res" not in [p.ref.pool for p in matching_pools(on_demand, list(pools.values()))]
