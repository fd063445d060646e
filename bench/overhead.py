"""Control-plane overhead at zero boot: 512 GPUs (64 nodes x 8) and 4,096 GPUs (512 x 8), on the bench world
(bench/world.py: stand-in process, 100 ms API latency; boot, operation and device-plugin times zero; no 5xx).

Ours as the product runs it (bench/ours.py): the bench process's kfp-gpu controller does the work; each step is
what a component does, :func:`kfp_gpu.gang.client.request` with the tenant's ``kfp-gpu`` token, timed by the
harness around that call (ours only: no peer):

* ``preflight``: the request that creates the run's GpuGang and raises ``spec.stage`` to Preflighted, until the
  step's watch sees the condition (the controller admits the gang against its GpuPolicy, then runs the preflight
  with the cluster checks in a work unit);
* ``warm_pool``: raise to WarmPoolHeld (balloons + request the whole gang, no wait), until the condition;
* ``scale_up``: raise to Provisioned (waits for the n nodes and claims them), until the condition;
* ``job_launch``: from the train request (``request("train", job_json=...)`` in a thread: the step adds its job
  to ``spec.jobs``) until the PyTorchJob's n pods all exist and are bound to nodes (``spec.nodeName``), as the
  bench's own admin pod watch sees them. The job then runs to completion (1 s of KWOK time) and the run is torn
  down with ``request("teardown")``: neither is timed.

``total`` = preflight + warm_pool + scale_up + job_launch. Targets: ``total`` < 2 s at 512 GPUs and < 6 s at 4,096.

Zero boot is not zero time: the stand-in registers the Nodes and KWOK makes them Ready on the same 2-core control
plane. ``world_nodes_ready`` (not a step, not in ``total``) is when the bench's external watch (bench/observe.py)
saw the last of the n Nodes Ready with GPUs, counted from the warm pool request: the floor under warm pool +
scale-up that no provisioner can beat on this machine. ``above_world`` = ``total`` - ``world_nodes_ready`` per
sample: the control plane's time above the world's own node-Ready time (targets: <= 0.5 s at 512 GPUs, <= 2.0 s at
4,096). ``launch_alone`` (PyTorchJob only; not a step, not in ``total``): once ours has run, the admin creates the
same PyTorchJob (the pod templates kfp-gpu rendered) on the same claimed nodes with no kfp-gpu step, and the same
watch times its create -> n pods bound: the Training Operator's own launch of this job on this machine (as the dev
cluster runs it: kfp_gpu_rehearsal/devcluster/boot.py). ``above_world_and_operator`` = ``above_world`` -
``launch_alone``: what kfp-gpu adds above both. It runs after ours in each repeat, with our controller idle.

A profile per sample (``profile``, never the measurement): per step, ``<step>_dispatch`` (the step's patch -> the
controller started the work unit), ``<step>_work`` (unit started -> outcome recorded) and ``<step>_answer``
(recorded -> the step's watch returned), from the Events the controller posts (bench/ours.py
:func:`~bench.ours.stage_profile`); ``<step>_fn`` (the step function's own time, from its metrics) and
``<step>_unit`` (``_work`` - ``_fn``); after the train request: ``train_job-created`` (the train step's gate passed
and the PyTorchJob created, from its timeline), ``job_pods_added`` / ``job_pods_all_added`` (the Training
Operator's first / n-th pod seen), ``job_pods_first_bound`` / ``job_pods_half_bound``, and the warm pool's balloons
(``balloons_at_train``; ``balloons_first_deleted`` / ``balloons_last_deleted``: the job's pods preempt them);
and where the job launch's wall went on this machine (bench/machine.py): ``launch_cpu_capacity`` (wall x cores),
``launch_cpu_busy`` and ``launch_cpu_<process group>`` in CPU seconds, and ``launch_api_post_pods_s`` /
``launch_api_post_services_s`` (the API server's own time on the job's pod and Service creates, summed; ``_n``:
how many).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kubernetes import client

from bench import machine, ours
from bench.common import delete_nodes, kubeconfig, new_api, stats, uid
from bench.observe import Observer, _RawWatch
from bench.world import StandIn, pool_name, scenario

GPUS = 8
STEPS = ("preflight", "warm_pool", "scale_up", "job_launch")
JOB_RUN = "1s"  # how long KWOK keeps the job's pods Running: the train step then returns (not timed)


class _BoundPods:
    """The job's pods (label ``kfp-gpu.io/job``) as the admin's watch sees them: when each appeared and was bound
    to a node (``n`` bound = the end of ``job_launch``); and the run's warm-pool balloons (which the job's pods
    preempt through the scheduler): when each was deleted. The balloons are a profile only."""

    def __init__(self, api: client.ApiClient, namespace: str, job: str, n: int, run_id: str) -> None:
        from kfp_gpu.ownership import BALLOON_LABEL, JOB_LABEL, LABEL_RUN_ID, label_safe

        self.n = n
        self.cond = threading.Condition()
        self.added: dict[str, float] = {}
        self.bound: dict[str, float] = {}
        self.all_bound: float | None = None
        self.balloons: dict[str, float | None] = {}  # uid -> deleted (deletionTimestamp seen) at
        self.w = _RawWatch(api, f"/api/v1/namespaces/{namespace}/pods", f"{JOB_LABEL}={job}", self._on)
        self.bw = _RawWatch(api, f"/api/v1/namespaces/{namespace}/pods",
                            f"{BALLOON_LABEL}=true,{LABEL_RUN_ID}={label_safe(run_id)}", self._balloon)

    def start(self) -> _BoundPods:
        for w in (self.w, self.bw):
            w.t.start()
            if not w.synced.wait(30.0):
                raise RuntimeError("the job pod watch did not sync")
        return self

    @property
    def first_added(self) -> float | None:
        with self.cond:
            return min(self.added.values(), default=None)

    def _on(self, kind: str, obj: dict[str, Any]) -> None:
        now = time.time()
        uid = str((obj.get("metadata") or {}).get("uid"))
        with self.cond:
            self.added.setdefault(uid, now)
            if (obj.get("spec") or {}).get("nodeName") and kind != "DELETED":
                self.bound.setdefault(uid, now)
            if self.all_bound is None and len(self.bound) >= self.n:
                self.all_bound = now
            self.cond.notify_all()

    def _balloon(self, kind: str, obj: dict[str, Any]) -> None:
        now = time.time()
        md = obj.get("metadata") or {}
        with self.cond:
            self.balloons.setdefault(str(md.get("uid")), None)
            if (kind == "DELETED" or md.get("deletionTimestamp")) and self.balloons[str(md.get("uid"))] is None:
                self.balloons[str(md.get("uid"))] = now

    def profile(self, t0: float) -> dict[str, float]:
        """Seconds after ``t0`` (the train request): the job's first / n-th pod seen, first / median pod bound,
        the run's balloons there at the request and when the first / last of them was deleted."""
        out: dict[str, float] = {}
        with self.cond:
            added, bound = sorted(self.added.values()), sorted(self.bound.values())
            gone = sorted(t for t in self.balloons.values() if t is not None)
            out["balloons_at_train"] = float(len(self.balloons))
        if added:
            out["job_pods_added"] = added[0] - t0
            out["job_pods_all_added"] = added[min(len(added), self.n) - 1] - t0
        if bound:
            out["job_pods_first_bound"] = bound[0] - t0
            out["job_pods_half_bound"] = bound[len(bound) // 2] - t0
        if gone:
            out["balloons_first_deleted"] = gone[0] - t0
            out["balloons_last_deleted"] = gone[-1] - t0
        return {k: round(v, 4) for k, v in out.items()}

    def wait(self, timeout_s: float, failed: Any) -> float:
        end = time.time() + timeout_s
        with self.cond:
            while self.all_bound is None:
                if failed():
                    raise RuntimeError(f"the train step ended before the job was placed: {failed()}")
                left = end - time.time()
                if left <= 0:
                    raise RuntimeError(f"only {len(self.bound)}/{self.n} job pods bound after {timeout_s:g}s")
                self.cond.wait(min(left, 0.25))
            return self.all_bound

    def close(self) -> None:
        self.w.close()
        self.bw.close()


def _inside(obj: dict[str, Any] | None, prof: dict[str, float], train_json: str, t_train: float) -> dict[str, float]:
    """Inside the controller's work units (a profile): each step function's own time from its metrics
    (``<step>_fn``), the unit's time around it (``<step>_unit`` = ``<step>_work`` - ``<step>_fn``: fork, clients,
    result file, reaping, status write), and the train step's first timeline events after the train request
    (``train_<event>``: gate passed = ``train_job-created``)."""
    import json

    out: dict[str, float] = {}
    results = ((obj or {}).get("status") or {}).get("results") or {}
    for step, stage, metric in (("preflight", "Preflighted", "preflight_seconds"),
                                ("warm_pool", "WarmPoolHeld", "warm_pool_seconds"),
                                ("scale_up", "Provisioned", "scale_up_seconds")):
        v = ((results.get(stage) or {}).get("metrics") or {}).get(metric)
        if v is not None:
            out[f"{step}_fn"] = round(float(v), 4)
            if f"{step}_work" in prof:
                out[f"{step}_unit"] = round(prof[f"{step}_work"] - float(v), 4)
    try:
        events = json.loads(json.loads(train_json).get("timeline") or "{}").get("events") or []
    except (ValueError, AttributeError):
        events = []
    for e in events:
        key = f"train_{e.get('kind')}"
        if key not in out and isinstance(e.get("t"), (int, float)) and e["t"] >= t_train - 1.0:
            out[key] = round(float(e["t"]) - t_train, 4)
    return out


def _operator_alone(api: client.ApiClient, namespace: str, job_obj: dict[str, Any], n: int) -> dict[str, float]:
    """The same PyTorchJob (its pod templates: tolerations, node selectors, resources) created by the admin, with no
    kfp-gpu step, on the same claimed nodes once ours has finished: seconds from the create until its ``n`` pods are
    all bound (``launch_alone``), with where that wall went (``alone_cpu_*``, ``alone_api_*``). The Training
    Operator's own launch of this job on this machine: the part of ``job_launch`` kfp-gpu does not set."""
    from kfp_gpu.ownership import JOB_LABEL

    name = f"{job_obj['metadata']['name']}-alone"
    spec = json.loads(json.dumps(job_obj["spec"]))
    for rs in (spec.get("pytorchReplicaSpecs") or {}).values():
        md = rs.setdefault("template", {}).setdefault("metadata", {})
        md["labels"] = {k: v for k, v in (md.get("labels") or {}).items() if not k.startswith("kfp-gpu.io/")}
        md["labels"][JOB_LABEL] = name  # the bench's watch, never the controller's: no run id
    body = {"apiVersion": job_obj["apiVersion"], "kind": job_obj["kind"],
            "metadata": {"name": name, "namespace": namespace}, "spec": spec}
    co = client.CustomObjectsApi(api)
    pods = _BoundPods(api, namespace, name, n, "-").start()
    try:
        close = _window(api)
        t0 = time.time()
        co.create_namespaced_custom_object("kubeflow.org", "v1", namespace, "pytorchjobs", body)
        out = {"launch_alone": pods.wait(120.0 + 0.5 * n, lambda: None) - t0}
        out.update({f"alone_{k}": v for k, v in close().items()})
        return out
    finally:
        pods.close()
        co.delete_namespaced_custom_object("kubeflow.org", "v1", namespace, "pytorchjobs", name,
                                           body=client.V1DeleteOptions(propagation_policy="Background"))
        client.CoreV1Api(api).delete_collection_namespaced_pod(namespace, label_selector=f"{JOB_LABEL}={name}",
                                                               grace_period_seconds=0)


def _window(api: client.ApiClient) -> Callable[[], dict[str, float]]:
    """Open a profile window; the function returned closes it: where the wall in between went on this machine (CPU
    seconds per process group, :func:`bench.machine.cpu_used`; the API server's request seconds,
    :func:`bench.machine.api_diff`)."""
    api_before, cpu_before = machine.api_seconds(_metrics(api)), machine.snapshot()
    return lambda: {**machine.cpu_used(cpu_before, machine.snapshot()),
                    **machine.api_diff(api_before, machine.api_seconds(_metrics(api)))}


def _metrics(api: client.ApiClient) -> str:
    """The API server's Prometheus text (GET /metrics, the admin's client)."""
    resp = api.call_api("/metrics", "GET", auth_settings=["BearerToken"], _preload_content=False,
                        _request_timeout=30)
    return str(resp[0].data.decode())


def _one(n: int, namespace: str, step_kubeconfig: Path, obs: Observer | None = None,
         kind: str = "pytorchjob") -> dict[str, Any]:
    from kfp_gpu.cluster import pytorchjob
    from kfp_gpu.job import JobTemplate
    from kfp_gpu.jobkinds import for_template
    from kfp_gpu.spec import ProvisioningSpec, Target, WarmPool

    sim = StandIn(scenario(uid("bov"), 0, zero_boot=True), kubeconfig()).start()
    cluster = sim.cluster
    api = new_api()  # admin: the bench's own view (pods, the gang's status), never the steps'
    steps = ours.step_api(step_kubeconfig)
    sel = sim.selector
    out: dict[str, float] = {}
    asked: dict[str, float] = {}
    returned: dict[str, float] = {}
    run_id = uid("bov-")
    template = JobTemplate(name="bench", annotations={pytorchjob.SIM_DURATION_ANNOTATION: JOB_RUN}, kind=kind,
                           **({"image": "busybox", "command": ("true",)} if kind == "trainjob" else {}))
    job_kind = for_template(template)
    job = job_kind.job_name(run_id, template.name)
    train: dict[str, Any] = {}
    th: threading.Thread | None = None
    job_obj: dict[str, Any] | None = None
    spec = ProvisioningSpec("a100-80gb", n, gpus_per_node=GPUS, target=Target(
        kind="local", cluster=cluster, region="us-central1", endpoint=sim.url, namespace=namespace,
        pools=(pool_name("us-central1-a"),), provisioner="node-pool"),
        zones=("us-central1-a",), scale_up_deadline_s=300.0, warm_pool=WarmPool(nodes=n, ttl_s=600))
    try:
        for step in ("preflight", "warm_pool", "scale_up"):
            t, asked[step] = time.perf_counter(), time.time()
            ours.request(step, spec, run_id, steps)
            out[step] = time.perf_counter() - t
            returned[step] = time.time()
        if obs is not None:
            ready = [r.ready for r in obs.matching(lambda r: r.labels.get("kfp-gpu.io/sim-cluster") == cluster,
                                                   asked["warm_pool"]) if r.ready is not None]
            if len(ready) >= n:
                out["world_nodes_ready"] = max(ready) - asked["warm_pool"]
        pods = _BoundPods(api, namespace, job, n, run_id).start()
        train_api = ours.step_api(step_kubeconfig)

        def train_step() -> None:
            try:
                train["res"] = ours.request("train", spec, run_id, train_api, job_json=template.to_json(),
                                            dataset_uri="", queue_timeout_s=600.0)
            except BaseException as exc:  # noqa: BLE001 - re-raised in the bench thread
                train["err"] = exc
            finally:
                train_api.close()

        close = _window(api)
        try:
            asked["train"] = time.time()
            th = threading.Thread(target=train_step, daemon=True, name=f"bench-train-{run_id}")
            th.start()
            t_bound = pods.wait(120.0 + 0.5 * n, lambda: train.get("err"))
            out["job_launch"] = t_bound - asked["train"]
            job_obj = (client.CustomObjectsApi(api).get_namespaced_custom_object(
                "kubeflow.org", "v1", namespace, "pytorchjobs", job) if kind == "pytorchjob" else None)
            launch = close()
        finally:
            pods.close()
        out["total"] = sum(out[k] for k in STEPS)
        if "world_nodes_ready" in out:
            out["above_world"] = out["total"] - out["world_nodes_ready"]
        assert th is not None
        th.join(120.0 + 0.5 * n)  # the job runs JOB_RUN, then the train step returns (not timed)
        if th.is_alive():
            raise RuntimeError("the train step did not return after its job")
        if "err" in train:
            raise train["err"]
        if job_obj is not None:  # the Training Operator alone, on the same nodes: not in total
            alone = _operator_alone(api, namespace, job_obj, n)
            out["launch_alone"] = alone.pop("launch_alone")
            if "above_world" in out:
                out["above_world_and_operator"] = out["above_world"] - out["launch_alone"]
        prof = ours.stage_profile(ours.gang_events(api, namespace, run_id), asked, returned)
        obj = ours.read_gang(api, namespace, run_id)
        prof.update(_inside(obj, prof, ours.output(obj, f"job:{template.name}"), asked["train"]))
        prof.update(pods.profile(asked["train"]))
        prof.update({f"launch_{k}": v for k, v in launch.items()})
        if job_obj is not None:
            prof.update({k: round(v, 4) for k, v in alone.items()})
        return {**out, "profile": prof}
    finally:  # each cleanup step on its own: a failing one never leaves the stand-in's nodes behind
        core = client.CoreV1Api(api)
        for step_fn in (lambda: ours.request("teardown", spec, run_id, steps),
                        lambda: job_kind.delete(api, namespace, job),
                        lambda: core.delete_collection_namespaced_pod(
                            namespace, label_selector=f"kfp-gpu.io/run-id={run_id}", grace_period_seconds=0),
                        sim.stop, lambda: delete_nodes(api, sel, timeout_s=180.0)):
            try:
                step_fn()
            except Exception as exc:  # noqa: BLE001 - reported, the next step still runs
                print(f"  cleanup of {cluster}: {type(exc).__name__}: {exc}"[:300], flush=True)
        left = core.list_node(label_selector=sel).items
        steps.close()
        api.close()
        if left:
            raise RuntimeError(f"control-plane scenario left {len(left)} nodes ({sel})")


def run(n: int, repeats: int, namespace: str, step_kubeconfig: Path, log: Any = print,
        obs: Observer | None = None, kind: str = "pytorchjob") -> dict[str, Any]:
    """``repeats`` measured runs at ``n`` nodes after one unrecorded warm-up (imports, clients, the controller's
    first work units); ``obs``: the bench's external watch, for ``world_nodes_ready`` and ``above_world``."""
    _one(1, namespace, step_kubeconfig, kind=kind)
    samples: dict[str, list[float]] = {}
    profile: dict[str, list[float]] = {}
    for rep in range(repeats):
        o = _one(n, namespace, step_kubeconfig, obs, kind)
        for k, v in o.pop("profile", {}).items():
            profile.setdefault(k, []).append(round(v, 4))
        for k, v in o.items():
            samples.setdefault(k, []).append(round(v, 4))
        log(f"  control plane {n * GPUS} GPUs r{rep}: total {o['total']:.3f}s " +
            " ".join(f"{k}={v:.3f}" for k, v in o.items() if k != "total"))
    return {"gpus": n * GPUS, "nodes": n, "job_kind": kind, "samples": samples,
            "stats": {k: stats(v) for k, v in samples.items()},
            "profile_samples": profile, "profile_stats": {k: stats(v) for k, v in profile.items()},
            "path": "through the GpuGang: kfp_gpu.gang.client.request with the tenant's token; the bench's "
                    "kfp-gpu controller does the work"}
