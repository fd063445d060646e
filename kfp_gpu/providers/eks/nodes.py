"""EksProvider.delete_nodes: remove the run's own instances from a managed node group.

A plain resize lets Auto Scaling pick which instances go (its termination policy), which may be another
run's. Instead each named node's instance is terminated with Auto Scaling's
``TerminateInstanceInAutoScalingGroup(ShouldDecrementDesiredCapacity=True)``: that instance goes and the
group's desired capacity drops by one, which EKS syncs into the node group's ``scalingConfig``.
https://docs.aws.amazon.com/autoscaling/ec2/APIReference/API_TerminateInstanceInAutoScalingGroup.html
https://docs.aws.amazon.com/eks/latest/userguide/managed-node-groups.html

Node -> instance id: the Node's ``spec.providerID`` (``aws:///<az>/<instance-id>``, set by the AWS cloud
provider); names that are instance ids are taken as they are; the rest are looked up with EC2
``DescribeInstances`` filtered on ``private-dns-name`` (EKS names nodes by their private DNS name).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from kfp_gpu.errors import CloudError, KfpGpuError
from kfp_gpu.providers.base import Operation, OpStatus, PoolRef

if TYPE_CHECKING:
    from kfp_gpu.providers.eks.provider import EksProvider

log = logging.getLogger(__name__)
NodeLookup = Callable[[Sequence[str]], dict[str, str]]  # node names -> {name: providerID}
_INSTANCE = re.compile(r"^i-[0-9a-f]{8,17}$")
_GONE = ("Terminating", "Terminating:Wait", "Terminating:Proceed", "Terminated")


def instance_of(provider_id: str) -> str:
    """``aws:///us-east-1a/i-0abc`` -> ``i-0abc``; "" when it is not an AWS provider ID."""
    if not provider_id.startswith("aws://"):
        return ""
    last = provider_id.rstrip("/").rsplit("/", 1)[-1]
    return last if _INSTANCE.match(last) else ""


def kube_provider_ids(names: Sequence[str]) -> dict[str, str]:
    """``spec.providerID`` of the named Nodes, read with the step's own Kubernetes credentials. Best effort:
    no credentials or an unreadable Node gives no entry (the EC2 lookup then tries). Raises: nothing."""
    try:
        from kubernetes import client

        from kfp_gpu.cluster.kube import load

        cfg = client.Configuration()
        load(None, cfg)
        core = client.CoreV1Api(client.ApiClient(cfg))
    except Exception as exc:  # noqa: BLE001 - best effort, see the docstring
        log.info("cannot read Nodes for their providerID (%s); using EC2 private DNS names", exc)
        return {}
    out: dict[str, str] = {}
    for name in names:
        try:
            out[name] = str(core.read_node(name).spec.provider_id or "")
        except Exception as exc:  # noqa: BLE001
            log.info("cannot read Node %s: %s", name, exc)
    return out


def resolve(p: EksProvider, names: Sequence[str], region: str) -> dict[str, str]:
    """{node name: instance id} for the names that can be resolved (see the module docstring).

    Raises: PermissionDenied (ec2:DescribeInstances), RateLimited, TransientCloudError.
    """
    out = {n: n for n in names if _INSTANCE.match(n)}
    rest = [n for n in names if n not in out]
    if rest:
        ids = {n: instance_of(pid) for n, pid in p.node_lookup(rest).items()}
        out.update({n: i for n, i in ids.items() if i})
        rest = [n for n in rest if n not in out]
    if rest:
        resp = p._call("ec2", "describe_instances", region=region,
                       Filters=[{"Name": "private-dns-name", "Values": list(rest)}])
        for r in resp.get("Reservations", []):
            for inst in r.get("Instances", []):
                if inst.get("PrivateDnsName") in rest:
                    out[str(inst["PrivateDnsName"])] = str(inst["InstanceId"])
    return out


def delete_nodes(p: EksProvider, ref: PoolRef, nodes: Sequence[str]) -> Operation:
    """See EksProvider.delete_nodes.

    Raises: NotFound (node group), PermissionDenied (autoscaling:TerminateInstanceInAutoScalingGroup,
    autoscaling:DescribeAutoScalingGroups, ec2:DescribeInstances), RateLimited, TransientCloudError, CloudError.
    """
    region = ref.region or p.region
    ng = p._nodegroup(ref.pool, region)
    asgs = [str(g["name"]) for g in (ng.get("resources") or {}).get("autoScalingGroups") or [] if g.get("name")]
    ids = resolve(p, nodes, region)
    members: dict[str, str] = {}
    if asgs:
        for g in p._call("autoscaling", "describe_auto_scaling_groups", region=region, zone=ref.zone,
                         AutoScalingGroupNames=asgs).get("AutoScalingGroups", []):
            members.update({str(i["InstanceId"]): str(i.get("LifecycleState", "")) for i in g.get("Instances", [])})
    ours = sorted({i for i in ids.values() if i in members and members[i] not in _GONE})
    skipped = sorted(set(nodes) - {n for n, i in ids.items() if i in ours})
    if skipped:
        log.info("delete_nodes %s: %s already gone or not in the node group", ref.pool, ", ".join(skipped))
    done: list[str] = []
    for iid in ours:
        try:
            p._call("autoscaling", "terminate_instance_in_auto_scaling_group", region=region, zone=ref.zone,
                    what=f"terminate {iid} of node group {ref.pool!r}", InstanceId=iid,
                    ShouldDecrementDesiredCapacity=True)
        except CloudError as exc:
            if "not found" not in str(exc.message).lower():  # ValidationError: gone meanwhile = done
                raise
        except KfpGpuError:
            if done:  # report the part that happened; the caller's retry resolves the rest as gone
                log.warning("delete_nodes %s: terminated %s before an error", ref.pool, done)
            raise
        done.append(iid)
    status = OpStatus.RUNNING if done else OpStatus.DONE
    return Operation(f"{region}|{ref.pool}|terminate|{','.join(done)}", "delete-nodes", f"{ref.pool}@{ref.zone}",
                     status)


def operation(p: EksProvider, op: Operation) -> Operation:
    """A delete-nodes operation is DONE once none of its instances is in the node group's ASG any more.
    Raises: NotFound, PermissionDenied, RateLimited, TransientCloudError."""
    region, pool, _, ids = op.id.split("|", 3)
    wanted = set(filter(None, ids.split(",")))
    ng = p._nodegroup(pool, region)
    asgs = [str(g["name"]) for g in (ng.get("resources") or {}).get("autoScalingGroups") or [] if g.get("name")]
    left: set[str] = set()
    if asgs and wanted:
        groups: list[dict[str, Any]] = p._call("autoscaling", "describe_auto_scaling_groups", region=region,
                                               AutoScalingGroupNames=asgs).get("AutoScalingGroups", [])
        left = {str(i["InstanceId"]) for g in groups for i in g.get("Instances", [])} & wanted
    return Operation(op.id, op.kind, op.target, OpStatus.RUNNING if left else OpStatus.DONE)
