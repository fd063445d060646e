"""EksProvider (real boto3) against the AWS stand-in (kfp_gpu_rehearsal.sim.aws) in virtual time."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kfp_gpu.errors import CapacityUnavailable, RateLimited
from kfp_gpu.ownership import Owner
from kfp_gpu.providers.base import OpStatus, PoolRef
from kfp_gpu.providers.eks import EksProvider
from kfp_gpu_rehearsal.sim.aws import AwsSimServer
from kfp_gpu_rehearsal.sim.aws.scenario import from_dict
from kfp_gpu_rehearsal.sim.clock import Timeline, compress

OWNER = Owner("run-1", "scale-up", 2_000_000_000.0)
BOOT = {"dist": "fixed", "median_s": 200}


def scenario(**over: Any) -> dict[str, Any]:
    raw: dict[str, Any] = {
        "cluster": "c1",
        "nodegroups": [
            {"name": "spot-a", "instance_type": "p4d.24xlarge", "zone": "us-east-1a", "capacity_type": "SPOT",
             "max_size": 4, "boot": BOOT},
            {"name": "od-b", "instance_type": "p4d.24xlarge", "zone": "us-east-1b", "max_size": 4, "boot": BOOT,
             "autoscaler_tag": True},
        ],
        "quotas": {"L-417A185B": 768, "L-7212CCBC": 384},
    }
    raw.update(over)
    return raw


@contextlib.contextmanager
def _make(raw: dict[str, Any]) -> Iterator[tuple[AwsSimServer, EksProvider, Timeline]]:
    tl = Timeline(virtual=True)
    sim = AwsSimServer(from_dict(raw), timeline=tl)
    url = sim.start()

    def lookup(names: Any) -> dict[str, str]:  # what the Nodes' spec.providerID says (no cluster here)
        return {n: sim.backend.bodies[n]["spec"]["providerID"] for n in names if n in sim.backend.bodies}
    try:
        yield sim, EksProvider("c1", "us-east-1", endpoint_url=url, node_lookup=lookup), tl
    finally:
        sim.stop()


@pytest.fixture
def env() -> Iterator[tuple[AwsSimServer, EksProvider, Timeline]]:
    with _make(scenario()) as made:
        yield made


def advance(sim: AwsSimServer, tl: Timeline, real_s: float) -> None:
    tl.advance(compress(real_s))
    sim.world.drain_backend()


def test_scheme_pools_and_quota(env: Any) -> None:
    _sim, p, _tl = env
    assert p.scheme == "eks"
    pools = {s.ref.pool: s for s in p.pools("us-east-1")}
    assert pools["spot-a"].ref.zone == "us-east-1a" and pools["spot-a"].spot and pools["spot-a"].gpus_per_node == 8
    assert pools["od-b"].autoscaling and not pools["spot-a"].autoscaling
    q = p.quota("a100-40gb", "us-east-1", spot=True)[0]
    assert (q.limit, q.usage, q.status) == (384.0, 0.0, "ok")


def test_resize_runs_until_the_update_is_done(env: Any) -> None:
    sim, p, tl = env
    op = p.resize(PoolRef("spot-a", "us-east-1a", "us-east-1"), 2, OWNER)
    assert p.operation(op).status is OpStatus.RUNNING
    advance(sim, tl, 41)
    assert p.operation(op).status is OpStatus.DONE
    act = p.pool_activity(PoolRef("spot-a", "us-east-1a", "us-east-1"))
    assert (act.target, act.running, act.creating) == (2, 0, 2)
    advance(sim, tl, 201)
    assert p.pool_activity(PoolRef("spot-a", "us-east-1a", "us-east-1")).running == 2
    assert p.quota("a100-40gb", "us-east-1", spot=True)[0].usage == 192.0


def test_stockout_fails_the_operation_in_that_zone_and_shows_in_activity() -> None:
    with _make(scenario(stockouts=[{"zone": "us-east-1a"}])) as (sim, p, tl):
        ref = PoolRef("spot-a", "us-east-1a", "us-east-1")
        op = p.resize(ref, 1, OWNER)
        advance(sim, tl, 41)
        done = p.operation(op)
        assert done.status is OpStatus.FAILED and isinstance(done.error, CapacityUnavailable)
        assert done.error.fields["zone"] == "us-east-1a"
        errs = p.pool_activity(ref).errors
        assert errs and errs[-1].stockout and errs[-1].code == "InsufficientInstanceCapacity"


def test_delete_nodes_terminates_exactly_the_named_nodes_and_shrinks(env: Any) -> None:
    sim, p, tl = env
    ref = PoolRef("od-b", "us-east-1b", "us-east-1")
    p.resize(ref, 3, OWNER)
    advance(sim, tl, 300)
    names = sorted(sim.backend.bodies)
    mine = names[:2]  # Auto Scaling's own scale-in would pick the newest, not these
    op = p.delete_nodes(ref, mine)
    assert op.kind == "delete-nodes" and op.status is OpStatus.RUNNING
    assert {s.ref.pool: s.size for s in p.pools("us-east-1")}["od-b"] == 1  # decremented at once
    advance(sim, tl, 46)
    assert p.operation(op).status is OpStatus.DONE
    assert sorted(sim.backend.bodies) == names[2:]
    assert {s.ref.pool: s.size for s in p.pools("us-east-1")}["od-b"] == 1
    again = p.delete_nodes(ref, mine)  # idempotent: gone nodes are skipped
    assert again.status is OpStatus.DONE


def test_delete_nodes_falls_back_to_private_dns_names(env: Any) -> None:
    sim, p, tl = env
    ref = PoolRef("od-b", "us-east-1b", "us-east-1")
    p.resize(ref, 2, OWNER)
    advance(sim, tl, 300)
    p.node_lookup = lambda names: {}  # no Kubernetes access: EC2 DescribeInstances(private-dns-name)
    victim = sorted(sim.backend.bodies)[0]
    p.delete_nodes(ref, [victim])
    advance(sim, tl, 46)
    assert victim not in sim.backend.bodies and len(sim.backend.bodies) == 1


def test_throttled_calls_are_rate_limited() -> None:
    with _make(scenario(throttle={"read_burst": 1, "read_refill_per_s": 0.0001})) as (_sim, p, _tl):
        p._nodegroup("spot-a", "us-east-1")
        with pytest.raises(RateLimited):
            p._nodegroup("spot-a", "us-east-1")


def test_every_aws_action_the_provider_calls_is_documented_in_rbac_iam(env: Any) -> None:
    """docs/rbac-iam.md section 3 lists each IAM action the node-group backend needs; the stand-in's request log
    (service:Action as IAM spells them) says which ones the provider really calls."""
    sim, p, tl = env
    ref = PoolRef("od-b", "us-east-1b", "us-east-1")
    p.pools("us-east-1")
    p.quota("a100-40gb", "us-east-1", spot=False)
    op = p.resize(ref, 2, OWNER)
    advance(sim, tl, 300)
    p.operation(op)
    p.pool_activity(ref)
    p.node_lookup = lambda names: {}
    p.delete_nodes(ref, sorted(sim.backend.bodies)[:1])
    doc = (Path(__file__).resolve().parents[2] / "docs" / "rbac-iam.md").read_text()
    called = set(sim.requests)
    assert {"autoscaling:TerminateInstanceInAutoScalingGroup", "eks:UpdateNodegroupConfig"} <= called
    assert not [a for a in called if f"`{a}`" not in doc and f'"{a}"' not in doc], called
