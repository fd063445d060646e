"""EksProvider against moto in server mode (real HTTP) for EKS, EC2 and ASG; a before-send hook
serves the EC2 capacity-reservation APIs moto lacks, and botocore's Stubber serves Service Quotas."""

from __future__ import annotations

import itertools
import json
import threading
from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qs

import boto3
import pytest
from botocore.awsrequest import AWSResponse
from botocore.config import Config
from botocore.stub import Stubber

from kfp_gpu.errors import (
    CapacityUnavailable,
    CloudError,
    InvalidSpec,
    NotFound,
    PermissionDenied,
)
from kfp_gpu.ownership import Owner
from kfp_gpu.providers.base import CapacityProvider, OpStatus, PoolRef, ReservationRequest
from kfp_gpu.providers.eks import FAIL_FAST, EksProvider

REGION = "us-east-1"
ROLE = "arn:aws:iam::123456789012:role/eks"
OWNER = Owner("run-1", "scale-up", 2_000_000_000.0)


class _Raw:
    def __init__(self, body: bytes) -> None:
        self.body = body

    def stream(self, **_: Any) -> Iterator[bytes]:
        yield self.body


def respond(status: int, body: str, headers: dict[str, str] | None = None) -> AWSResponse:
    return AWSResponse("http://stub", status, headers or {}, _Raw(body.encode()))  # type: ignore[arg-type]


def ec2_error(code: str, status: int = 400, message: str = "injected") -> AWSResponse:
    return respond(status, f"<Response><Errors><Error><Code>{code}</Code><Message>{message}</Message>"
                   f"</Error></Errors><RequestID>r1</RequestID></Response>")


class CapacityReservations:
    """An in-memory EC2 capacity-reservation service, served through botocore's before-send hook."""

    NS = 'xmlns="http://ec2.amazonaws.com/doc/2016-11-15/"'

    def __init__(self) -> None:
        self.items: dict[str, dict[str, Any]] = {}
        self.tokens: dict[str, str] = {}
        self.fail_next: list[AWSResponse] = []
        self.ids = itertools.count(1)

    def __call__(self, request: Any, **_: Any) -> AWSResponse | None:
        body = request.body.decode() if isinstance(request.body, bytes) else (request.body or "")
        q = {k: v[0] for k, v in parse_qs(body).items()}
        action = q.get("Action", "")
        if action not in {"CreateCapacityReservation", "DescribeCapacityReservations",
                          "CancelCapacityReservation", "DescribeCapacityBlockOfferings"}:
            return None  # let moto answer
        if self.fail_next:
            return self.fail_next.pop(0)
        return getattr(self, action)(q)

    def _xml(self, cr: dict[str, Any]) -> str:
        tags = "".join(f"<item><key>{k}</key><value>{v}</value></item>" for k, v in cr["tags"].items())
        return (f"<item><capacityReservationId>{cr['id']}</capacityReservationId><instanceType>{cr['type']}"
                f"</instanceType><availabilityZone>{cr['zone']}</availabilityZone><totalInstanceCount>"
                f"{cr['count']}</totalInstanceCount><availableInstanceCount>{cr.get('available', cr['count'])}"
                f"</availableInstanceCount><state>{cr['state']}</state><tagSet>{tags}</tagSet></item>")

    def CreateCapacityReservation(self, q: dict[str, str]) -> AWSResponse:
        token = q.get("ClientToken", "")
        if token in self.tokens:
            cr = self.items[self.tokens[token]]
        else:
            tags = {q[k]: q[k.replace(".Key", ".Value")] for k in q if k.startswith("TagSpecifications.1.Tag.")
                    and k.endswith(".Key")}
            cr = {"id": f"cr-{next(self.ids):04d}", "type": q["InstanceType"], "zone": q["AvailabilityZone"],
                  "count": q["InstanceCount"], "state": "active", "tags": tags, "end": q.get("EndDate")}
            self.items[cr["id"]] = cr
            self.tokens[token] = cr["id"]
        inner = self._xml(cr).removeprefix("<item>").removesuffix("</item>")
        return respond(200, f"<CreateCapacityReservationResponse {self.NS}><capacityReservation>{inner}"
                       f"</capacityReservation></CreateCapacityReservationResponse>")

    def DescribeCapacityReservations(self, q: dict[str, str]) -> AWSResponse:
        out = list(self.items.values())
        ids = [v for k, v in q.items() if k.startswith("CapacityReservationId.")]
        if ids:
            out = [c for c in out if c["id"] in ids]
        for k, name in q.items():
            if not (k.startswith("Filter.") and k.endswith(".Name")):
                continue
            values = {v for kk, v in q.items() if kk.startswith(k[: -len("Name")] + "Value.")}
            if name == "state":
                out = [c for c in out if c["state"] in values]
            elif name == "tag-key":
                out = [c for c in out if values & set(c["tags"])]
            elif name.startswith("tag:"):
                out = [c for c in out if c["tags"].get(name[4:]) in values]
        items = "".join(self._xml(c) for c in out)
        return respond(200, f"<DescribeCapacityReservationsResponse {self.NS}><capacityReservationSet>{items}"
                       f"</capacityReservationSet></DescribeCapacityReservationsResponse>")

    def CancelCapacityReservation(self, q: dict[str, str]) -> AWSResponse:
        cr = self.items.get(q["CapacityReservationId"])
        if cr is None:
            return ec2_error("InvalidCapacityReservationId.NotFound")
        cr["state"] = "cancelled"
        return respond(200, f"<CancelCapacityReservationResponse {self.NS}><return>true</return>"
                       "</CancelCapacityReservationResponse>")

    def DescribeCapacityBlockOfferings(self, q: dict[str, str]) -> AWSResponse:
        items = "".join(
            f"<item><capacityBlockOfferingId>cb-{fee}</capacityBlockOfferingId><instanceType>{q['InstanceType']}"
            f"</instanceType><availabilityZone>us-east-1{z}</availabilityZone><instanceCount>{q['InstanceCount']}"
            f"</instanceCount><startDate>2026-12-01T00:00:00Z</startDate><endDate>2026-12-02T00:00:00Z</endDate>"
            f"<capacityBlockDurationHours>{q['CapacityDurationHours']}</capacityBlockDurationHours>"
            f"<upfrontFee>{fee}</upfrontFee><currencyCode>USD</currencyCode></item>"
            for z, fee in (("a", "900.00"), ("b", "750.50"))
        )
        return respond(200, f"<DescribeCapacityBlockOfferingsResponse {self.NS}><capacityBlockOfferingSet>"
                       f"{items}</capacityBlockOfferingSet></DescribeCapacityBlockOfferingsResponse>")


@pytest.fixture(scope="module")
def moto_url() -> Iterator[str]:
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


class World:
    """A moto account with a VPC, an EKS cluster and GPU node groups, plus our hooks."""

    def __init__(self, url: str, cluster: str) -> None:
        self.url = url
        self.session = boto3.session.Session(
            aws_access_key_id="testing", aws_secret_access_key="testing", region_name=REGION,
        )
        self.reservations = CapacityReservations()
        self.eks_errors: list[AWSResponse] = []
        self.quotas = self.session.client("service-quotas", config=Config(**FAIL_FAST))
        self.stub = Stubber(self.quotas)
        self.clients: dict[str, Any] = {}
        ec2, eks = self.client("ec2"), self.client("eks")
        vpc = ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
        self.subnets = {
            z: ec2.create_subnet(VpcId=vpc, CidrBlock=f"10.0.{i}.0/24", AvailabilityZone=f"{REGION}{z}")
            ["Subnet"]["SubnetId"] for i, z in enumerate("ab")
        }
        eks.create_cluster(name=cluster, roleArn=ROLE, resourcesVpcConfig={"subnetIds": list(self.subnets.values())})
        for name, zones, itype, cap in (("h100-a", "a", "p5.48xlarge", "ON_DEMAND"),
                                        ("h100-b", "b", "p5.48xlarge", "SPOT"),
                                        ("cpu", "ab", "m5.large", "ON_DEMAND")):
            eks.create_nodegroup(
                clusterName=cluster, nodegroupName=name, nodeRole=ROLE, instanceTypes=[itype], capacityType=cap,
                subnets=[self.subnets[z] for z in zones], scalingConfig={"minSize": 0, "maxSize": 4, "desiredSize": 0},
            )
        self.provider = EksProvider(cluster, REGION, client_factory=self.factory)

    def client(self, service: str, region: str = REGION) -> Any:
        if service == "service-quotas":
            return self.quotas
        if service not in self.clients:
            c = self.session.client(service, region_name=region, endpoint_url=self.url, config=Config(**FAIL_FAST))
            if service == "ec2":
                c.meta.events.register("before-send.ec2", self.reservations)
            if service == "eks":
                c.meta.events.register("before-send.eks", lambda **_: self.eks_errors.pop(0) if self.eks_errors else None)
            self.clients[service] = c
        return self.clients[service]

    def factory(self, service: str, region: str) -> Any:
        return self.client(service, region)


_n = itertools.count()


@pytest.fixture
def world(moto_url: str) -> World:
    return World(moto_url, f"c{next(_n)}")


def quota_response(code: str, value: float) -> dict[str, Any]:
    return {"Quota": {"ServiceCode": "ec2", "QuotaCode": code, "QuotaName": code, "Value": value}}


def test_is_a_capacity_provider(world: World) -> None:
    assert isinstance(world.provider, CapacityProvider)


def test_pools_lists_gpu_node_groups_with_zones(world: World) -> None:
    pools = {p.ref.pool: p for p in world.provider.pools(REGION)}
    assert set(pools) == {"h100-a", "h100-b"}  # the CPU group is skipped
    a, b = pools["h100-a"], pools["h100-b"]
    assert (a.ref.zone, a.accelerator, a.gpus_per_node, a.max_size, a.spot) == ("us-east-1a", "h100-80gb", 8, 4, False)
    assert (b.ref.zone, b.spot) == ("us-east-1b", True)


def test_resize_sets_desired_size_once_and_checks_max(world: World) -> None:
    p = world.provider
    ref = PoolRef("h100-a", "us-east-1a", REGION)
    op = p.resize(ref, 3, OWNER)
    assert p.operation(op).status is OpStatus.DONE
    again = p.resize(ref, 3, OWNER)
    assert again.done and again.id.endswith("noop")
    ng = world.client("eks").describe_nodegroup(clusterName=p.cluster, nodegroupName="h100-a")["nodegroup"]
    assert ng["scalingConfig"] == {"minSize": 0, "maxSize": 4, "desiredSize": 3}
    with pytest.raises(InvalidSpec, match="0..4"):
        p.resize(ref, 5, OWNER)


def test_missing_node_group_and_cluster_are_not_found(world: World) -> None:
    with pytest.raises(NotFound, match="node group 'nope'"):
        world.provider.resize(PoolRef("nope", "us-east-1a", REGION), 1, OWNER)
    ghost = EksProvider("ghost", REGION, client_factory=world.factory)
    with pytest.raises(NotFound, match="EKS cluster 'ghost'"):
        ghost.pools(REGION)


def test_bad_region_is_not_found(world: World) -> None:
    with pytest.raises(NotFound, match="not an AWS region"):
        world.provider.quota("h100-80gb", "mars-north-1", spot=False)


def test_launch_failure_health_issue_fails_the_operation(world: World) -> None:
    op = world.provider.resize(PoolRef("h100-a", "us-east-1a", REGION), 2, OWNER)
    ng = {"nodegroup": {"nodegroupName": "h100-a", "status": "DEGRADED", "scalingConfig": {},
                        "health": {"issues": [{"code": "AsgInstanceLaunchFailures",
                                               "message": "InsufficientInstanceCapacity: no p5 in us-east-1a"}]}}}
    world.eks_errors.append(respond(200, json.dumps(ng)))
    done = world.provider.operation(op)
    assert done.status is OpStatus.FAILED and isinstance(done.error, CapacityUnavailable)
    assert done.error.fields["zone"] == "us-east-1a"


def test_quota_counts_vcpus_of_running_family_instances(world: World) -> None:
    ec2, asg = world.client("ec2"), world.client("autoscaling")
    image = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    asg.create_launch_configuration(LaunchConfigurationName=f"lc-{world.provider.cluster}", ImageId=image,
                                    InstanceType="p4d.24xlarge")
    asg.create_auto_scaling_group(
        AutoScalingGroupName=f"g-{world.provider.cluster}", LaunchConfigurationName=f"lc-{world.provider.cluster}",
        MinSize=0, MaxSize=4, DesiredCapacity=0, VPCZoneIdentifier=world.subnets["a"],
    )
    before = world.provider.quota("h100-80gb", REGION, spot=False)  # noqa: F841 - usage baseline below
    asg.set_desired_capacity(AutoScalingGroupName=f"g-{world.provider.cluster}", DesiredCapacity=2)
    world.stub.add_response("get_service_quota", quota_response("L-417A185B", 1152.0),
                            {"ServiceCode": "ec2", "QuotaCode": "L-417A185B"})
    world.stub.activate()
    (row,) = world.provider.quota("h100-80gb", REGION, spot=False)
    world.stub.deactivate()
    assert (row.metric, row.unit, row.limit, row.status) == ("L-417A185B", "vcpus", 1152.0, "ok")
    assert row.usage is not None and before[0].usage is not None
    assert row.usage - (before[0].usage or 0) == 192.0  # two p4d.24xlarge at 96 vCPUs
    assert "L-417A185B" in row.raise_path


def test_quota_unreadable_is_unknown_not_ok(world: World) -> None:
    world.stub.add_client_error("get_service_quota", service_error_code="AccessDeniedException",
                                service_message="not allowed", http_status_code=403)
    world.stub.activate()
    (row,) = world.provider.quota("l4", REGION, spot=True)
    world.stub.deactivate()
    assert row.metric == "L-3819A6DF" and row.status == "unknown" and row.free is None
    assert "servicequotas:GetServiceQuota" in row.reason


def test_quota_falls_back_to_default_value(world: World) -> None:
    world.stub.add_client_error("get_service_quota", service_error_code="NoSuchResourceException", http_status_code=404)
    world.stub.add_response("get_aws_default_service_quota", quota_response("L-7212CCBC", 64.0))
    world.stub.activate()
    (row,) = world.provider.quota("a100-40gb", REGION, spot=True)
    world.stub.deactivate()
    assert (row.metric, row.limit, row.status) == ("L-7212CCBC", 64.0, "ok")


def test_missing_credentials_raise_permission_denied(moto_url: str) -> None:
    from botocore.session import Session as BotoSession

    bare = BotoSession()
    bare.set_credentials(None, None)  # type: ignore[arg-type]

    def factory(service: str, region: str) -> Any:
        s = boto3.session.Session(botocore_session=BotoSession(), region_name=region)
        s._session._credentials = None  # no credential chain at all
        s._session.get_credentials = lambda: None  # type: ignore[method-assign]
        return s.client(service, endpoint_url=moto_url, config=Config(**FAIL_FAST))

    p = EksProvider("c", REGION, client_factory=factory)
    with pytest.raises(PermissionDenied, match="no usable AWS credentials"):
        p.quota("h100-80gb", REGION, spot=False)
    with pytest.raises(PermissionDenied):
        p.resize(PoolRef("h100-a", "us-east-1a", REGION), 1, OWNER)


def test_reserve_is_idempotent_owned_and_released(world: World) -> None:
    p = world.provider
    req = ReservationRequest("kfp-gpu-run-1", "us-east-1a", "h100-80gb", 8, 2)
    op1 = p.reserve(req, OWNER)
    op2 = p.reserve(req, OWNER)
    assert op1.id == op2.id and len(world.reservations.items) == 1
    (cr,) = world.reservations.items.values()
    assert cr["type"] == "p5.48xlarge" and cr["tags"]["kfp-gpu.io/run-id"] == "run-1"
    assert p.operation(op1).status is OpStatus.DONE
    with pytest.raises(CloudError, match="belongs to run"):
        p.reserve(req, Owner("run-2", "warm-pool", 0))
    assert [o.name for o in p.list_owned("run-1")] == ["kfp-gpu-run-1"]
    assert p.release("run-1") == ["kfp-gpu-run-1"]
    assert p.release("run-1") == [] and p.list_owned("run-1") == []


def test_reserve_stockout_is_zone_scoped(world: World) -> None:
    world.reservations.fail_next += [respond(200, (
        f"<DescribeCapacityReservationsResponse {CapacityReservations.NS}><capacityReservationSet/>"
        "</DescribeCapacityReservationsResponse>")), ec2_error("InsufficientInstanceCapacity", 500)]
    with pytest.raises(CapacityUnavailable) as ei:
        world.provider.reserve(ReservationRequest("r", "us-east-1b", "h100-80gb", 8, 1), OWNER)
    assert ei.value.fields["zone"] == "us-east-1b"


def test_capacity_block_offerings_cheapest_first(world: World) -> None:
    offers = world.provider.capacity_block_offerings("h100-80gb", 8, 2, 24)
    assert [(o["zone"], o["upfront_fee"]) for o in offers] == [("us-east-1b", 750.5), ("us-east-1a", 900.0)]
    assert offers[0]["instance_type"] == "p5.48xlarge"


def test_request_quota_increase(world: World) -> None:
    world.stub.add_response("get_service_quota", quota_response("L-417A185B", 192.0))
    world.stub.add_response(
        "request_service_quota_increase", {"RequestedQuota": {"Id": "req-1", "QuotaCode": "L-417A185B"}},
        {"ServiceCode": "ec2", "QuotaCode": "L-417A185B", "DesiredValue": 768.0},
    )
    world.stub.add_response("get_service_quota", quota_response("L-417A185B", 192.0))
    world.stub.add_client_error("request_service_quota_increase", "ResourceAlreadyExistsException")
    world.stub.add_response("list_requested_service_quota_change_history_by_quota",
                            {"RequestedQuotas": [{"Id": "req-1"}]})
    world.stub.add_response("get_service_quota", quota_response("L-417A185B", 192.0))
    world.stub.activate()
    assert world.provider.request_quota_increase("L-417A185B", REGION, 768, "llm training") == "req-1"
    assert world.provider.request_quota_increase("L-417A185B", REGION, 768, "again") == "req-1"
    with pytest.raises(InvalidSpec, match="above the current"):
        world.provider.request_quota_increase("L-417A185B", REGION, 96, "less")
    world.stub.assert_no_pending_responses()
    world.stub.deactivate()


def test_fail_fast_client_config_makes_one_attempt(world: World) -> None:
    attempts: list[int] = []
    world.eks_errors += [respond(500, json.dumps({"message": "boom"}), {"x-amzn-ErrorType": "InsufficientInstanceCapacity"})]
    world.client("eks").meta.events.register("request-created.eks", lambda **_: attempts.append(1))
    with pytest.raises(CapacityUnavailable):
        world.provider.resize(PoolRef("h100-a", "us-east-1a", REGION), 1, OWNER)
    assert attempts == [1]


def test_concurrent_clients_are_shared(world: World) -> None:
    seen = []
    threads = [threading.Thread(target=lambda: seen.append(id(world.provider.client("eks")))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(seen)) == 1
