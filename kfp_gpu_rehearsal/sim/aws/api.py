"""The AWS actions EksProvider calls, answered from :class:`~kfp_gpu_rehearsal.sim.aws.world.AwsWorld`.

Each handler takes the world and the parsed request and returns a :data:`~kfp_gpu_rehearsal.sim.aws.wire.Answer`;
:class:`~kfp_gpu_rehearsal.sim.aws.records.AwsError` becomes the service's error shape in the server.
"""

from __future__ import annotations

import json
import re
import uuid
import zlib
from datetime import datetime, timezone
from typing import Any

from kfp_gpu_rehearsal.sim.aws import wire
from kfp_gpu_rehearsal.sim.aws.records import AwsError, Group, Instance, iso
from kfp_gpu_rehearsal.sim.aws.scenario import NodegroupSpec
from kfp_gpu_rehearsal.sim.aws.world import AwsWorld

CA_TAG = "k8s.io/cluster-autoscaler/enabled"


# ---- EKS (REST-JSON) ------------------------------------------------------------------------------
def eks(w: AwsWorld, method: str, path: str, query: dict[str, str], body: bytes) -> wire.Answer:
    parts = [p for p in path.split("/") if p]
    if len(parts) < 2 or parts[0] != "clusters":
        raise AwsError("UnknownOperationException", f"no EKS operation at {method} {path}", 404)
    if parts[1] != w.sc.cluster:
        raise AwsError("ResourceNotFoundException", f"No cluster found for name: {parts[1]}.", 404)
    if len(parts) == 2 and method == "GET":
        return wire.rest_ok({"cluster": _cluster(w)})
    if len(parts) == 3 and parts[2] == "node-groups" and method == "GET":
        names = sorted(w.groups)
        start = int(query.get("nextToken") or 0)
        size = int(query.get("maxResults") or 100)
        page = names[start:start + size]
        out: dict[str, Any] = {"nodegroups": page}
        if start + size < len(names):
            out["nextToken"] = str(start + size)
        return wire.rest_ok(out)
    if len(parts) >= 4 and parts[2] == "node-groups":
        grp = w.group(parts[3])
        if len(parts) == 4 and method == "GET":
            with w.lock:
                return wire.rest_ok({"nodegroup": _nodegroup(w, grp)})
        if len(parts) == 5 and parts[4] == "update-config" and method == "POST":
            req = json.loads(body or b"{}")
            if "labels" in req or "taints" in req or "updateConfig" in req:
                raise AwsError("InvalidParameterException", "the stand-in serves scalingConfig updates only")
            upd = w.update_config(grp.spec.name, dict(req.get("scalingConfig") or {}),
                                  str(req.get("clientRequestToken") or ""))
            return wire.rest_ok({"update": upd})
        if len(parts) == 6 and parts[4] == "updates" and method == "GET":
            found = grp.updates.get(parts[5])
            if found is None:
                raise AwsError("ResourceNotFoundException", f"No update found for ID: {parts[5]}.", 404)
            return wire.rest_ok({"update": found})
    raise AwsError("UnknownOperationException", f"no EKS operation at {method} {path}", 404)


def _cluster(w: AwsWorld) -> dict[str, Any]:
    return {"name": w.sc.cluster, "arn": f"arn:aws:eks:{w.sc.region}:{w.sc.account}:cluster/{w.sc.cluster}",
            "status": "ACTIVE", "version": "1.31", "endpoint": "https://kubernetes.default.svc",
            "resourcesVpcConfig": {"subnetIds": [subnet(z) for z in w.sc.zones], "vpcId": "vpc-0kfpgpu"},
            "createdAt": 1.7e9}


def subnet(zone: str) -> str:
    return "subnet-" + re.sub(r"[^a-z0-9]", "", zone)


def _nodegroup(w: AwsWorld, grp: Group) -> dict[str, Any]:
    g = grp.spec
    gpu = "AL2023_x86_64_NVIDIA"
    return {
        "nodegroupName": g.name, "clusterName": w.sc.cluster, "version": "1.31", "releaseVersion": "1.31.0-20261101",
        "nodegroupArn": f"arn:aws:eks:{w.sc.region}:{w.sc.account}:nodegroup/{w.sc.cluster}/{g.name}/{grp.asg[-8:]}",
        "createdAt": 1.7e9, "modifiedAt": w.epoch(), "status": grp.status, "capacityType": g.capacity_type,
        "scalingConfig": {"minSize": grp.min_size, "maxSize": grp.max_size, "desiredSize": grp.desired},
        "instanceTypes": [g.instance_type], "subnets": [subnet(g.zone)], "amiType": gpu,
        "nodeRole": f"arn:aws:iam::{w.sc.account}:role/eks-node", "labels": dict(g.labels),
        "taints": [dict(t) for t in g.taints], "resources": {"autoScalingGroups": [{"name": grp.asg}]},
        "diskSize": 20, "health": {"issues": [dict(i) for i in grp.issues]}, "updateConfig": {"maxUnavailable": 1},
        "tags": {}, **({"launchTemplate": _template_ref(g)} if g.placement_group else {}),
    }


def _template_ref(g: NodegroupSpec) -> dict[str, str]:
    """The launch template a node group with a placement group was created from (EKS: ``launchTemplate``)."""
    return {"name": f"{g.name}-lt", "version": "1", "id": f"lt-{zlib.crc32(g.name.encode()):017x}"}


def _launch_templates(w: AwsWorld, q: dict[str, str]) -> wire.Answer:
    """DescribeLaunchTemplateVersions of a node group's template: its instance type and ``Placement.GroupName``."""
    want = {q.get("LaunchTemplateName", ""), q.get("LaunchTemplateId", "")} - {""}
    out = []
    for g in w.sc.nodegroups:
        ref = _template_ref(g)
        if g.placement_group and want & {ref["name"], ref["id"]}:
            out.append({"launchTemplateId": ref["id"], "launchTemplateName": ref["name"], "versionNumber": 1,
                        "defaultVersion": True, "launchTemplateData": {
                            "instanceType": g.instance_type, "placement": {"groupName": g.placement_group}}})
    if not out:
        raise AwsError("InvalidLaunchTemplateName.NotFoundException",
                       f"At least one of the launch templates specified in the request does not exist: {sorted(want)}")
    return wire.ec2_ok("DescribeLaunchTemplateVersions", {"launchTemplateVersionSet": out})


def _placement_groups(w: AwsWorld, q: dict[str, str]) -> wire.Answer:
    """DescribePlacementGroups: the node groups' cluster placement groups (strategy ``cluster``, available), only
    those ``GroupName.N`` names when given; an unknown name is ``InvalidPlacementGroup.Unknown``."""
    names = sorted({g.placement_group for g in w.sc.nodegroups if g.placement_group})
    want = wire.flat_list(q, "GroupName")
    unknown = [n for n in want if n not in names]
    if unknown:
        raise AwsError("InvalidPlacementGroup.Unknown", f"The Placement Group '{unknown[0]}' is unknown.")
    names = [n for n in names if not want or n in want]
    return wire.ec2_ok("DescribePlacementGroups", {"placementGroupSet": [
        {"groupName": n, "strategy": "cluster", "state": "available",
         "groupId": f"pg-{zlib.crc32(n.encode()):017x}"} for n in names]})


# ---- Auto Scaling (query) -------------------------------------------------------------------------
def autoscaling(w: AwsWorld, q: dict[str, str]) -> wire.Answer:
    action = q.get("Action", "")
    if action == "DescribeAutoScalingGroups":
        names = wire.flat_list(q, "AutoScalingGroupNames")
        with w.lock:
            groups = [g for g in w.groups.values() if not names or g.asg in names]
            return wire.asg_ok(action, {"AutoScalingGroups": [_asg(w, g) for g in groups]})
    if action == "DescribeScalingActivities":
        name = q.get("AutoScalingGroupName", "")
        limit = int(q.get("MaxRecords") or 100)
        with w.lock:
            acts = [a for g in w.groups.values() if not name or g.asg == name for a in g.activities][:limit]
            return wire.asg_ok(action, {"Activities": [dict(a) for a in acts]})
    if action == "TerminateInstanceInAutoScalingGroup":
        if "ShouldDecrementDesiredCapacity" not in q:
            raise AwsError("ValidationError", "1 validation error detected: Value null at "
                           "'shouldDecrementDesiredCapacity' failed to satisfy constraint: Member must not be null")
        act = w.terminate_instance(q.get("InstanceId", ""), q["ShouldDecrementDesiredCapacity"] == "true")
        return wire.asg_ok(action, {"Activity": dict(act)})
    raise AwsError("InvalidAction", f"The action {action} is not valid for this web service.")


def _asg(w: AwsWorld, grp: Group) -> dict[str, Any]:
    insts = [i for i in w.instances.values() if i.nodegroup == grp.spec.name and i.state != "terminated"]
    tags = [{"ResourceId": grp.asg, "ResourceType": "auto-scaling-group", "Key": k, "Value": v,
             "PropagateAtLaunch": True} for k, v in {
        "eks:cluster-name": w.sc.cluster, "eks:nodegroup-name": grp.spec.name,
        f"k8s.io/cluster-autoscaler/{w.sc.cluster}": "owned",
        **({CA_TAG: "true"} if grp.spec.autoscaler_tag else {})}.items()]
    return {"AutoScalingGroupName": grp.asg, "MinSize": grp.min_size, "MaxSize": grp.max_size,
            "DesiredCapacity": grp.desired, "DefaultCooldown": 300, "AvailabilityZones": [grp.spec.zone],
            "HealthCheckType": "EC2", "CreatedTime": "2026-01-01T00:00:00Z", "CapacityRebalance":
            grp.spec.capacity_type == "SPOT", "VPCZoneIdentifier": subnet(grp.spec.zone),
            "Instances": [{"InstanceId": i.id, "InstanceType": i.instance_type, "AvailabilityZone": i.zone,
                           "LifecycleState": i.lifecycle, "HealthStatus": "Healthy",
                           "ProtectedFromScaleIn": False} for i in insts],
            "Tags": tags}


# ---- EC2 (query) ----------------------------------------------------------------------------------
def ec2(w: AwsWorld, q: dict[str, str]) -> wire.Answer:
    action = q.get("Action", "")
    if action == "DescribeInstances":
        return wire.ec2_ok(action, {"reservationSet": _reservations(w, q)})
    if action == "DescribeInstanceTypes":
        types = wire.flat_list(q, "InstanceType")
        out = []
        for t in types:
            if t not in w.shapes:
                raise AwsError("InvalidInstanceType", f"The following supplied instance types do not exist: [{t}]")
            shape = w.shapes[t][1]
            out.append({"instanceType": t, "vCpuInfo": {"defaultVCpus": shape.vcpus},
                        "gpuInfo": {"gpus": [{"count": shape.gpus, "manufacturer": "NVIDIA"}]}})
        return wire.ec2_ok(action, {"instanceTypeSet": out})
    if action == "DescribeSubnets":
        ids = wire.flat_list(q, "SubnetId")
        known = {subnet(z): z for z in w.sc.zones}
        for s in ids:
            if s not in known:
                raise AwsError("InvalidSubnetID.NotFound", f"The subnet ID '{s}' does not exist")
        return wire.ec2_ok(action, {"subnetSet": [{"subnetId": s, "availabilityZone": z, "vpcId": "vpc-0kfpgpu",
                                                   "state": "available"} for s, z in known.items()
                                                  if not ids or s in ids]})
    if action == "DescribeLaunchTemplateVersions":
        return _launch_templates(w, q)
    if action == "DescribePlacementGroups":
        return _placement_groups(w, q)
    if action == "DescribeCapacityBlockOfferings":
        return wire.ec2_ok(action, {"capacityBlockOfferingSet": []})
    if action in ("DescribeCapacityReservations", "CreateCapacityReservation", "CancelCapacityReservation"):
        return _capacity_reservations(w, action, q)
    raise AwsError("InvalidAction", f"The action {action} is not valid for this web service.")


def _instance_xml(w: AwsWorld, i: Instance) -> dict[str, Any]:
    shape = w.shapes[i.instance_type][1]
    code = {"pending": 0, "running": 16, "shutting-down": 32, "terminated": 48}[i.state]
    doc: dict[str, Any] = {
        "instanceId": i.id, "instanceType": i.instance_type, "placement": {"availabilityZone": i.zone},
        "instanceState": {"code": code, "name": i.state}, "privateDnsName": i.dns, "privateIpAddress": i.private_ip,
        "launchTime": iso(datetime.fromtimestamp(w.epoch() - (w.now() - i.launched), timezone.utc)),
        "cpuOptions": {"coreCount": shape.vcpus // 2, "threadsPerCore": 2},
        "tagSet": [{"key": "eks:nodegroup-name", "value": i.nodegroup}, {"key": "eks:cluster-name",
                                                                         "value": w.sc.cluster},
                   {"key": "aws:autoscaling:groupName", "value": w.groups[i.nodegroup].asg}],
    }
    if i.capacity_type == "SPOT":
        doc["instanceLifecycle"] = "spot"
    return doc


def _reservations(w: AwsWorld, q: dict[str, str]) -> list[dict[str, Any]]:
    filters = wire.ec2_filters(q)
    ids = wire.flat_list(q, "InstanceId")
    with w.lock:
        insts = list(w.instances.values())
        if ids:
            missing = [i for i in ids if i not in w.instances]
            if missing:
                raise AwsError("InvalidInstanceID.NotFound", f"The instance ID '{missing[0]}' does not exist")
            insts = [i for i in insts if i.id in ids]
        checks = {"instance-state-name": lambda i: i.state, "private-dns-name": lambda i: i.dns,
                  "availability-zone": lambda i: i.zone, "instance-type": lambda i: i.instance_type,
                  "tag:eks:nodegroup-name": lambda i: i.nodegroup, "instance-id": lambda i: i.id}
        for name, values in filters.items():
            if name not in checks:
                raise AwsError("InvalidParameterValue", f"The filter '{name}' is invalid")
            insts = [i for i in insts if checks[name](i) in values]
        return [{"reservationId": "r-" + i.id[2:], "ownerId": w.sc.account,
                 "instancesSet": [_instance_xml(w, i)]} for i in insts]


def _capacity_reservations(w: AwsWorld, action: str, q: dict[str, str]) -> wire.Answer:
    """Capacity Reservations are recorded and reported ``active``; the stand-in's launches do not consume them
    (documented limitation)."""
    with w.lock:
        if action == "CreateCapacityReservation":
            token = q.get("ClientToken", "")
            cr = next((c for c in w.reservations.values() if token and c.get("token") == token), None)
            if cr is None:
                cid = "cr-" + uuid.uuid4().hex[:17]
                tags = {}
                for k, v in q.items():
                    m = re.fullmatch(r"TagSpecifications\.1\.Tag\.(\d+)\.Key", k)
                    if m:
                        tags[v] = q.get(f"TagSpecifications.1.Tag.{m.group(1)}.Value", "")
                n = int(q.get("InstanceCount", "1"))
                cr = {"capacityReservationId": cid, "instanceType": q.get("InstanceType", ""),
                      "availabilityZone": q.get("AvailabilityZone", ""), "totalInstanceCount": n,
                      "availableInstanceCount": n, "state": "active", "token": token,
                      "tagSet": [{"key": k, "value": v} for k, v in tags.items()]}
                w.reservations[cid] = cr
            return wire.ec2_ok(action, {"capacityReservation": _cr(cr)})
        if action == "CancelCapacityReservation":
            cid = q.get("CapacityReservationId", "")
            if cid not in w.reservations:
                raise AwsError("InvalidCapacityReservationId.NotFound", f"The capacity reservation '{cid}' does not "
                               "exist")
            w.reservations[cid]["state"] = "cancelled"
            return wire.ec2_ok(action, {"return": True})
        ids = wire.flat_list(q, "CapacityReservationId")
        crs = [c for c in w.reservations.values() if not ids or c["capacityReservationId"] in ids]
        for name, values in wire.ec2_filters(q).items():
            if name == "state":
                crs = [c for c in crs if c["state"] in values]
            elif name.startswith("tag:"):
                crs = [c for c in crs if any(t["key"] == name[4:] and t["value"] in values for t in c["tagSet"])]
        return wire.ec2_ok(action, {"capacityReservationSet": [_cr(c) for c in crs]})


def _cr(cr: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in cr.items() if k != "token"}


# ---- Service Quotas (JSON 1.1) ----------------------------------------------------------------------
def servicequotas(w: AwsWorld, target: str, body: bytes) -> wire.Answer:
    op = target.rsplit(".", 1)[-1]
    req = json.loads(body or b"{}")
    code, svc = str(req.get("QuotaCode", "")), str(req.get("ServiceCode", ""))
    if op in ("GetServiceQuota", "GetAWSDefaultServiceQuota"):
        from kfp_gpu_rehearsal.sim.aws.scenario import DEFAULT_QUOTAS

        if svc != "ec2" or code not in DEFAULT_QUOTAS:
            raise AwsError("NoSuchResourceException", f"The request failed because the specified quota {code} for "
                           f"service {svc} does not exist.")
        value = DEFAULT_QUOTAS[code] if op == "GetAWSDefaultServiceQuota" else w.quota_value(code)
        return wire.json11_ok({"Quota": {
            "ServiceCode": "ec2", "ServiceName": "Amazon Elastic Compute Cloud (Amazon EC2)", "QuotaCode": code,
            "QuotaArn": f"arn:aws:servicequotas:{w.sc.region}:{w.sc.account}:ec2/{code}", "Value": value,
            "Unit": "None", "Adjustable": True, "GlobalQuota": False}})
    if op == "RequestServiceQuotaIncrease":
        with w.lock:
            if any(r["QuotaCode"] == code and r["Status"] == "PENDING" for r in w.quota_requests):
                raise AwsError("ResourceAlreadyExistsException", "The request failed because a request for this "
                               "quota is already pending.")
            r = {"Id": uuid.uuid4().hex, "ServiceCode": svc, "QuotaCode": code,
                 "DesiredValue": float(req.get("DesiredValue", 0)), "Status": "PENDING", "Created": w.epoch()}
            w.quota_requests.append(r)
        return wire.json11_ok({"RequestedQuota": r})
    if op == "ListRequestedServiceQuotaChangeHistoryByQuota":
        status = req.get("Status")
        with w.lock:
            out = [r for r in w.quota_requests if r["QuotaCode"] == code and (not status or r["Status"] == status)]
        return wire.json11_ok({"RequestedQuotas": out})
    raise AwsError("UnknownOperationException", f"Unknown operation {target}")
