"""The GKE stand-in's topology (docs/sim.md, "Topology"): nodes carry GKE's block / sub-block / host labels, and a
node pool with a compact placement policy keeps its VMs in one block and fails a resize its block cannot hold.

Virtual time, in-memory nodes; the real google-cloud-container client reads the pool's placementPolicy.
"""

from __future__ import annotations

import collections

import pytest
from google.cloud import container_v1

from kfp_gpu.errors import InvalidSpec
from kfp_gpu_rehearsal.sim import from_dict
from kfp_gpu_rehearsal.sim.topology import BLOCK, HOST, SUBBLOCK
from tests.sim._helpers import CLUSTER, PARENT, PROJECT, client_kwargs, scenario
from tests.sim.test_sim_world import gke_op, pools, real, set_size, world

TOPO = {"block_nodes": 4, "subblock_nodes": 2, "blocks": 3}


def _blocks(backend, names):  # type: ignore[no-untyped-def]
    return collections.Counter(backend.labels[n][BLOCK] for n in names)


def test_initial_nodes_carry_block_subblock_and_host_labels() -> None:
    with world(topology=TOPO, pools=pools(**{"h100-80gb-a": {"initial_size": 6}})) as (sim, tl, backend):
        names = sim.nodes("h100-80gb-a")
        assert len(names) == 6
        labels = [backend.labels[n] for n in names]
        assert all({BLOCK, SUBBLOCK, HOST} <= set(lb) for lb in labels)
        assert len({lb[HOST] for lb in labels}) == 6  # one GPU VM per host
        by_block = _blocks(backend, names)
        assert max(by_block.values()) <= 4 and len(by_block) >= 2  # an unplaced pool scatters over blocks
        for b in by_block:  # a sub-block is inside one block: 2 hosts each
            subs = collections.Counter(lb[SUBBLOCK] for lb in labels if lb[BLOCK] == b)
            assert max(subs.values()) <= 2


def test_no_topology_block_means_no_labels() -> None:
    with world(pools=pools(**{"h100-80gb-a": {"initial_size": 2}})) as (sim, tl, backend):
        assert all(backend.labels[n] == {} for n in sim.nodes("h100-80gb-a"))


STRICT = {"placement_policy": "compact", "placement_max_distance": 1}  # a compact policy with a max distance


def test_compact_pool_lands_in_one_block_and_reports_its_policy() -> None:
    compact = pools(**{"h100-80gb-a": STRICT, "h100-80gb-spot-a": {"placement_policy": "compact"}})
    with world(topology=TOPO, pools=compact) as (sim, tl, backend):
        cm = container_v1.ClusterManagerClient(**client_kwargs(sim.url))
        got = cm.get_node_pool(name=f"{PARENT}/nodePools/h100-80gb-a")
        assert got.placement_policy.type_ == container_v1.NodePool.PlacementPolicy.Type.COMPACT
        assert got.placement_policy.policy_name == "h100-80gb-a-compact"
        plain = cm.get_node_pool(name=f"{PARENT}/nodePools/h100-80gb-b")
        assert plain.placement_policy.type_ == container_v1.NodePool.PlacementPolicy.Type.TYPE_UNSPECIFIED
        # the provider contract's placement, from nodePools.get/list: COMPACT is never taken as a guarantee (Compute v1
        # does not expose a policy's max distance, the one thing that holds VMs in a block)
        from kfp_gpu.providers.base import PoolRef
        from kfp_gpu.providers.gke import GkeProvider

        prov = GkeProvider(PROJECT, "us-central1", CLUSTER, endpoint=sim.url)
        states = {s.ref.pool: s for s in prov.pools("us-central1")}
        assert (states["h100-80gb-a"].placement, states["h100-80gb-a"].placement_group) == (
            "best-effort", "h100-80gb-a-compact")
        assert prov.pool(PoolRef("h100-80gb-a", "us-central1-a")).placement == "best-effort"
        assert (states["h100-80gb-spot-a"].placement, states["h100-80gb-spot-a"].placement_group) == (
            "best-effort", "COMPACT")
        assert (states["h100-80gb-b"].placement, states["h100-80gb-b"].placement_group) == ("", "")
        op = set_size(cm, "h100-80gb-a", 4)
        tl.advance(real(3 + 20 + 3600))
        assert gke_op(cm, op.name).status == container_v1.Operation.Status.DONE
        names = sim.nodes("h100-80gb-a")
        assert len(names) == 4 and len(_blocks(backend, names)) == 1


def test_compact_pool_resize_beyond_its_block_fails_at_once() -> None:
    compact = pools(**{"h100-80gb-a": {**STRICT, "initial_size": 3}})
    with world(topology=TOPO, pools=compact) as (sim, tl, backend):
        cm = container_v1.ClusterManagerClient(**client_kwargs(sim.url))
        op = set_size(cm, "h100-80gb-a", 5)  # its block has 4 hosts, 3 taken: 2 more do not fit
        done = gke_op(cm, op.name)
        assert done.status == container_v1.Operation.Status.DONE
        assert "does not have enough resources" in done.error.message or "ZONE_RESOURCE_POOL_EXHAUSTED" in str(done)
        assert len(sim.nodes("h100-80gb-a")) == 3
        op = set_size(cm, "h100-80gb-a", 4)  # the block's last host fits
        tl.advance(real(3 + 20 + 3600))
        assert not gke_op(cm, op.name).error.message
        assert len(_blocks(backend, sim.nodes("h100-80gb-a"))) == 1 and len(sim.nodes("h100-80gb-a")) == 4


def test_compact_resize_fails_when_its_block_is_full_though_the_zone_has_hosts() -> None:
    # the unplaced spot pool (same machine type) takes hosts wherever most are free, the compact pool's block too
    layout = pools(**{"h100-80gb-a": {**STRICT, "initial_size": 2}, "h100-80gb-spot-a": {"initial_size": 5}})
    with world(topology=TOPO, pools=layout, mig_retry_s=60) as (sim, tl, backend):
        hosts = sim.state.hosts
        site = "us-central1-a/a3-highgpu-8g"
        block = hosts.pool_block["h100-80gb-a"]
        assert hosts.free(site, block) == 1 and sum(hosts.free(site, b) for b in range(3)) == 5
        cm = container_v1.ClusterManagerClient(**client_kwargs(sim.url))
        op = set_size(cm, "h100-80gb-a", 4)  # 2 more: the zone has 5 free hosts, the pool's block 1
        assert "does not have enough resources" in gke_op(cm, op.name).error.message
        assert len(sim.nodes("h100-80gb-a")) == 2
        op = set_size(cm, "h100-80gb-a", 3)  # the block's last free host
        tl.advance(real(3 + 20 + 3600))
        assert not gke_op(cm, op.name).error.message and len(sim.nodes("h100-80gb-a")) == 3
        assert len(_blocks(backend, sim.nodes("h100-80gb-a"))) == 1


def test_a_best_effort_compact_pool_spills_into_another_block_when_its_own_is_full() -> None:
    # no max distance: Compute Engine places the VMs close while it can, and creates them elsewhere after
    compact = pools(**{"h100-80gb-a": {"placement_policy": "compact", "initial_size": 3}})
    with world(topology=TOPO, pools=compact) as (sim, tl, backend):
        cm = container_v1.ClusterManagerClient(**client_kwargs(sim.url))
        op = set_size(cm, "h100-80gb-a", 6)  # its block has 4 hosts: 2 VMs land in another block
        tl.advance(real(3 + 20 + 3600))
        assert not gke_op(cm, op.name).error.message
        names = sim.nodes("h100-80gb-a")
        assert len(names) == 6 and sorted(_blocks(backend, names).values()) == [2, 4]


def test_scenario_topology_is_validated_naming_the_field() -> None:
    with pytest.raises(InvalidSpec, match=r"topology\.subblock_nodes"):
        from_dict(scenario(topology={"block_nodes": 4, "subblock_nodes": 3}))
    with pytest.raises(InvalidSpec, match=r"pools\[0\]\.placement_policy"):
        data = scenario()
        data["pools"][0]["placement_policy"] = "spread"
        from_dict(data)
    for bad in ({"placement_max_distance": 2}, {"placement_policy": "compact", "placement_max_distance": 4}):
        data = scenario()
        data["pools"][0].update(bad)
        with pytest.raises(InvalidSpec, match=r"pools\[0\]\.placement_max_distance"):
            from_dict(data)
    with pytest.raises(InvalidSpec, match=r"initial_size"):  # a strict pool's VMs must fit its block
        from_dict_world = pools(**{"h100-80gb-a": {**STRICT, "initial_size": 5}})
        with world(topology=TOPO, pools=from_dict_world):
            pass


# ---- the AWS stand-in: cluster placement groups in launch templates, EKS network topology labels -------------
def _aws(groups: list[dict[str, object]]):  # type: ignore[no-untyped-def]
    from tests.sim.test_aws_world import _sim, scenario

    return _sim(scenario(nodegroups=groups, topology={"block_nodes": 4, "subblock_nodes": 2, "blocks": 2}))


def _layers(sim, group: str) -> list[dict[str, str]]:  # type: ignore[no-untyped-def]
    return [{k: v for k, v in b["metadata"]["labels"].items() if k.startswith("topology.k8s.aws/")}
            for b in sim.backend.bodies.values() if b["metadata"]["labels"]["eks.amazonaws.com/nodegroup"] == group]


def test_aws_cluster_placement_group_keeps_its_instances_in_one_layer2_domain_and_labels_them() -> None:
    from tests.sim.test_aws_world import advance, grow, ng

    # distinct boot seeds: a group's instance ids come from its boot sampler's seed
    groups = [{"name": "pg-a", "instance_type": "p4d.24xlarge", "zone": "us-east-1a", "max_size": 8,
               "placement_group": "train-cluster-pg", "boot": {"dist": "fixed", "median_s": 200, "seed": 1}},
              {"name": "loose-a", "instance_type": "p4d.24xlarge", "zone": "us-east-1a", "max_size": 8,
               "boot": {"dist": "fixed", "median_s": 200, "seed": 2}}]
    with _aws(groups) as (sim, c, tl):
        grow(c, "loose-a", 3)  # no placement group: scattered over the two layer-2 domains
        advance(sim, tl, 300)
        loose = _layers(sim, "loose-a")
        assert len(loose) == 3 and len({lb["topology.k8s.aws/network-node-layer-2"] for lb in loose}) == 2
        assert all(lb["topology.k8s.aws/network-node-layer-1"].startswith("nn-") for lb in loose)
        grow(c, "pg-a", 2)  # the placement group's domain: the one with room for both
        advance(sim, tl, 300)
        pg = _layers(sim, "pg-a")
        assert len(pg) == 2 and len({lb["topology.k8s.aws/network-node-layer-2"] for lb in pg}) == 1
        assert not ng(c, "pg-a")["health"]["issues"]
        # the tightest domain with room for both: the one loose-a holds 2 of 4 hosts in, now full
        grow(c, "pg-a", 4)
        advance(sim, tl, 300)
        issues = ng(c, "pg-a")["health"]["issues"]
        assert issues and "InsufficientInstanceCapacity" in issues[0]["message"], issues
        assert "placement group train-cluster-pg" in issues[0]["message"]
        site = "us-east-1a/p4d.24xlarge"
        assert len(_layers(sim, "pg-a")) == 2 and sim.world.hosts.free(site, 1 - sim.world.hosts.pool_block[
            "train-cluster-pg"]) == 3  # never outside the group's domain, though the other has 3 free hosts


def test_aws_spot_reclaim_frees_the_host_so_the_placement_groups_replacement_lands_in_its_domain() -> None:
    from tests.sim.test_aws_world import advance, grow, ng

    groups = [{"name": "pg-a", "instance_type": "p4d.24xlarge", "zone": "us-east-1a", "max_size": 8,
               "capacity_type": "SPOT", "placement_group": "pg-1", "boot": {"dist": "fixed", "median_s": 200}}]
    with _aws(groups) as (sim, c, tl):  # layer-2 domains of 4 hosts: the group fills one
        grow(c, "pg-a", 4)
        advance(sim, tl, 300)
        before = _layers(sim, "pg-a")
        assert len(before) == 4 and len({lb["topology.k8s.aws/network-node-layer-2"] for lb in before}) == 1
        victim = next(i.id for i in sim.world.instances.values() if i.state == "running")
        sim.world.interrupt(victim)
        advance(sim, tl, 600)  # the 2-minute notice, the reclaim, the replacement's launch and boot
        after = _layers(sim, "pg-a")
        assert len(after) == 4 and {lb["topology.k8s.aws/network-node-layer-2"] for lb in after} == \
            {before[0]["topology.k8s.aws/network-node-layer-2"]}
        assert not ng(c, "pg-a")["health"]["issues"]  # the reclaimed instance's host was free for its replacement


def test_aws_node_group_reports_its_launch_template_and_the_template_its_cluster_placement_group() -> None:
    import boto3
    from botocore.config import Config
    from botocore.exceptions import ClientError

    from kfp_gpu.providers.eks import EksProvider
    from tests.sim.test_aws_world import CLUSTER, ng

    groups = [{"name": "pg-a", "instance_type": "p4d.24xlarge", "zone": "us-east-1a", "placement_group": "pg-1"},
              {"name": "plain-a", "instance_type": "p4d.24xlarge", "zone": "us-east-1a"}]
    with _aws(groups) as (sim, c, tl):
        lt = ng(c, "pg-a")["launchTemplate"]
        assert "launchTemplate" not in ng(c, "plain-a")
        # the controller's policy reads them (deploy/aws-policy.json): the EKS provider's placement of a pool
        [ver] = c["ec2"].describe_launch_template_versions(LaunchTemplateName=lt["name"])["LaunchTemplateVersions"]
        assert ver["LaunchTemplateData"]["Placement"]["GroupName"] == "pg-1"
        [pg] = c["ec2"].describe_placement_groups(GroupNames=["pg-1"])["PlacementGroups"]
        assert (pg["GroupName"], pg["Strategy"], pg["State"]) == ("pg-1", "cluster", "available")
        with pytest.raises(ClientError) as unknown:  # EC2 names an unknown group
            c["ec2"].describe_placement_groups(GroupNames=["pg-2"])
        assert unknown.value.response["Error"]["Code"] == "InvalidPlacementGroup.Unknown"
        sim.grant("AKIAKFPGPUTOPOLOGY01", ["ec2:DescribeLaunchTemplateVersions"])
        ec2 = boto3.client("ec2", region_name="us-east-1", endpoint_url=sim.url, aws_access_key_id="AKIAKFPGPUTOPOLOGY01",
                           aws_secret_access_key="s", config=Config(retries={"total_max_attempts": 1}))
        with pytest.raises(ClientError) as denied:  # a principal without the action is refused it
            ec2.describe_placement_groups()
        assert denied.value.response["Error"]["Code"] == "UnauthorizedOperation"
        provider = EksProvider(CLUSTER, "us-east-1", client_factory=lambda service, region: c[service])
        pools = {p.ref.pool: p for p in provider.pools("us-east-1")}
        assert (pools["pg-a"].placement, pools["pg-a"].placement_group) == ("compact", "pg-1")
        assert (pools["plain-a"].placement, pools["plain-a"].placement_group) == ("spread", "")
