"""Cloud IAM, proven like RBAC: the stand-ins enforce the shipped roles (deploy/), and each permission is needed.

For every permission of ``deploy/gcp-role.yaml`` and every action of ``deploy/aws-policy.json``, a principal holding
the role minus that one permission drives the provider operation that needs it (direct provider calls against
in-process stand-ins, nodes in memory) and gets the one-line PermissionDenied naming it and the file to fix.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from google.oauth2.credentials import Credentials

from kfp_gpu import iam
from kfp_gpu.errors import KfpGpuError, PermissionDenied
from kfp_gpu.ownership import Owner
from kfp_gpu.providers.base import Operation, PoolRef, ReservationRequest
from kfp_gpu.providers.eks import EksProvider
from kfp_gpu.providers.gke import GkeProvider
from kfp_gpu.providers.gke import pools as gke_pools
from kfp_gpu.provisioners.node_pool import release_slots
from kfp_gpu.retry import RetryPolicy
from kfp_gpu_rehearsal.sim import SimServer
from kfp_gpu_rehearsal.sim.aws import AwsSimServer
from kfp_gpu_rehearsal.sim.aws.scenario import from_dict as aws_scenario
from kfp_gpu_rehearsal.sim.clock import Timeline, compress
from tests.sim._helpers import CLUSTER, PROJECT, REGION, running, scenario
from tests.waiting import wait_until

pytestmark = pytest.mark.integration

OWNER = Owner("run-iam", "scale-up", 2_000_000_000.0)
FAST = RetryPolicy(attempts=2, budget_s=2.0, base_s=0.01, cap_s=0.02)
ZONE = "us-central1-b"
REF = PoolRef("l4-b", ZONE, REGION)
PRE_FIX_ROLE = frozenset({  # docs/rbac-iam.md's kfpGpuProvisioner before the role became deploy/gcp-role.yaml
    "container.clusters.get", "container.nodePools.get", "container.nodePools.list", "container.nodePools.update",
    "container.operations.get", "compute.instanceGroupManagers.get", "compute.instanceGroupManagers.list",
    "compute.zoneOperations.get", "compute.regions.get", "compute.projects.get", "compute.reservations.create",
    "compute.reservations.delete", "compute.reservations.list", "compute.reservations.get",
    "cloudquotas.quotas.get", "serviceusage.services.use"})


# ---- GKE -------------------------------------------------------------------------------------------
@pytest.fixture
def gsim() -> Iterator[SimServer]:
    with running(scenario(api={"error_rate": 0})) as s:
        yield s


def _gke(sim: SimServer, token: str = iam.SIM_GCP_TOKEN) -> GkeProvider:
    return GkeProvider(PROJECT, REGION, CLUSTER, endpoint=sim.url, credentials=Credentials(token=token), retry=FAST)


def _done(p: Any, op: Operation, timeout: float = 20.0) -> Operation:
    deadline = time.monotonic() + timeout
    while not op.done and time.monotonic() < deadline:
        time.sleep(0.05)
        op = p.operation(op)
    return op


def _grown(sim: SimServer, n: int = 1) -> list[str]:
    """``n`` nodes of l4-b, grown with the full role."""
    p = _gke(sim)
    _done(p, p.resize(REF, p.pool(REF).size + n, OWNER))
    wait_until("the pool's nodes", lambda: len(sim.nodes("l4-b")) >= n, timeout=30, every=0.05)
    return sim.nodes("l4-b")[-n:]


def _quota_reason(rows: list[Any]) -> str:
    return " ".join(r.reason for r in rows if r.status == "unknown")


# permission -> the provider operation that needs it; returns the refusal (raised, or the reason of a quota row)
GCP_OPS: dict[str, Callable[[GkeProvider, SimServer], Any]] = {
    "container.clusters.get": lambda p, s: p.pools(REGION),  # nodePools.list
    "container.clusters.update": lambda p, s: p.resize(REF, p.pool(REF).size + 1, OWNER),  # nodePools.setSize
    "container.operations.get": lambda p, s: p.operation(_gke(s).resize(REF, _gke(s).pool(REF).size + 1, OWNER)),
    "compute.instanceGroupManagers.get": lambda p, s: p.pool_activity(REF),
    "compute.instanceGroupManagers.list": lambda p, s: gke_pools.igm_target_sizes(p),
    "compute.instanceGroupManagers.update": lambda p, s: p.delete_nodes(REF, _grown(s)),
    "compute.zoneOperations.get": lambda p, s: p.operation(_gke(s).delete_nodes(REF, _grown(s))),
    "compute.projects.get": lambda p, s: _quota_reason(p.quota("l4", REGION, spot=False)),
    "compute.regions.get": lambda p, s: _quota_reason(p.quota("l4", REGION, spot=False)),
    "cloudquotas.quotas.get": lambda p, s: _quota_reason(p.quota("h100-80gb", REGION, spot=False)),
    "compute.reservations.get": lambda p, s: p.reserve(ReservationRequest("", ZONE, "l4", 1, 1), OWNER),
    "compute.reservations.create": lambda p, s: p.reserve(ReservationRequest("", ZONE, "l4", 1, 1),
                                                          Owner("run-create", "warm-pool", 2_000_000_000.0)),
    "compute.reservations.list": lambda p, s: p.list_owned("run-iam"),
    "compute.reservations.delete": lambda p, s: (
        _gke(s).reserve(ReservationRequest("", ZONE, "l4", 1, 1), Owner("run-del", "warm-pool", 2_000_000_000.0)),
        p.release("run-del")),
}


def _refusal(fn: Callable[[], Any]) -> str:
    try:
        out = fn()
    except PermissionDenied as exc:
        return str(exc)
    return out if isinstance(out, str) else f"no refusal: {out!r}"


def test_every_gcp_permission_is_driven() -> None:
    assert set(GCP_OPS) == iam.gcp_permissions(iam.GCP_ROLE)


@pytest.mark.parametrize("permission", sorted(iam.gcp_permissions(iam.GCP_ROLE)))
def test_gcp_role_minus_one_permission_fails_in_one_line_naming_it(gsim: SimServer, permission: str) -> None:
    token = f"ya29.without-{permission}"
    gsim.grant(token, iam.gcp_permissions(iam.GCP_ROLE) - {permission})
    text = _refusal(lambda: GCP_OPS[permission](_gke(gsim, token), gsim))
    assert f"missing IAM permission {permission}" in text, text
    assert f"add {permission} to includedPermissions in deploy/gcp-role.yaml" in text, text
    assert "\n" not in text and "Traceback" not in text
    with running(scenario(api={"error_rate": 0})) as fresh:  # the shipped role makes the same calls
        assert "PermissionDenied" not in _refusal(lambda: GCP_OPS[permission](_gke(fresh), fresh))


def test_the_pre_fix_role_fails_teardowns_delete_instances(gsim: SimServer) -> None:
    """The role docs/rbac-iam.md shipped before: teardown's pool restore and recovery's slot release call
    instanceGroupManagers.deleteInstances, which needs compute.instanceGroupManagers.update."""
    gsim.grant("ya29.pre-fix-role", PRE_FIX_ROLE)
    old = _gke(gsim, "ya29.pre-fix-role")
    victims = _grown(gsim, 2)
    with pytest.raises(PermissionDenied) as err:
        old.delete_nodes(REF, victims[:1])  # teardown's _restore_pools deleter
    assert err.value.fields["permission"] == "compute.instanceGroupManagers.update"
    assert "Required 'compute.instanceGroupManagers.update' permission for " \
           f"'projects/{PROJECT}/zones/{ZONE}/instanceGroupManagers/" in str(err.value)
    errors = release_slots(old, REGION, {victims[1]: ("l4-b", ZONE)}, OWNER)  # recovery's slot release
    assert len(errors) == 1 and "missing IAM permission compute.instanceGroupManagers.update" in errors[0]
    assert set(gsim.nodes("l4-b")) >= set(victims)  # nothing was deleted
    ok = _gke(gsim).delete_nodes(REF, victims)  # the shipped role
    assert _done(_gke(gsim), ok).error is None


def test_anonymous_and_unknown_tokens_are_refused_401(gsim: SimServer, monkeypatch: pytest.MonkeyPatch) -> None:
    import urllib.error
    import urllib.request

    for headers, said in (({}, b"Request is missing required authentication credential"),
                          ({"Authorization": "Bearer ya29.nobody"}, b"Request had invalid authentication credentials")):
        req = urllib.request.Request(f"{gsim.url}/compute/v1/projects/{PROJECT}", headers=headers)
        with pytest.raises(urllib.error.HTTPError) as raw:
            urllib.request.urlopen(req, timeout=10)
        body = raw.value.read()
        assert raw.value.code == 401 and b'"UNAUTHENTICATED"' in body and said in body, body
        assert raw.value.headers["WWW-Authenticate"].startswith("Bearer")
    # google-auth answers a 401 by refreshing the credentials, which anonymous / bare-token ones cannot
    monkeypatch.delenv(iam.SIM_GCP_TOKEN_ENV, raising=False)
    anon = GkeProvider(PROJECT, REGION, CLUSTER, endpoint=gsim.url, retry=FAST)  # no token: anonymous
    for p in (anon, _gke(gsim, "ya29.nobody")):
        with pytest.raises(PermissionDenied, match="credentials are missing or expired") as err:
            p.pools(REGION)
        assert f"set {iam.SIM_GCP_TOKEN_ENV}" in err.value.remediation and "\n" not in str(err.value)


# ---- EKS -------------------------------------------------------------------------------------------
BOOT = {"dist": "fixed", "median_s": 200}
AWS_REF = PoolRef("od-b", "us-east-1b", "us-east-1")


@contextlib.contextmanager
def _aws() -> Iterator[tuple[AwsSimServer, Timeline]]:
    tl = Timeline(virtual=True)
    sim = AwsSimServer(aws_scenario({
        "cluster": "c1", "quotas": {"L-417A185B": 768, "L-7212CCBC": 384},
        "nodegroups": [{"name": "od-b", "instance_type": "p4d.24xlarge", "zone": "us-east-1b", "max_size": 4,
                        "boot": BOOT}]}), timeline=tl)
    sim.start()
    try:
        yield sim, tl
    finally:
        sim.stop()


@pytest.fixture
def asim() -> Iterator[tuple[AwsSimServer, Timeline]]:
    with _aws() as made:
        yield made


def _eks(sim: AwsSimServer, monkeypatch: pytest.MonkeyPatch, key: str = iam.SIM_AWS_KEY_ID,
         lookup: bool = True) -> EksProvider:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "any")  # the stand-in does not verify signatures

    def providers(names: Any) -> dict[str, str]:
        return {n: sim.backend.bodies[n]["spec"]["providerID"] for n in names if n in sim.backend.bodies}
    return EksProvider("c1", "us-east-1", endpoint_url=sim.url, node_lookup=providers if lookup else lambda n: {})


def _booted(sim: AwsSimServer, tl: Timeline, mp: pytest.MonkeyPatch) -> list[str]:
    full = _eks(sim, mp)
    full.resize(AWS_REF, 2, OWNER)
    tl.advance(compress(300))
    sim.world.drain_backend()
    return sorted(sim.backend.bodies)


def _aws_reserve(p: EksProvider, run: str = "run-iam") -> Any:
    return p.reserve(ReservationRequest("", "us-east-1b", "a100-40gb", 8, 1), Owner(run, "warm-pool", 2e9))


def _reserve_then_release(sim: AwsSimServer, mp: pytest.MonkeyPatch, key: str) -> Any:
    _aws_reserve(_eks(sim, mp), "run-rel")
    return _eks(sim, mp, key).release("run-rel")


# action -> (operation(sim, timeline, monkeypatch, key) -> refusal text or result)
AWS_OPS: dict[str, Callable[..., Any]] = {
    "eks:DescribeCluster": lambda s, tl, mp, k: _eks(s, mp, k).pools("us-east-1"),
    "eks:ListNodegroups": lambda s, tl, mp, k: _eks(s, mp, k).pools("us-east-1"),
    "eks:DescribeNodegroup": lambda s, tl, mp, k: _eks(s, mp, k).resize(AWS_REF, 1, OWNER),
    "eks:UpdateNodegroupConfig": lambda s, tl, mp, k: _eks(s, mp, k).resize(AWS_REF, 1, OWNER),
    "ec2:DescribeSubnets": lambda s, tl, mp, k: _eks(s, mp, k).pools("us-east-1"),
    "autoscaling:DescribeAutoScalingGroups": lambda s, tl, mp, k: _eks(s, mp, k).pool_activity(AWS_REF),
    "autoscaling:DescribeScalingActivities": lambda s, tl, mp, k: _eks(s, mp, k).pool_activity(AWS_REF),
    "autoscaling:TerminateInstanceInAutoScalingGroup": lambda s, tl, mp, k: (
        (v := _booted(s, tl, mp)), _eks(s, mp, k).delete_nodes(AWS_REF, v[:1])),
    "ec2:DescribeInstances": lambda s, tl, mp, k: (
        (v := _booted(s, tl, mp)), _eks(s, mp, k, lookup=False).delete_nodes(AWS_REF, v[:1])),
    "servicequotas:GetServiceQuota": lambda s, tl, mp, k: " ".join(
        r.reason for r in _eks(s, mp, k).quota("a100-40gb", "us-east-1", spot=False)),
    "ec2:DescribeCapacityReservations": lambda s, tl, mp, k: _eks(s, mp, k).list_owned("run-iam"),
    "ec2:CreateCapacityReservation": lambda s, tl, mp, k: _aws_reserve(_eks(s, mp, k)),
    "ec2:CreateTags": lambda s, tl, mp, k: _aws_reserve(_eks(s, mp, k)),
    "ec2:CancelCapacityReservation": lambda s, tl, mp, k: _reserve_then_release(s, mp, k),
    "ec2:DescribeCapacityBlockOfferings": lambda s, tl, mp, k: _eks(s, mp, k).capacity_block_offerings(
        "h100-80gb", 8, 1, 24),
}
# actions of the policy no operation above drives against the stand-in, and why (each one the code calls:
# tests/unit/test_iam.py); a new action must land in AWS_OPS or here
AWS_NOT_DRIVEN = {
    "servicequotas:GetAWSDefaultServiceQuota": "only after GetServiceQuota answers NoSuchResourceException, which "
                                                "the stand-in never does for the P/G vCPU codes",
    "ec2:DescribeInstanceTypes": "only for an instance type outside kfp_gpu.accelerators without CpuOptions",
    "ec2:DescribeLaunchTemplateVersions": "only for a node group with a launch template (the default scenario's have "
                                          "none; tests/sim/test_sim_topology.py reads one as the controller)",
    "ec2:DescribePlacementGroups": "only for a launch template naming a placement group (none in the default "
                                   "scenario; tests/sim/test_sim_topology.py reads one as the controller)",
}


def test_every_aws_action_is_driven_or_named() -> None:
    assert set(AWS_OPS) | set(AWS_NOT_DRIVEN) == iam.aws_actions(iam.AWS_POLICY)
    assert not set(AWS_OPS) & set(AWS_NOT_DRIVEN)


def _aws_refusal(fn: Callable[[], Any]) -> str:
    try:
        out = fn()
    except KfpGpuError as exc:
        return f"{type(exc).__name__}: {exc}"
    return out if isinstance(out, str) else f"no refusal: {out!r}"


@pytest.mark.parametrize("action", sorted(AWS_OPS))
def test_aws_policy_minus_one_action_fails_in_one_line_naming_it(
        asim: tuple[AwsSimServer, Timeline], monkeypatch: pytest.MonkeyPatch, action: str) -> None:
    sim, tl = asim
    key = "AKIAWITHOUT" + str(sorted(AWS_OPS).index(action)).zfill(9)
    sim.grant(key, iam.aws_actions(iam.AWS_POLICY) - {action})
    text = _aws_refusal(lambda: AWS_OPS[action](sim, tl, monkeypatch, key))
    assert f"not authorized to perform: {action}" in text, text
    if not text.startswith("no refusal") and " (fix: " in text:  # raised: the fix names the policy file
        assert f"add {action} to the Allow statements of deploy/aws-policy.json" in text, text
    assert "\n" not in text and "Traceback" not in text


def test_aws_refusals_are_raised_with_the_fix(asim: tuple[AwsSimServer, Timeline],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    sim, _tl = asim
    sim.grant("AKIANORESIZE00000000", iam.aws_actions(iam.AWS_POLICY) - {"eks:UpdateNodegroupConfig"})
    with pytest.raises(PermissionDenied) as err:
        _eks(sim, monkeypatch, "AKIANORESIZE00000000").resize(AWS_REF, 1, OWNER)
    assert err.value.fields["action"] == "eks:UpdateNodegroupConfig"
    assert "add eks:UpdateNodegroupConfig to the Allow statements of deploy/aws-policy.json" in err.value.remediation


def test_aws_unsigned_and_unknown_keys_are_refused(asim: tuple[AwsSimServer, Timeline],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    sim, _tl = asim
    with pytest.raises(PermissionDenied, match="UnrecognizedClientException"):
        _eks(sim, monkeypatch, "AKIANOBODY0000000000").pools("us-east-1")
    import urllib.error
    import urllib.request

    req = urllib.request.Request(sim.url + "/", b"Action=DescribeInstances&Version=2016-11-15", method="POST")
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(req, timeout=10)
    assert err.value.code == 401 and b"<Code>MissingAuthenticationToken</Code>" in err.value.read()
