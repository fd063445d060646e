"""EksProvider: EC2/EKS/Service Quotas behind the CapacityProvider contract.

Design choices:

* **Quota** = the family code's (P/G, on-demand/spot) Service Quotas limit and the vCPUs of its running
  instances, in **vCPUs** (:mod:`kfp_gpu.providers.eks.quota`).
* **Scaling** = ``eks.update_nodegroup_config(scalingConfig=...)`` with an absolute desired size and
  a ``clientRequestToken`` derived from the owner (AWS dedups retries). ``maxSize`` is checked here
  (moto does not). Progress is polled with ``describe_nodegroup``: status plus health issues, which
  is where launch failures (``InsufficientInstanceCapacity``...) surface after the update succeeded.
* **Reservations** = EC2 capacity reservations tagged with the owner labels and a ``Name`` tag, ending
  at the owner's lease expiry (so a forgotten one expires on its own). Capacity Block offerings are
  looked up with :meth:`EksProvider.capacity_block_offerings`.
* **Fail fast**: botocore retries are off (``max_attempts=1``) with short timeouts; our own
  back-off (:mod:`kfp_gpu.plan.backoff`) decides what to retry, from the error table.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

from kfp_gpu import fanout, iam
from kfp_gpu.errors import CloudError, InvalidSpec, KfpGpuError, NotFound, Scope
from kfp_gpu.ownership import Owner
from kfp_gpu.providers.base import Operation, OpStatus, PoolActivity, PoolRef, PoolState, QuotaAmount
from kfp_gpu.providers.eks import activity, launch
from kfp_gpu.providers.eks import nodes as nodes_mod
from kfp_gpu.providers.eks import quota as quota_mod
from kfp_gpu.providers.eks.errors import ERROR_TABLE, classify
from kfp_gpu.providers.eks.reservations import CR_STATUS, ReservationsMixin, token

log = logging.getLogger(__name__)

# botocore's retries["max_attempts"] counts *retries* (max_attempts=1 still means 2 attempts);
# total_max_attempts counts the initial call too, so 1 = exactly one attempt, no botocore retry.
FAIL_FAST: dict[str, Any] = {
    "retries": {"total_max_attempts": 1, "mode": "standard"}, "connect_timeout": 5, "read_timeout": 20,
}
ClientFactory = Callable[[str, str], Any]  # (service, region) -> botocore client

_IAM_PREFIX = iam.AWS_PREFIX  # botocore client name -> IAM action prefix
_NG_STATUS = {"ACTIVE": OpStatus.DONE, "UPDATING": OpStatus.RUNNING, "CREATING": OpStatus.RUNNING,
              "DEGRADED": OpStatus.FAILED, "CREATE_FAILED": OpStatus.FAILED}


CA_ENABLED_TAG = "k8s.io/cluster-autoscaler/enabled"  # cluster-autoscaler auto-discovery tag on an ASG


def _asg_names(nodegroup: dict[str, Any]) -> list[str]:
    return [str(g["name"]) for g in (nodegroup.get("resources") or {}).get("autoScalingGroups") or []
            if g.get("name")]


@functools.lru_cache(maxsize=1)
def known_regions() -> frozenset[str]:
    """Every EC2 region botocore knows (offline data, all partitions)."""
    import boto3

    s = boto3.session.Session()
    out: set[str] = set()
    for partition in s.get_available_partitions():
        out.update(s.get_available_regions("ec2", partition_name=partition))
    return frozenset(out)


class EksProvider(ReservationsMixin):
    """CapacityProvider for one EKS cluster. See the module docstring."""

    name = "eks"
    scheme = "eks"  # node labels (kfp_gpu.cluster.node_labels)

    def __init__(
        self,
        cluster: str,
        region: str,
        *,
        client_factory: ClientFactory | None = None,
        endpoint_url: str = "",
        profile: str = "",
        node_lookup: nodes_mod.NodeLookup | None = None,
    ) -> None:
        self.cluster = cluster
        self.region = region
        self.endpoint_url = endpoint_url
        self.profile = profile
        self._factory = client_factory or self._default_factory
        self.node_lookup: nodes_mod.NodeLookup = node_lookup or nodes_mod.kube_provider_ids
        self._clients: dict[tuple[str, str], Any] = {}
        self._lock = threading.Lock()

    @classmethod
    def from_target(cls, target: Any) -> EksProvider:
        """Build from a :class:`kfp_gpu.spec.Target` (kind=eks)."""
        return cls(target.cluster, target.region, endpoint_url=target.endpoint)

    # ---- plumbing --------------------------------------------------------------------------
    def _default_factory(self, service: str, region: str) -> Any:
        import boto3
        from botocore.config import Config

        # the standard credential chain, also for the local stand-in (kfp_gpu_rehearsal.sim.aws), which maps the access key
        # id to a principal and its policy (the rehearsal gives the controller AWS_ACCESS_KEY_ID; docs/sim.md)
        session = boto3.session.Session(profile_name=self.profile or None)
        return session.client(
            service, region_name=region, config=Config(**FAIL_FAST), endpoint_url=self.endpoint_url or None,
        )

    def client(self, service: str, region: str | None = None) -> Any:
        key = (service, region or self.region)
        with self._lock:
            if key not in self._clients:
                self._clients[key] = self._factory(*key)
            return self._clients[key]

    def _call(self, service: str, op: str, *, region: str = "", zone: str = "", what: str = "", **kw: Any) -> Any:
        client = self.client(service, region or self.region)
        try:
            return getattr(client, op)(**kw)
        except Exception as exc:
            api = client.meta.method_to_api_mapping.get(op, op)
            raise classify(
                exc, zone=zone, region=region or self.region, action=f"{_IAM_PREFIX.get(service, service)}:{api}",
                what=what,
            ) from exc

    def _check_region(self, region: str) -> None:
        if region not in known_regions():
            raise NotFound(
                f"{region!r} is not an AWS region", remediation="use a region such as 'us-east-1'",
                scope=Scope.REGION, region=region,
            )

    def classify(self, exc: BaseException, *, zone: str = "", region: str = "") -> Exception:
        """Map a botocore exception through :data:`kfp_gpu.providers.eks.errors.ERROR_TABLE`."""
        return classify(exc, zone=zone, region=region)

    # ---- quota (kfp_gpu.providers.eks.quota) -----------------------------------------------
    def quota(self, accelerator: str, region: str, *, spot: bool) -> list[QuotaAmount]:
        """The vCPU quota row (limit from Service Quotas, usage from running instances).

        Raises: PermissionDenied (no credentials at all), NotFound (not an AWS region).
        """
        self._check_region(region)
        return quota_mod.read(self, accelerator, region, spot=spot)

    def request_quota_increase(self, metric: str, region: str, value: float, justification: str) -> str:
        """File a Service Quotas increase for ``metric`` (an ec2 quota code) to ``value`` vCPUs.

        A pending request for the same quota is returned instead of filing a second one. AWS has no
        justification field; it is logged (attach it to a support case for large asks).

        Raises: InvalidSpec (value not above the current limit), PermissionDenied, NotFound, CloudError.
        """
        self._check_region(region)
        return quota_mod.request_increase(self, metric, region, value, justification)

    # ---- node groups -----------------------------------------------------------------------
    def _nodegroup(self, name: str, region: str) -> dict[str, Any]:
        what = f"EKS node group {name!r} of cluster {self.cluster!r} in {region}"
        resp = self._call("eks", "describe_nodegroup", region=region, what=what,
                          clusterName=self.cluster, nodegroupName=name)
        return dict(resp["nodegroup"])

    def pools(self, region: str, *, sizes: bool = True) -> list[PoolState]:
        """GPU managed node groups of the cluster. Zone = the AZ of its subnets, or the region when
        it spans several. Non-GPU node groups are skipped. A group whose launch template targets a capacity
        reservation (or Capacity Block) reports it as a "specific" reservation affinity (:mod:`.launch`).

        Raises: NotFound (no such region or cluster), PermissionDenied, RateLimited, TransientCloudError.
        """
        self._check_region(region)
        self._call("eks", "describe_cluster", region=region, name=self.cluster,
                   what=f"EKS cluster {self.cluster!r} in {region}")
        names: list[str] = []
        kw: dict[str, Any] = {}
        while True:
            resp = self._call("eks", "list_nodegroups", region=region, clusterName=self.cluster,
                              what=f"EKS cluster {self.cluster!r} in {region}", **kw)
            names += resp.get("nodegroups", [])
            if not resp.get("nextToken"):
                break
            kw["nextToken"] = resp["nextToken"]
        groups = fanout.run_all([functools.partial(self._nodegroup, n, region) for n in names])
        subnets = sorted({s for g in groups for s in g.get("subnets", [])})
        az: dict[str, str] = {}
        if subnets:
            try:
                resp = self._call("ec2", "describe_subnets", region=region, SubnetIds=subnets)
                az = {s["SubnetId"]: s["AvailabilityZone"] for s in resp.get("Subnets", [])}
            except (NotFound, CloudError) as exc:
                log.warning("cannot map node group subnets to zones: %s", exc)
        out = []
        auto = self._autoscaled_asgs(region, groups)
        for g in groups:
            itype = next((t for t in g.get("instanceTypes") or [] if t in quota_mod.SHAPES), None)
            if itype is None:
                continue
            zones = sorted({az[s] for s in g.get("subnets", []) if s in az})
            sc = g.get("scalingConfig", {})
            scaled = any(a in auto for a in _asg_names(g))
            data = launch.template_data(self, g, region)
            affinity, reservations, free = launch.reservation_target(self, data, region)
            where, group = launch.placement(self, data, region)
            out.append(PoolState(
                PoolRef(g["nodegroupName"], zones[0] if len(zones) == 1 else region, region),
                int(sc.get("desiredSize", 0)), int(sc.get("maxSize", 0)), quota_mod.ACCELERATOR_OF[itype],
                quota_mod.SHAPES[itype].gpus, itype, g.get("capacityType") == "SPOT", dict(g.get("labels") or {}),
                autoscaling=scaled, autoscaling_min=int(sc.get("minSize", 0)) if scaled else 0,
                autoscaling_max=int(sc.get("maxSize", 0)) if scaled else 0,
                reservation_affinity=affinity, reservations=reservations, reservation_free=free,
                placement=where, placement_group=group,
            ))
        return out

    def _autoscaled_asgs(self, region: str, groups: list[dict[str, Any]]) -> set[str]:
        """Names of the node groups' Auto Scaling groups that carry the cluster-autoscaler auto-discovery tag
        ``k8s.io/cluster-autoscaler/enabled`` (managed node groups have no autoscaler flag of their own).
        Best effort: an unreadable answer is logged and counts as not autoscaled. Raises: nothing."""
        names = sorted({a for g in groups for a in _asg_names(g)})
        found: set[str] = set()
        for i in range(0, len(names), 50):  # DescribeAutoScalingGroups takes at most 50 names
            try:
                resp = self._call("autoscaling", "describe_auto_scaling_groups", region=region,
                                  AutoScalingGroupNames=names[i:i + 50])
            except KfpGpuError as exc:
                log.warning("cannot read the node groups' cluster-autoscaler tags: %s", exc)
                return found
            found |= {str(a.get("AutoScalingGroupName")) for a in resp.get("AutoScalingGroups", [])
                      if any(t.get("Key") == CA_ENABLED_TAG for t in a.get("Tags") or [])}
        return found

    def resize(self, ref: PoolRef, size: int, owner: Owner) -> Operation:
        """Set the node group's desired size (absolute). Same size again is a no-op.

        Raises: InvalidSpec (size above maxSize or negative), NotFound, PermissionDenied
        (eks:UpdateNodegroupConfig), RateLimited, TransientCloudError, CloudError.
        """
        region = ref.region or self.region
        ng = self._nodegroup(ref.pool, region)
        sc = ng.get("scalingConfig", {})
        max_size = int(sc.get("maxSize", 0))
        if size < 0 or size > max_size:
            raise InvalidSpec(
                "size", size, f"node group {ref.pool!r} allows 0..{max_size} nodes (scalingConfig.maxSize)",
                remediation=f"aws eks update-nodegroup-config --cluster-name {self.cluster} --nodegroup-name "
                f"{ref.pool} --scaling-config maxSize=<n>, or ask for fewer nodes",
            )
        target = f"{ref.pool}@{ref.zone}"
        if int(sc.get("desiredSize", -1)) == size:
            return Operation(f"{region}|{ref.pool}|{size}|noop", "resize", target, OpStatus.DONE)
        scaling = {"minSize": min(int(sc.get("minSize", 0)), size), "maxSize": max_size, "desiredSize": size}
        resp = self._call(
            "eks", "update_nodegroup_config", region=region, zone=ref.zone, what=f"resize {target} to {size}",
            clusterName=self.cluster, nodegroupName=ref.pool, scalingConfig=scaling,
            clientRequestToken=token(owner.run_id, owner.step, self.cluster, ref.pool, size),
        )
        upd = resp.get("update", {})
        status = {"Failed": OpStatus.FAILED, "Successful": OpStatus.RUNNING}.get(upd.get("status"), OpStatus.PENDING)
        return Operation(f"{region}|{ref.pool}|{size}|{upd.get('id', '')}", "resize", target, status)

    def pool_activity(self, ref: PoolRef, since: float = 0.0) -> PoolActivity:
        """Best effort, from the node group's Auto Scaling group: DesiredCapacity, InService instances,
        and failed scaling activities at or after ``since`` (see :mod:`kfp_gpu.providers.eks.activity`).

        Raises: NotFound, PermissionDenied, RateLimited, TransientCloudError.
        """
        return activity.pool_activity(self, ref, since)

    def delete_nodes(self, ref: PoolRef, nodes: Sequence[str]) -> Operation:
        """Remove the named nodes' own instances from node group ``ref.pool`` and shrink it by as many
        (Auto Scaling ``TerminateInstanceInAutoScalingGroup`` with ``ShouldDecrementDesiredCapacity=True``), so
        a rollback or teardown never removes another run's nodes. Nodes already gone are skipped (idempotent).
        Not part of the CapacityProvider protocol. See :mod:`kfp_gpu.providers.eks.nodes`.

        Raises: NotFound, PermissionDenied (autoscaling:TerminateInstanceInAutoScalingGroup), RateLimited,
        TransientCloudError, CloudError.
        """
        return nodes_mod.delete_nodes(self, ref, nodes)

    def operation(self, op: Operation) -> Operation:
        """Poll a resize (node group status + health issues), a delete-nodes (its instances leaving the Auto
        Scaling group) or a reservation (its state).

        Raises: RateLimited, TransientCloudError, NotFound, PermissionDenied.
        """
        if op.done:
            return op
        if op.kind == "delete-nodes":
            return nodes_mod.operation(self, op)
        if op.kind == "reserve":
            region, cr_id = op.id.split("|", 1)
            cr = self._call("ec2", "describe_capacity_reservations", region=region,
                            CapacityReservationIds=[cr_id])["CapacityReservations"][0]
            status = CR_STATUS.get(cr.get("State", ""), OpStatus.RUNNING)
            err = CloudError(f"capacity reservation {op.target} failed") if status is OpStatus.FAILED else None
            return Operation(op.id, op.kind, op.target, status, err)
        region, pool, _size, _upd = op.id.split("|", 3)
        ng = self._nodegroup(pool, region)
        issues = (ng.get("health") or {}).get("issues") or []
        zone = op.target.split("@", 1)[-1]
        if issues:
            return Operation(op.id, op.kind, op.target, OpStatus.FAILED, self._issue_error(issues[0], zone, region))
        return Operation(op.id, op.kind, op.target, _NG_STATUS.get(ng.get("status", ""), OpStatus.RUNNING))

    def _issue_error(self, issue: dict[str, Any], zone: str, region: str) -> KfpGpuError:
        code, msg = str(issue.get("code", "")), str(issue.get("message", ""))
        for known in ERROR_TABLE:
            if known in msg or known == code:
                cls, scope, fix = ERROR_TABLE[known]
                return cls(f"node group launch failed: {code}: {msg}", remediation=fix, scope=scope,
                           zone=zone, region=region, code=known)
        return CloudError(f"node group health issue {code}: {msg}", scope=Scope.ZONE, zone=zone, code=code)
