"""Topology-aware gangs on EKS managed node groups, against the AWS stand-in (kfp_gpu_rehearsal.sim.aws, docs/sim.md
A11): instances carry ``topology.k8s.aws/network-node-layer-N``; a node group whose launch template names a cluster
placement group keeps its instances in one layer-2 domain, one without scatters them.

* A required gang grows only the placement-group node group (the other matching group stays at 0), lands in one
  layer-2 domain, and a Spot replacement stays in the survivors' domain.
* A preferred gang fills the placement-group node group first, though it is named second, and spills the rest to
  the other group (preferred is never refused).
* Only groups without a cluster placement group: scale-up refuses at once in one line naming the fix, and preflight's
  topology row says SHORT; with the placement group, preflight says FITS and names its assumption.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Iterator

import pytest
from kubernetes import client

from kfp_gpu.cluster.capacity import Capacity
from kfp_gpu.errors import InvalidSpec
from kfp_gpu.plan.quota import Verdict
from kfp_gpu.providers.eks import EksProvider
from kfp_gpu.spec import CapacityType, ProvisioningSpec, Target
from kfp_gpu.steps.preflight import run_preflight
from kfp_gpu_rehearsal.devcluster.client import Kube
from kfp_gpu_rehearsal.sim.aws import AwsSimServer
from kfp_gpu_rehearsal.sim.aws.scenario import NodegroupSpec, default
from kfp_gpu_rehearsal.sim.topology import TopologySpec
from kfp_gpu_rehearsal.sim.worldspec import BootLatency
from tests.integration.standin_support import serving
from tests.waiting import wait_until

pytestmark = pytest.mark.integration
LAYER2 = "topology.k8s.aws/network-node-layer-2"
ZONE = "us-east-1a"
PG, LOOSE = "p4d-pg-a", "p4d-loose-a"


@pytest.fixture
def aws(kube: Kube, monkeypatch: pytest.MonkeyPatch) -> Iterator[AwsSimServer]:
    """Two Spot p4d node groups in one AZ of two layer-2 domains of 2 hosts: one in cluster placement group
    ``train-pg``, one without."""
    monkeypatch.setenv("KUBECONFIG", str(kube.kubeconfig))  # EksProvider reads Nodes' providerID with it
    cluster = f"eks-{uuid.uuid4().hex[:6]}"
    boot = {"dist": "fixed", "median_s": 40}
    groups = (NodegroupSpec(PG, "p4d.24xlarge", ZONE, "SPOT", max_size=2, placement_group="train-pg",
                            boot=BootLatency(**boot, seed=1)),  # type: ignore[arg-type]
              NodegroupSpec(LOOSE, "p4d.24xlarge", ZONE, "SPOT", max_size=2, boot=BootLatency(**boot, seed=2)))  # type: ignore[arg-type]
    sc = dataclasses.replace(default(), cluster=cluster, nodegroups=groups, zones=(ZONE,), device_plugin_s=20,
                             update_s=20, terminate_s=20, topology=TopologySpec(block_nodes=2, subblock_nodes=1, blocks=2))
    yield from serving(AwsSimServer(sc, str(kube.kubeconfig)), kube, cluster)


def _spec(aws: AwsSimServer, namespace: str, pools: tuple[str, ...]) -> ProvisioningSpec:
    return ProvisioningSpec(accelerator="a100-40gb", nodes=2, gpus_per_node=8, capacity=CapacityType.SPOT,
                            topology="required", topology_level="block", zones=(ZONE,), scale_up_deadline_s=60,
                            target=Target(kind="eks", cluster=aws.scenario.cluster, region="us-east-1",  # type: ignore[arg-type]
                                          pools=pools, endpoint=aws.url, namespace=namespace, provisioner="node-pool"))


def _layer2(kube: Kube, names: list[str]) -> dict[str, str]:
    core = client.CoreV1Api(kube.api)
    return {n: core.read_node(n).metadata.labels.get(LAYER2, "") for n in names}


def test_eks_required_gang_lands_in_the_placement_group_and_its_replacement_stays_in_the_domain(
    kube: Kube, namespace: str, aws: AwsSimServer, step_api: client.ApiClient,
) -> None:
    from kfp_gpu.steps import replace, scale_up

    spec = _spec(aws, namespace, (LOOSE, PG))  # the loose group first in priority: topology still picks the group
    provider = EksProvider.from_target(spec.target)
    pre = run_preflight(spec, provider, step_api, capacity_wait_s=1.0)
    row = next(c for c in pre.cluster_checks if c.name == "topology")
    assert row.verdict is Verdict.FITS, row
    assert f"pool {PG} can add 2 node(s) into one new block" in row.detail and "Assumed:" in row.detail, row.detail
    run_id = f"run-eks-topo-{namespace}"
    t0 = time.monotonic()
    cap = Capacity.from_json(scale_up.run(spec, run_id, "", api=step_api, provider=provider).output_json)
    took = time.monotonic() - t0
    gang = list(cap.nodes)
    domains = _layer2(kube, gang)
    assert len(gang) == 2 and len(set(domains.values())) == 1 and "" not in domains.values(), domains
    desired = {n: g["desired"] for n, g in aws.world.snapshot()["nodegroups"].items()}
    assert desired == {PG: 2, LOOSE: 0}, desired
    home = next(iter(domains.values()))
    victim, survivor = gang
    uid = client.CoreV1Api(kube.api).read_node(victim).metadata.uid
    aws.interrupt(victim)  # two minutes' notice, then EC2 terminates; the ASG launches a new instance in the group
    merged = replace.replace(spec, run_id, step_api, cap, [victim], zone_hint=ZONE, on_demand=False, attempt=1,
                             hook=None, lost_uids=[uid])
    now = _layer2(kube, list(merged.nodes))
    assert survivor in merged.nodes and victim not in merged.nodes and len(merged.nodes) == 2, merged.nodes
    assert set(now.values()) == {home}, now
    print(f"\nEKS gang in placement group train-pg, layer-2 {home}: scale-up {took:.2f} s; replacement {now}")


def test_eks_required_gang_without_a_cluster_placement_group_is_refused_in_one_line(
    kube: Kube, namespace: str, aws: AwsSimServer, step_api: client.ApiClient,
) -> None:
    from kfp_gpu.steps import scale_up

    spec = _spec(aws, namespace, (LOOSE,))
    provider = EksProvider.from_target(spec.target)
    pre = run_preflight(spec, provider, step_api, capacity_wait_s=1.0)
    row = next(c for c in pre.cluster_checks if c.name == "topology")
    assert row.verdict is Verdict.SHORT and f"pools {LOOSE} would add come without a cluster placement group" in \
        row.detail, row
    t0 = time.monotonic()
    with pytest.raises(InvalidSpec) as ei:
        scale_up.run(spec, f"run-eks-loose-{namespace}", "", api=step_api, provider=provider)
    took = time.monotonic() - t0
    msg = ei.value.message
    assert msg == (f"invalid topology='required': no matching pool keeps its new nodes in one block: {LOOSE} "
                   "launches them without a cluster placement group, and the cloud spreads them"), msg
    assert "placement group of strategy 'cluster'" in ei.value.remediation
    wait_until("no resize issued", lambda: aws.world.snapshot()["nodegroups"][LOOSE]["desired"] == 0, timeout=5)
    print(f"\nrefused in {took:.2f} s: {msg}")


def test_eks_preferred_topology_gang_fills_the_placement_group_first_and_spills_the_rest(
    kube: Kube, namespace: str, aws: AwsSimServer, step_api: client.ApiClient,
) -> None:
    from kfp_gpu.steps import scale_up

    spec = dataclasses.replace(_spec(aws, namespace, (LOOSE, PG)), nodes=3, topology="preferred")  # PG holds 2
    provider = EksProvider.from_target(spec.target)
    cap = Capacity.from_json(scale_up.run(spec, f"run-eks-pref-{namespace}", "", api=step_api,
                                          provider=provider).output_json)
    desired = {n: g["desired"] for n, g in aws.world.snapshot()["nodegroups"].items()}
    assert desired == {PG: 2, LOOSE: 1}, desired  # by target.pools' order alone it was LOOSE 2, PG 1
    domains = _layer2(kube, list(cap.nodes))
    group = {n: client.CoreV1Api(kube.api).read_node(n).metadata.labels.get("eks.amazonaws.com/nodegroup", "")
             for n in cap.nodes}
    in_pg = {domains[n] for n in cap.nodes if group[n] == PG}
    assert len(cap.nodes) == 3 and len(in_pg) == 1 and "" not in in_pg, (group, domains)
    print(f"\npreferred gang of 3: {sorted(group.values())}, placement group's nodes in layer-2 {in_pg}")
