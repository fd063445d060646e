"""One side of the burst benchmark, run as its own process: ``python -m bench.peers '<json args>'``.

Protocol with the harness (bench/burst.py), one line each: the child sets up (imports, clients) and prints
``READY``; on ``go`` it obtains capacity its own way and starts the gang (N pods, 8 GPUs each, label
``kfp-gpu.io/bench-gang=<tag>``); on ``release`` (the job ended) it deletes the gang and gives the capacity back
its own way, then prints ``RESULT {json}`` (its API request count, peak RSS) and exits. The harness's one
external watch times everything; nothing the child measures is used as a time.

Sides: ``naive`` (one setSize(N), poll Nodes every 10 s world time), ``sequential`` (setSize(i), wait for node i),
``cluster_autoscaler`` (N pending pods for the bench's cluster-autoscaler node group), ``cluster_autoscaler_provreq``
(PodTemplate + atomic ProvisioningRequest served by the dev cluster's CA profile, then consuming pods),
``karpenter`` (a NodePool + N pending pods for Karpenter's kwok provider), ``ours_<backend>``: the product as a
pipeline runs it (bench/ours.py): the steps are :func:`kfp_gpu.gang.client.request` calls with the tenant's
``kfp-gpu`` token (``step_kubeconfig``) and the bench's kfp-gpu controller does the work. Before ``READY`` (as the
pipeline's earlier steps): preflight (creates the run's GpuGang) and warm_pool (disabled: no warm pool); on ``go``
the burst_scale_up step (raise the gang to Provisioned and wait), then the gang pinned to the nodes the controller
recorded (``status.outputs.scale_up``, read as admin); on ``release`` the teardown step (release, gang deleted).
``kube_requests`` of ours counts the step's own requests (the gang writes and watch) and the bench's pod writes,
not the controller's.
"""

from __future__ import annotations

import json
import resource
import sys
import time
import urllib.error
import urllib.request
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from kubernetes import client

from bench.common import GPU, RequestCounter, new_api, pin_to
from bench.observe import GANG_LABEL
from bench.sides import KARPENTER_CLUSTER
from bench.world import ACCEL, GPUS, POLL_S, REGION
from kfp_gpu import iam
from kfp_gpu.plan import readiness
from kfp_gpu_rehearsal.devcluster.nodes import IMAGE_PULL_ANNOTATION

GPU_TOL = {"key": GPU, "operator": "Exists", "effect": "NoSchedule"}
PROVREQ_CLASS = "best-effort-atomic-scale-up.autoscaling.x-k8s.io"
KARPENTER_ACCEL, KARPENTER_TYPE, KARPENTER_ZONE = "a100-40gb", "p4d.24xlarge", "us-east-1a"


def _gang_pod(tag: str, i: int, *, node: str = "", selector: dict[str, str] | None = None,
              tolerations: list[dict[str, str]] | None = None, annotations: dict[str, str] | None = None) -> dict:
    spec: dict[str, Any] = {
        "terminationGracePeriodSeconds": 0, "tolerations": [GPU_TOL, *(tolerations or [])],
        "containers": [{"name": "worker", "image": "busybox", "command": ["sleep", "infinity"],
                        "resources": {"requests": {GPU: str(GPUS), "cpu": "1"}, "limits": {GPU: str(GPUS)}}}]}
    if node:  # through the scheduler: the bench namespace is a kfp-gpu tenant, whose policy refuses spec.nodeName
        spec["affinity"] = pin_to(node)
    if selector:
        spec["nodeSelector"] = dict(selector)
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"{tag}-w{i}", "labels": {GANG_LABEL: tag},
                         "annotations": {IMAGE_PULL_ANNOTATION: "world", **(annotations or {})}},  # world's pull
            "spec": spec}


class Side:
    def __init__(self, a: dict[str, Any]) -> None:
        self.a = a
        self.n, self.ns, self.tag = int(a["n"]), str(a["namespace"]), str(a["tag"])
        self.api = new_api()
        self.counter = RequestCounter(self.api)
        self.core = client.CoreV1Api(self.api)
        self.custom = client.CustomObjectsApi(self.api)
        self.extra: dict[str, Any] = {}
        self.steps: client.ApiClient | None = None  # ours: the tenant step identity (bench/ours.py)
        self.step_counter: RequestCounter | None = None

    # ---- shared ----------------------------------------------------------------------------------
    def gang(self, pods: list[dict[str, Any]]) -> None:
        with ThreadPoolExecutor(max_workers=16) as ex:
            list(ex.map(lambda b: self.core.create_namespaced_pod(self.ns, b), pods))

    def delete_gang(self) -> None:
        self.core.delete_collection_namespaced_pod(self.ns, label_selector=f"{GANG_LABEL}={self.tag}",
                                                   grace_period_seconds=0)

    def cloud(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """A hand-written REST call to the stand-in, retried on 5xx/429/'operation in progress' like a user's
        script with a retry loop would (every 0.5 s, world time 1 min)."""
        url = f"{self.a['url']}{path}"
        for _ in range(60):
            req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                         headers={"Content-Type": "application/json",  # the stand-in enforces IAM
                                                  "Authorization": f"Bearer {iam.SIM_GCP_TOKEN}"})
            try:
                with urllib.request.urlopen(req, timeout=30) as r:
                    return dict(json.loads(r.read() or b"{}"))
            except urllib.error.HTTPError as exc:
                if exc.code not in (400, 403, 429, 500, 503):
                    raise
                time.sleep(0.5 if exc.code == 400 else 0.1)
        raise RuntimeError(f"{path}: still refused after 60 tries")

    def set_size(self, size: int) -> None:
        z = self.a["zone"]
        self.cloud(f"/v1/projects/local-project/locations/{z}/clusters/{self.a['cluster']}"
                   f"/nodePools/{self.a['pool']}:setSize", {"nodeCount": size})

    def ready_nodes(self) -> list[str]:
        out = []
        for nd in self.core.list_node(label_selector=f"kfp-gpu.io/sim-cluster={self.a['cluster']}").items:
            if readiness.is_ready(nd.to_dict(), gpus=1):  # kfp-gpu's one readiness predicate
                out.append(nd.metadata.name)
        return sorted(out)

    # ---- peers -----------------------------------------------------------------------------------
    def go_naive(self) -> None:
        self.set_size(self.n)
        while len(nodes := self.ready_nodes()) < self.n:
            time.sleep(POLL_S)
        self.gang([_gang_pod(self.tag, i, node=nd) for i, nd in enumerate(nodes[:self.n])])

    def go_sequential(self) -> None:
        for i in range(1, self.n + 1):
            self.set_size(i)
            while len(self.ready_nodes()) < i:
                time.sleep(0.02)
        self.gang([_gang_pod(self.tag, i, node=nd) for i, nd in enumerate(self.ready_nodes()[:self.n])])

    def release_pool(self) -> None:
        self.delete_gang()
        self.set_size(0)

    def go_cluster_autoscaler(self) -> None:
        self.gang([_gang_pod(self.tag, i, selector={"cloud.google.com/gke-nodepool": self.a["pool"]})
                   for i in range(self.n)])

    def go_cluster_autoscaler_provreq(self) -> None:
        from kfp_gpu_rehearsal.devcluster import ca_profile

        tols = [ca_profile.toleration(), ca_profile.toleration(ca_profile.BENCH_TAINT)]
        sel = {"cloud.google.com/gke-nodepool": self.a["pool"]}
        name = self.tag
        tmpl = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": name, "labels": {GANG_LABEL + "-obj": name}},
                "template": {"spec": _gang_pod(name, 0, selector=sel, tolerations=tols)["spec"]}}
        self.core.create_namespaced_pod_template(self.ns, tmpl)
        pr = {"apiVersion": "autoscaling.x-k8s.io/v1", "kind": "ProvisioningRequest", "metadata": {"name": name},
              "spec": {"provisioningClassName": PROVREQ_CLASS,
                       "podSets": [{"podTemplateRef": {"name": name}, "count": self.n}]}}
        self.custom.create_namespaced_custom_object("autoscaling.x-k8s.io", "v1", self.ns, "provisioningrequests", pr)
        while True:  # `kubectl wait --for=condition=Provisioned`, as a poll at the world's 10 s
            got = self.custom.get_namespaced_custom_object("autoscaling.x-k8s.io", "v1", self.ns,
                                                           "provisioningrequests", name)
            conds = {c["type"]: c for c in (got.get("status") or {}).get("conditions") or []}
            if conds.get("Provisioned", {}).get("status") == "True":
                break
            if conds.get("Failed", {}).get("status") == "True":
                raise RuntimeError(f"ProvisioningRequest failed: {conds['Failed']}")
            time.sleep(POLL_S)
        ann = {"autoscaling.x-k8s.io/consume-provisioning-request": name,
               "autoscaling.x-k8s.io/provisioning-class-name": PROVREQ_CLASS}
        self.gang([_gang_pod(self.tag, i, selector=sel, tolerations=tols, annotations=ann) for i in range(self.n)])

    def release_cluster_autoscaler_provreq(self) -> None:
        self.delete_gang()
        self.custom.delete_namespaced_custom_object("autoscaling.x-k8s.io", "v1", self.ns, "provisioningrequests",
                                                    self.tag)
        self.core.delete_namespaced_pod_template(self.tag, self.ns)

    def go_karpenter(self) -> None:
        from kfp_gpu_rehearsal.devcluster import karpenter_profile as kp
        from kfp_gpu_rehearsal.devcluster.nodes import BOOT_INJECTION_LABEL, NOT_READY_TAINT

        name = self.tag
        taint = {"key": "kfp-gpu.io/bench", "value": name, "effect": "NoSchedule"}
        # the harness's KWOKNodeClass registers the Node at launch; the label makes KWOK hold it NotReady until the
        # harness's injector sets its boot from the world's sampler; the startup taint keeps pods off it meanwhile
        # (kube-controller-manager removes node.kubernetes.io/not-ready once the Node is Ready, as for a kubelet)
        labels = {"kfp-gpu.io/bench-nodepool": name, BOOT_INJECTION_LABEL: "pending"}
        body = {"apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": name},
                "spec": {"template": {"metadata": {"labels": labels},
                                      "spec": {"nodeClassRef": {"group": kp.NODECLASS_GROUP, "kind": "KWOKNodeClass",
                                                                "name": self.a.get("node_class", kp.NODE_CLASS)},
                                               "startupTaints": [dict(NOT_READY_TAINT)],
                                               "requirements": [
                                                   {"key": "node.kubernetes.io/instance-type", "operator": "In",
                                                    "values": [KARPENTER_TYPE]},
                                                   {"key": "karpenter.sh/capacity-type", "operator": "In",
                                                    "values": ["spot"]},
                                                   {"key": "topology.kubernetes.io/zone", "operator": "In",
                                                    "values": [KARPENTER_ZONE]}],
                                               "taints": [taint], "expireAfter": "Never"}},
                         "limits": {GPU: str(self.n * GPUS)},
                         # scale-down when empty after 10 world minutes (5 s), as the CA profile's unneeded time
                         "disruption": {"consolidationPolicy": "WhenEmpty", "consolidateAfter": "5s"}}}
        self.custom.create_cluster_custom_object("karpenter.sh", "v1", "nodepools", body)
        tol = {"key": taint["key"], "operator": "Equal", "value": name, "effect": "NoSchedule"}
        self.gang([_gang_pod(self.tag, i, selector={"karpenter.sh/nodepool": name}, tolerations=[tol])
                   for i in range(self.n)])

    # ---- ours ------------------------------------------------------------------------------------
    def requests(self) -> int:
        return self.counter.count + (self.step_counter.count if self.step_counter is not None else 0)

    def reset_requests(self) -> None:
        self.counter.reset()
        if self.step_counter is not None:
            self.step_counter.reset()

    def ours_setup(self) -> None:
        """The pipeline's steps before the scale-up (not timed): preflight creates the run's GpuGang (the
        controller admits it and runs the checks), warm_pool holds nothing (no warm pool asked)."""
        from bench import ours

        self.spec = self.ours_spec()
        self.run_id = self.a.get("run_id") or f"bench-{uuid.uuid4().hex[:8]}"  # the harness names some (its watch)
        print(f"RUN {self.run_id}", flush=True)  # the harness tears this run down if this process dies mid-step
        self.steps = ours.step_api(self.a["step_kubeconfig"])
        self.step_counter = RequestCounter(self.steps)
        ours.request("preflight", self.spec, self.run_id, self.steps)
        ours.request("warm_pool", self.spec, self.run_id, self.steps)

    def ours_spec(self) -> Any:
        from kfp_gpu.spec import CapacityType, ProvisioningSpec, Target
        from kfp_gpu_rehearsal.devcluster import ca_profile

        backend = self.a["side"][len("ours_"):].replace("_", "-")
        # the harness's own budget for the gang (burst.gang_timeout) less a margin, so ours reports TIMEOUT itself
        deadline_s = float(self.a.get("deadline_s", 300))
        if backend == "node-pool":
            return ProvisioningSpec(ACCEL, self.n, gpus_per_node=GPUS, zones=tuple(self.a["zones"]),
                                    scale_up_deadline_s=deadline_s,
                                    target=Target(kind="local", cluster=self.a["cluster"], region=REGION,
                                                  endpoint=self.a["url"], namespace=self.ns,
                                                  pools=tuple(self.a["pools"]), provisioner="node-pool"))
        if backend == "provisioning-request":
            return ProvisioningSpec(ACCEL, self.n, gpus_per_node=GPUS, zones=(ca_profile.BENCH_ZONE,),
                                    scale_up_deadline_s=deadline_s,
                                    target=Target(kind="local", cluster=ca_profile.CLUSTER, region=REGION,
                                                  endpoint=self.a.get("url", ""), namespace=self.ns,
                                                  pools=(self.a["pool"],),
                                                  tolerations=(ca_profile.TAINT, ca_profile.BENCH_TAINT),
                                                  provisioner=backend))
        if backend == "compute-class":  # the run's ComputeClass: on-demand first, then Spot (the world has no spot room)
            return ProvisioningSpec(ACCEL, self.n, gpus_per_node=GPUS, capacity=CapacityType.ON_DEMAND,
                                    fallback=("spot",), zones=(self.a["zone"],), scale_up_deadline_s=deadline_s,
                                    target=Target(kind="local", cluster=self.a["cluster"], region=REGION,
                                                  endpoint=self.a["url"], namespace=self.ns, provisioner=backend))
        if backend == "karpenter":
            return ProvisioningSpec(KARPENTER_ACCEL, self.n, gpus_per_node=GPUS, capacity=CapacityType.SPOT,
                                    zones=(KARPENTER_ZONE,), scale_up_deadline_s=deadline_s,
                                    target=Target(kind="eks", cluster=KARPENTER_CLUSTER, region="us-east-1",
                                                  endpoint=self.a.get("url", ""), namespace=self.ns,
                                                  provisioner=backend))
        raise ValueError(f"unknown backend {backend!r}")

    def go_ours(self) -> None:
        from bench import ours

        assert self.steps is not None
        ours.request("scale_up", self.spec, self.run_id, self.steps)
        returned = time.time()
        cap = ours.capacity_of(self.api, self.ns, self.run_id)  # the gang's status, as admin
        self.extra["profile_abs"] = {**_profile(cap.timeline_json, returned),
                                     **_controller_profile(self.api, self.ns, self.run_id)}
        from kfp_gpu.cluster.capacity import parse_toleration
        from kfp_gpu.cluster.nodes import run_toleration

        claim = run_toleration(self.run_id, self.ns)  # ours' gang nodes carry the run's claim taint
        # and the taints the capacity names (a ComputeClass's, a Karpenter NodePool's), as the train step's pods do
        more = [parse_toleration(str(t)) for t in cap.extra.get("tolerations") or []]
        self.gang([_gang_pod(self.tag, i, node=nd, tolerations=[claim, *more]) for i, nd in enumerate(cap.nodes)])

    def release_ours(self) -> None:
        from bench import ours

        assert self.steps is not None
        self.delete_gang()
        ours.request("teardown", self.spec, self.run_id, self.steps)


def _controller_profile(admin: client.ApiClient, namespace: str, run_id: str) -> dict[str, float]:
    """When the controller started the scale-up's work unit and recorded its outcome (its Events; absolute)."""
    from bench import ours

    out: dict[str, float] = {}
    for t, reason, _ in ours.gang_events(admin, namespace, run_id):
        key = {"ScaleUpStarted": "controller_scale_up_started", "Provisioned": "controller_provisioned"}.get(reason)
        if key:
            out.setdefault(key, t)
    return out


def _profile(timeline_json: str, returned: float) -> dict[str, float]:
    """Where ours' step spent its time, from its own timeline (absolute times; a profile, never the measurement)."""
    from kfp_gpu.timeline import NodeState, Timeline

    tl = Timeline.from_json(timeline_json)
    out: dict[str, float] = {"step_returned": returned}
    for key, st, pick in (("first_requested", NodeState.REQUESTED, min), ("last_registered", NodeState.REGISTERED, max),
                          ("last_ready_seen_by_step", NodeState.READY, max)):
        ts = [t for nt in tl.nodes.values() if (t := nt.at(st)) is not None]
        if ts:
            out[key] = pick(ts)
    return out


def _warm_imports(side: str) -> None:
    """Imports a step process pays before its work (not part of the measured request-to-gang time)."""
    if side.startswith("ours_"):
        import kfp_gpu.gang.client  # noqa: F401
        from kfp_gpu.steps.capacity import Capacity  # noqa: F401
        from kfp_gpu.timeline import Timeline  # noqa: F401


def release_only(a: dict[str, Any]) -> int:
    """``--release '<args + run_id>'``: ours' teardown step for a run whose side process was killed mid-step
    (through the gang, as the pipeline's exit handler would; a gang the controller already released on its
    owner's exit is a no-op)."""
    from bench import ours

    s = Side(a)
    steps = ours.step_api(a["step_kubeconfig"])
    try:
        ours.request("teardown", s.ours_spec(), str(a["run_id"]), steps)
    finally:
        steps.close()
    return 0


def main(argv: list[str]) -> int:
    if argv and argv[0] == "--release":
        return release_only(json.loads(argv[1]))
    a = json.loads(argv[0])
    side_name = str(a["side"])
    _warm_imports(side_name)
    s = Side(a)
    if side_name.startswith("ours_"):
        try:
            s.ours_setup()
        except Exception as exc:  # noqa: BLE001 - reported to the harness (it waits for READY)
            print("FAILED " + json.dumps(f"setup: {type(exc).__name__}: {exc}"[:800]), flush=True)
            return 1
    go = getattr(s, "go_ours" if side_name.startswith("ours_") else f"go_{side_name}")
    release = {"naive": s.release_pool, "sequential": s.release_pool, "cluster_autoscaler": s.delete_gang,
               "cluster_autoscaler_provreq": s.release_cluster_autoscaler_provreq,
               "karpenter": s.delete_gang}.get(side_name, s.release_ours)
    print("READY", flush=True)
    err = ""
    if sys.stdin.readline().strip() == "go":
        s.reset_requests()
        try:
            go()
            print("GANG", flush=True)
        except Exception as exc:  # noqa: BLE001 - reported to the harness
            err = f"{type(exc).__name__}: {exc}"[:800]
            print("FAILED " + json.dumps(err), flush=True)
        sys.stdin.readline()  # release
        kube_at_gang = s.requests()
        try:
            release()
        except Exception as exc:  # noqa: BLE001
            err = err or f"release: {type(exc).__name__}: {exc}"[:800]
        s.extra["kube_requests_release"] = s.requests() - kube_at_gang
        s.extra["kube_requests"] = kube_at_gang
    print("RESULT " + json.dumps({"error": err, "peak_rss_mib": round(
        resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0, 1), **s.extra}), flush=True)
    s.api.close()
    if s.steps is not None:
        s.steps.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
