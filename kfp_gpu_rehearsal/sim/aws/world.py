"""The AWS stand-in's world: EKS managed node groups, their Auto Scaling groups and EC2 instances in time.

Every mutation runs under one lock; node-backend calls (Kubernetes writes) are queued and run in order on
one worker thread after the lock is released. Timed transitions run on the shared
:class:`~kfp_gpu_rehearsal.sim.clock.Timeline`. The records it keeps are :mod:`kfp_gpu_rehearsal.sim.aws.records`.
Behaviour and sources: docs/sim.md, "AWS stand-in".
"""

from __future__ import annotations

import functools
import itertools
import logging
import random
import threading
import uuid
import zlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from typing import Any

from kfp_gpu import accelerators
from kfp_gpu_rehearsal.sim.aws.records import AwsError, EksNodeBackend, Group, Instance, iso
from kfp_gpu_rehearsal.sim.aws.scenario import AwsScenario, instance_shapes
from kfp_gpu_rehearsal.sim.clock import Timeline, compress, expand
from kfp_gpu_rehearsal.sim.topology import Hosts, site
from kfp_gpu_rehearsal.sim.worldspec import BootLatency

log = logging.getLogger(__name__)
DEFAULT_BOOT = BootLatency("lognormal", 240.0, 0.45, 0, 90.0)
MAX_ACTIVITIES = 100


class AwsWorld:
    """See the module docstring. ``backend`` None keeps nodes in memory only."""

    def __init__(self, scenario: AwsScenario, backend: EksNodeBackend | None = None, *,
                 timeline: Timeline | None = None) -> None:
        self.sc = scenario
        self.backend = backend
        self.timeline = timeline or Timeline()
        self.lock = threading.RLock()
        self.shapes = instance_shapes()
        self.groups: dict[str, Group] = {}
        self.instances: dict[str, Instance] = {}
        self.quota_requests: list[dict[str, Any]] = []
        self.reservations: dict[str, dict[str, Any]] = {}
        self.hosts = Hosts(scenario.topology, f"{scenario.account}/{scenario.cluster}")
        self.ips = itertools.count(10)
        # the VPC's second octet comes from the cluster name: stand-ins sharing one API server name nodes apart
        self.octet = zlib.crc32(scenario.cluster.encode()) % 250 + 1
        self._worker = ThreadPoolExecutor(1, thread_name_prefix="aws-sim-nodes")
        self._queued: list[Callable[[], None]] = []
        for g in scenario.nodegroups:
            seed = zlib.crc32(g.name.encode())
            grp = Group(g, f"eks-{g.name}-{seed:08x}", g.desired_size, g.min_size, g.max_size,
                        rng=(g.boot or DEFAULT_BOOT).sampler() if g.boot else random.Random(seed))
            self.groups[g.name] = grp
        with self.lock:
            for grp in self.groups.values():
                self._reconcile(grp)
        for ev in scenario.interruptions:
            self.timeline.at(compress(ev.at_s), functools.partial(self._scheduled_interrupt, ev.nodegroup, ev.count))
        self._flush()

    # ---- plumbing ---------------------------------------------------------------------------
    def now(self) -> float:
        return self.timeline.now()

    def _later(self, real_s: float, fn: Callable[[], None]) -> None:
        def run() -> None:
            with self.lock:
                fn()
            self._flush()
        self.timeline.after(compress(real_s), run)

    def _node(self, fn: Callable[[], None]) -> None:
        if self.backend is not None:
            self._queued.append(fn)

    def _flush(self) -> None:
        with self.lock:
            calls, self._queued = self._queued, []
        for fn in calls:
            self._worker.submit(_logged, fn)

    def drain_backend(self) -> None:
        """Wait until every queued node-backend call ran (tests)."""
        self._worker.submit(lambda: None).result()

    def group(self, name: str) -> Group:
        grp = self.groups.get(name)
        if grp is None:
            raise AwsError("ResourceNotFoundException", f"No node group found for name: {name}.", 404)
        return grp

    def _activity(self, grp: Group, desc: str, cause: str, status: str, message: str = "") -> dict[str, Any]:
        act = {"ActivityId": str(uuid.uuid4()), "AutoScalingGroupName": grp.asg, "Description": desc,
               "Cause": f"At {iso()} {cause}", "StartTime": iso(), "EndTime": iso(), "StatusCode": status,
               "Progress": 100, "StatusMessage": message}
        grp.activities.insert(0, act)
        del grp.activities[MAX_ACTIVITIES:]
        return act

    # ---- EKS ---------------------------------------------------------------------------------
    def update_config(self, name: str, scaling: dict[str, Any], token: str) -> dict[str, Any]:
        """UpdateNodegroupConfig: an asynchronous ConfigUpdate (InProgress, Successful ``update_s`` later).

        Raises: AwsError (ResourceNotFoundException, InvalidParameterException, ResourceInUseException).
        """
        with self.lock:
            grp = self.group(name)
            if token and token in grp.tokens:
                return grp.updates[grp.tokens[token]]
            mn = int(scaling.get("minSize", grp.min_size))
            mx = int(scaling.get("maxSize", grp.max_size))
            want = int(scaling.get("desiredSize", grp.desired))
            if not (0 <= mn <= want <= mx) or mx < 1:
                raise AwsError("InvalidParameterException",
                               f"Minimum capacity {mn} can't be greater than desired size {want}" if mn > want
                               else f"Desired capacity {want} can't be greater than max size {mx}")
            if grp.status != "ACTIVE" and grp.status != "DEGRADED":
                raise AwsError("ResourceInUseException",
                               f"Nodegroup {name} is currently in {grp.status} state and cannot be updated.", 409)
            uid = str(uuid.uuid4())
            upd = {"id": uid, "status": "InProgress", "type": "ConfigUpdate", "createdAt": self.epoch(),
                   "params": [{"type": "MinSize", "value": str(mn)}, {"type": "MaxSize", "value": str(mx)},
                              {"type": "DesiredSize", "value": str(want)}], "errors": []}
            grp.updates[uid] = upd
            if token:
                grp.tokens[token] = uid
            grp.status = "UPDATING"

            def done() -> None:
                grp.min_size, grp.max_size, grp.desired = mn, mx, want
                upd["status"] = "Successful"
                grp.status = "ACTIVE"
                self._reconcile(grp)
            self._later(self.sc.update_s, done)
            return upd

    def epoch(self) -> float:
        return datetime.now(timezone.utc).timestamp()

    # ---- ASG ---------------------------------------------------------------------------------
    def _reconcile(self, grp: Group) -> None:
        """Bring the group's live instances to its desired capacity (launch or terminate)."""
        live = [i for i in self.instances.values() if i.nodegroup == grp.spec.name and i.live]
        for _ in range(grp.desired - len(live)):
            if not self._launch(grp):
                if grp.retry_at is None:
                    grp.retry_at = self.now()
                    self._later(self.sc.launch_retry_s, lambda: self._retry(grp))
                return
        grp.issues.clear()
        extra = len(live) - grp.desired
        if extra > 0:  # scale-in: AWS picks (pending first, then the newest): our code never relies on it
            victims = sorted(live, key=lambda i: (i.lifecycle != "Pending", -i.launched))[:extra]
            for inst in victims:
                self._terminate(grp, inst, "an instance was taken out of service in response to a difference "
                                "between desired and actual capacity, shrinking the capacity")

    def _retry(self, grp: Group) -> None:
        grp.retry_at = None
        self._reconcile(grp)

    def _family_vcpus(self, itype: str, ctype: str) -> tuple[str, float, float]:
        acc, shape = self.shapes[itype]
        info = accelerators.get(acc)
        code = info.aws_quota_spot if ctype == "SPOT" else info.aws_quota_on_demand
        used = sum(self.shapes[i.instance_type][1].vcpus for i in self.instances.values()
                   if i.state in ("pending", "running") and i.capacity_type == ctype
                   and self._quota_code(i.instance_type, ctype) == code)
        return code, used + shape.vcpus, self.quota_value(code)

    def _quota_code(self, itype: str, ctype: str) -> str:
        info = accelerators.get(self.shapes[itype][0])
        return info.aws_quota_spot if ctype == "SPOT" else info.aws_quota_on_demand

    def quota_value(self, code: str) -> float:
        from kfp_gpu_rehearsal.sim.aws.scenario import DEFAULT_QUOTAS

        return float(self.sc.quotas.get(code, DEFAULT_QUOTAS.get(code, 0.0)))

    def _launch(self, grp: Group) -> bool:
        g = grp.spec
        kind = "Spot" if g.capacity_type == "SPOT" else "On-Demand"
        code, need, limit = self._family_vcpus(g.instance_type, g.capacity_type)
        err = ""
        if need > limit:
            err_code = "MaxSpotInstanceCountExceeded" if g.capacity_type == "SPOT" else "VcpuLimitExceeded"
            err = (f"You have requested more vCPU capacity than your current vCPU limit of {limit:g} allows for the "
                   "instance bucket that the specified instance type belongs to. Please visit "
                   "http://aws.amazon.com/contact-us/ec2-request to request an adjustment to this limit.")
        elif any(s.active(expand(self.now()), g.zone, g.instance_type, g.capacity_type) for s in self.sc.stockouts):
            err_code = "InsufficientInstanceCapacity"
            others = [z for z in self.sc.zones if z != g.zone]
            err = (f"We currently do not have sufficient {g.instance_type} capacity in the Availability Zone you "
                   f"requested ({g.zone}). Our system will be working on provisioning additional capacity. You can "
                   f"currently get {g.instance_type} capacity by not specifying an Availability Zone in your request "
                   f"or choosing {', '.join(others)}.")
        iid = "i-" + uuid.UUID(int=grp.rng.getrandbits(128)).hex[:17] if not err else ""
        if not err and self.sc.topology.enabled:  # a host; a cluster placement group's instances share one block
            domain = g.placement_group or g.name
            want = grp.desired - sum(1 for i in self.instances.values() if i.nodegroup == g.name and i.live)
            if self.hosts.place(site(g.zone, g.instance_type), domain, iid, bool(g.placement_group), want) is None:
                err_code = "InsufficientInstanceCapacity"
                err = (f"We currently do not have sufficient {g.instance_type} capacity in the Availability Zone you "
                       f"requested ({g.zone}) for placement group {g.placement_group}. Our system will be working "
                       "on provisioning additional capacity.")
        if err:
            self._activity(grp, "Launching a new EC2 instance.  Status Reason: " + err + " Launching EC2 instance "
                           "failed.", "an instance was started in response to a difference between desired and "
                           "actual capacity, increasing the capacity", "Failed", err + " Launching EC2 instance failed.")
            issue = {"code": "AsgInstanceLaunchFailures",
                     "message": f"Could not launch {kind} Instances. {err_code} - {err} Launching EC2 instance failed.",
                     "resourceIds": [grp.asg]}
            grp.issues[:] = [issue]
            return False
        n = next(self.ips)
        zi = self.sc.zones.index(g.zone)
        ip = f"10.{self.octet}.{zi * 32 + n // 250}.{n % 250 + 4}"
        dns = f"ip-{ip.replace('.', '-')}." + ("ec2.internal" if self.sc.region == "us-east-1"
                                               else f"{self.sc.region}.compute.internal")
        inst = Instance(iid, g.name, g.zone, g.instance_type, g.capacity_type, ip, dns, self.now())
        if self.sc.topology.enabled:
            inst.labels = self.hosts.aws_labels(iid)
        self.instances[iid] = inst
        self._activity(grp, f"Launching a new EC2 instance: {iid}", "an instance was started in response to a "
                       "difference between desired and actual capacity, increasing the capacity", "Successful")
        boot = (g.boot or DEFAULT_BOOT).sample(grp.rng)
        self._later(boot, lambda: self._booted(grp, inst))
        return True

    def _booted(self, grp: Group, inst: Instance) -> None:
        if inst.state != "pending":
            return
        inst.state, inst.lifecycle = "running", "InService"
        gpus = self.shapes[inst.instance_type][1].gpus
        self._node(lambda: self.backend.register(inst, grp.spec, self.sc.cluster, False))  # type: ignore[union-attr]
        self._later(self.sc.device_plugin_s, lambda: self._node(
            lambda: self.backend.gpus_ready(inst.dns, gpus)) if inst.state == "running" else None)  # type: ignore[union-attr]

    def _terminate(self, grp: Group, inst: Instance, cause: str) -> dict[str, Any]:
        was_running = inst.state == "running"
        inst.lifecycle, inst.state = "Terminating", "shutting-down"
        act = self._activity(grp, f"Terminating EC2 instance: {inst.id}", cause, "InProgress")
        if was_running:
            self._node(lambda: self.backend.drain(inst.dns))  # type: ignore[union-attr]

        def gone() -> None:
            inst.state, inst.lifecycle = "terminated", "Terminated"
            self.hosts.release(inst.id)
            act["StatusCode"] = "Successful"
            self._node(lambda: self.backend.delete(inst.dns))  # type: ignore[union-attr]
        self._later(self.sc.terminate_s if was_running else 1.0, gone)
        return act

    def terminate_instance(self, iid: str, decrement: bool) -> dict[str, Any]:
        """TerminateInstanceInAutoScalingGroup. Raises: AwsError ValidationError."""
        with self.lock:
            inst = self.instances.get(iid)
            if inst is None or inst.lifecycle in ("Terminating", "Terminated"):
                raise AwsError("ValidationError", f"Instance Id not found - No managed instance found for instance "
                               f"ID: {iid}")
            grp = self.groups[inst.nodegroup]
            if decrement:
                if grp.desired - 1 < grp.min_size:
                    raise AwsError("ValidationError", f"Currently, desiredSize equals minSize ({grp.min_size}). "
                                   "Terminating instance without replacement will violate group's min size "
                                   "constraint. Either set shouldDecrementDesiredCapacity flag to false or lower "
                                   "group's min size.")
                grp.desired -= 1
            act = self._terminate(grp, inst, f"instance {iid} was taken out of service in response to a user "
                                  "request" + (", shrinking the capacity" if decrement else ""))
            if not decrement:
                self._reconcile(grp)
        self._flush()
        return act

    # ---- Spot interruptions --------------------------------------------------------------------
    def interrupt(self, iid: str) -> dict[str, Any]:
        """The EC2 Spot interruption notice: EKS cordons and drains the node; EC2 terminates the instance
        ``notice_s`` later; the ASG launches a replacement (desired capacity unchanged).

        Raises: AwsError (not a running Spot instance of a node group)."""
        with self.lock:
            inst = self.instances.get(iid)
            if inst is None or inst.capacity_type != "SPOT" or inst.state not in ("running", "pending"):
                raise AwsError("InvalidInstanceID", f"{iid} is not a running Spot instance of the stand-in")
            if inst.notice_deadline is not None:
                return self._notice_doc(inst)
            grp = self.groups[inst.nodegroup]
            inst.notice_deadline = self.now() + compress(self.sc.notice_s)
            self._node(lambda: self.backend.drain(inst.dns))  # type: ignore[union-attr]

            def reclaimed() -> None:
                inst.state, inst.lifecycle = "terminated", "Terminated"
                self.hosts.release(inst.id)  # a terminated instance holds no host, as in _terminate
                self._activity(grp, f"Terminating EC2 instance: {inst.id}", f"instance {inst.id} was taken out of "
                               "service in response to an EC2 Spot Instance interruption", "Successful")
                self._node(lambda: self.backend.delete(inst.dns))  # type: ignore[union-attr]
                self._reconcile(grp)  # desired capacity unchanged: the group launches a replacement
            self._later(self.sc.notice_s, reclaimed)
            doc = self._notice_doc(inst)
        self._flush()
        return doc

    def _notice_doc(self, inst: Instance) -> dict[str, Any]:
        return {"instance": inst.id, "node": inst.dns, "nodegroup": inst.nodegroup, "noticeS": self.sc.notice_s,
                "action": "terminate"}

    def interrupt_group(self, name: str, count: int) -> list[dict[str, Any]]:
        with self.lock:
            ids = [i.id for i in self.instances.values() if i.nodegroup == name and i.state == "running"
                   and i.notice_deadline is None][:count]
        return [self.interrupt(i) for i in ids]

    def _scheduled_interrupt(self, name: str, count: int) -> None:
        self.interrupt_group(name, count)

    def by_node(self, node: str) -> Instance | None:
        with self.lock:
            return next((i for i in self.instances.values() if i.dns == node and i.state != "terminated"), None)

    def snapshot(self) -> dict[str, Any]:
        with self.lock:
            return {"nodegroups": {n: {"desired": g.desired, "min": g.min_size, "max": g.max_size,
                                       "status": g.status, "issues": list(g.issues)} for n, g in self.groups.items()},
                    "instances": {i.id: {"node": i.dns, "nodegroup": i.nodegroup, "state": i.state,
                                         "lifecycle": i.lifecycle, "spotNotice": i.notice_deadline is not None}
                                  for i in self.instances.values() if i.state != "terminated"}}

    def close(self) -> None:
        self._worker.shutdown(wait=True)


def _logged(fn: Callable[[], None]) -> None:
    try:
        fn()
    except Exception:  # noqa: BLE001 - one node's failure must not stop the others
        log.exception("AWS stand-in node backend call failed")
