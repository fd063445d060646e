"""Scenario 1 (burst scale-up), 6 (idle GPU-minutes) and 7 (API load) - one measurement loop.

Sides, all against the same local control plane + KWOK, same boot-latency model per repeat:

* ``ours``: :func:`kfp_gpu.steps.scale_up.provision` against the GKE stand-in (``bench/scenarios/burst.yaml``,
  boot lognormal median 1 s, sigma 0.3, seed = f(N, repeat)).
* ``sequential``: one node at a time: setSize(+1) on the stand-in, then wait until that node is Ready
  (same stand-in scenario and seed, so the same boot samples).
* ``cluster_autoscaler``: the real cluster-autoscaler (kwok cloud provider) scaling a node group for N pending
  pods that request 8 GPUs each. Its nodes come from a template labelled ``kfp-gpu.io/boot-injection=pending``;
  KWOK's node-initialize stage waits for ``kfp-gpu.io/boot-delay``, which :class:`Injector` sets from the
  same seeded lognormal sampler the stand-in uses (``BootLatency.sample``), together with
  ``kfp-gpu.io/ready-at`` = (time the injector saw the node) + sample (absolute RFC3339, as the stand-in's
  nodes carry it too).

The physical limit of a repeat is the largest boot latency sampled for that repeat's nodes (read back from
the node annotations).
"""

from __future__ import annotations

import json
import random
import resource
import subprocess
import sys
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

from kubernetes import client

from bench.common import (
    BOOT_SAMPLE_ANNOTATION,
    GPU,
    ReadyWatch,
    RequestCounter,
    Result,
    delete_nodes,
    kubeconfig,
    new_api,
    pool_selector,
    sampled_boot_s,
    scenario_dict,
    uid,
)
from kfp_gpu import accelerators
from kfp_gpu.devcluster.nodes import BOOT_DELAY_ANNOTATION, READY_AT_ANNOTATION, make_gpu_node
from kfp_gpu.sim import scenario as scenario_mod
from kfp_gpu.sim.scenario import BootLatency
from kfp_gpu.sim.server import SimServer

POOL = "bench-a100-a"
ZONE = "us-central1-a"
ACCEL = "a100-80gb"
GPUS = 8
CA_POOL = "bench-ca"
INJECT_LABEL = "kfp-gpu.io/boot-injection"
BENCH_LABEL = "kfp-gpu.io/bench"
CA_SCAN_INTERVAL = "1s"  # CA default is 10s; 1s is in the baseline's favour
CA_UNNEEDED_MIN = 10.0  # CA default --scale-down-unneeded-time (reported as configured, not waited out)


def boot_model(seed: int) -> BootLatency:
    d = scenario_dict("burst")["pools"][0]["boot"]
    return BootLatency(dist=d["dist"], median_s=float(d["median_s"]), sigma=float(d["sigma"]), seed=seed)


def seed_for(n: int, repeat: int) -> int:
    return 1000 * n + repeat


@dataclass
class Sample:
    seconds: float
    limit: float
    idle_gpu_min: float  # Ready GPUs waiting for the rest of the gang, before training can start
    cloud_requests: int = 0
    kube_requests: int = 0
    profile: dict[str, float] = field(default_factory=dict)


def _start_sim(seed: int) -> tuple[SimServer, str]:
    cluster = uid("bench")
    data = scenario_dict("burst", cluster=cluster)
    data["pools"][0]["boot"]["seed"] = seed
    sim = SimServer(scenario_mod.from_dict(data), kubeconfig())
    sim.start()
    return sim, cluster


def _limit_and_idle(api: client.ApiClient, selector: str, ready: dict[str, float]) -> tuple[float, float]:
    nodes = client.CoreV1Api(api).list_node(label_selector=selector).items
    samples = [s for n in nodes if (s := sampled_boot_s(n)) is not None]
    t_all = max(ready.values()) if ready else 0.0
    idle = sum(t_all - t for t in ready.values()) * GPUS / 60.0
    return (max(samples) if samples else 0.0), idle


# ---- ours ----------------------------------------------------------------------------------------

def run_ours(n: int, repeat: int, namespace: str) -> Sample:
    from kfp_gpu.providers.gke import GkeProvider
    from kfp_gpu.spec import ProvisioningSpec, Target
    from kfp_gpu.steps import scale_up
    from kfp_gpu.timeline import NodeState, Timeline

    sim, cluster = _start_sim(seed_for(n, repeat))
    api = new_api()
    counter = RequestCounter(api)
    sel = f"kfp-gpu.io/sim-cluster={cluster}"
    try:
        spec = ProvisioningSpec(ACCEL, n, gpus_per_node=GPUS, target=Target(
            kind="local", cluster=cluster, region="us-central1", endpoint=sim.url, namespace=namespace),
            zones=(ZONE,), scale_up_deadline_s=300.0)
        provider = GkeProvider.from_target(spec.target)
        run_id = uid("bench-")
        t0 = time.time()
        cap = scale_up.provision(spec, run_id, api, provider)
        took = time.time() - t0
        kube_n = counter.count
        cloud_n = sum(sim.request_counts().values())
        tl = Timeline.from_json(cap.timeline_json)
        ready = {name: nt.at(NodeState.READY) or 0.0 for name, nt in tl.nodes.items() if nt.at(NodeState.READY)}
        limit, idle = _limit_and_idle(api, sel, ready)
        req = [nt.at(NodeState.REQUESTED) for nt in tl.nodes.values() if nt.at(NodeState.REQUESTED)]
        reg = [nt.at(NodeState.REGISTERED) for nt in tl.nodes.values() if nt.at(NodeState.REGISTERED)]
        prof = {
            "first_requested_s": round(min(req) - t0, 3) if req else -1.0,
            "last_registered_s": round(max(reg) - t0, 3) if reg else -1.0,
            "last_ready_s": round(max(ready.values()) - t0, 3) if ready else -1.0,
            "claimed_and_returned_s": round(took, 3),
        }
        return Sample(took, limit, idle, cloud_n, kube_n, prof)
    finally:
        sim.stop()
        delete_nodes(api, sel)
        api.close()


def ours_rss_child(n: int, namespace: str) -> dict[str, float]:
    """Run one ``ours`` repeat in a fresh interpreter; return its peak RSS (MiB) and time."""
    code = ("import json,resource,sys;from bench import burst;"
            f"s=burst.run_ours({n}, 99, {namespace!r});"
            "print(json.dumps({'seconds': s.seconds, "
            "'peak_rss_mib': resource.getrusage(resource.RUSAGE_SELF).ru_maxrss/1024}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                         cwd=str(__import__("bench.common", fromlist=["ROOT"]).ROOT))
    if out.returncode != 0:
        raise RuntimeError(f"rss child failed: {out.stderr[-2000:]}")
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def self_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


# ---- sequential ----------------------------------------------------------------------------------

def run_sequential(n: int, repeat: int) -> Sample:
    sim, cluster = _start_sim(seed_for(n, repeat))
    api = new_api()
    counter = RequestCounter(api)
    sel = f"kfp-gpu.io/sim-cluster={cluster}"
    url = (f"{sim.url}/v1/projects/{sim.scenario.project}/locations/{ZONE}/clusters/{cluster}"
           f"/nodePools/{POOL}:setSize")
    w = ReadyWatch(api, sel)
    try:
        t0 = time.time()
        w.start()
        for i in range(1, n + 1):
            body = json.dumps({"nodeCount": i}).encode()
            req = urllib.request.Request(url, data=body, method="POST", headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=30) as r:
                r.read()
            if not w.wait_ready(i, 120.0):
                raise RuntimeError(f"sequential: node {i} not Ready within 120s")
        took = time.time() - t0
        kube_n = counter.count
        cloud_n = sum(sim.request_counts().values())
        with w.cond:
            ready = dict(w.ready)
        limit, idle = _limit_and_idle(api, sel, ready)
        return Sample(took, limit, idle, cloud_n, kube_n)
    finally:
        w.stop()
        sim.stop()
        delete_nodes(api, sel)
        api.close()


# ---- cluster-autoscaler --------------------------------------------------------------------------

class Injector:
    """Sets the boot latency of cluster-autoscaler's new nodes (label ``kfp-gpu.io/boot-injection=pending``).

    Samples come from ``BootLatency.sample`` with the repeat's seed, in the order nodes are observed; the
    annotation is an absolute time (observation + sample) so the injector's own latency is not charged to CA.
    """

    def __init__(self, api: client.ApiClient, seed: int, watch_: ReadyWatch) -> None:
        self.core = client.CoreV1Api(api)
        self.model = boot_model(seed)
        self.rng: random.Random = self.model.sampler()
        self.lock = threading.Lock()
        self.pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="inject")
        self.errors: list[str] = []
        watch_.on_added = self.on_added

    def on_added(self, node: client.V1Node, seen_at: float) -> None:
        ann = node.metadata.annotations or {}
        if BOOT_DELAY_ANNOTATION in ann:
            return
        with self.lock:
            s = self.model.sample(self.rng)
        at = datetime.fromtimestamp(seen_at, tz=timezone.utc) + timedelta(seconds=s)
        body = {"metadata": {"annotations": {
            READY_AT_ANNOTATION: at.strftime("%Y-%m-%dT%H:%M:%S.%fZ"), BOOT_DELAY_ANNOTATION: f"{s:.6f}s",
            BOOT_SAMPLE_ANNOTATION: f"{s:.6f}"}}}
        self.pool.submit(self._patch, node.metadata.name, body)

    def _patch(self, name: str, body: dict[str, Any]) -> None:
        try:
            self.core.patch_node(name, body)
        except Exception as exc:  # noqa: BLE001 - reported in the result
            self.errors.append(f"{name}: {exc}")

    def close(self) -> None:
        self.pool.shutdown(wait=True)


def ca_template() -> dict[str, Any]:
    acc = accelerators.get(ACCEL)
    labels = {INJECT_LABEL: "pending", BENCH_LABEL: "ca"}
    node = make_gpu_node("template", CA_POOL, acc.gke_label, ZONE, GPUS, False, 1.0, labels)
    node["metadata"]["annotations"].pop(BOOT_DELAY_ANNOTATION, None)
    node["metadata"]["annotations"].pop(READY_AT_ANNOTATION, None)
    node["metadata"]["annotations"].update({
        "cluster-autoscaler.kwok.nodegroup/min-count": "0",
        "cluster-autoscaler.kwok.nodegroup/max-count": "256",
    })
    return node


def ca_args() -> list[str]:
    return [f"--scan-interval={CA_SCAN_INTERVAL}", "--kube-client-qps=1000", "--kube-client-burst=2000",
            "--max-node-provision-time=5m"]


def _pods(core: client.CoreV1Api, namespace: str, n: int, tag: str) -> None:
    def one(i: int) -> None:
        core.create_namespaced_pod(namespace, {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"{tag}-w{i}", "labels": {BENCH_LABEL: "ca", "bench-run": tag}},
            "spec": {
                "nodeSelector": {"cloud.google.com/gke-nodepool": CA_POOL},
                "tolerations": [{"key": GPU, "operator": "Exists", "effect": "NoSchedule"}],
                "terminationGracePeriodSeconds": 0,
                "containers": [{"name": "worker", "image": "pytorch/pytorch",
                                "resources": {"requests": {GPU: str(GPUS), "cpu": "1"}, "limits": {GPU: str(GPUS)}}}],
            },
        })

    with ThreadPoolExecutor(max_workers=16) as ex:
        list(ex.map(one, range(n)))


class CaSide:
    """A running cluster-autoscaler for the whole CA part of the burst scenario."""

    def __init__(self, namespace: str) -> None:
        from kfp_gpu.devcluster import autoscaler

        self.namespace = namespace
        self.api = new_api()
        self.core = client.CoreV1Api(self.api)
        autoscaler.install_provider_config(self.core, [ca_template()], group_label="cloud.google.com/gke-nodepool",
                                           gpu_label="cloud.google.com/gke-accelerator",
                                           gpu_types=[accelerators.get(ACCEL).gke_label])
        delete_nodes(self.api, pool_selector(CA_POOL))
        self.proc = autoscaler.Autoscaler(kubeconfig(), extra_args=ca_args())
        self.proc.start()

    def run(self, n: int, repeat: int) -> Sample:
        sel = pool_selector(CA_POOL)
        tag = uid("ca")
        counter = RequestCounter(self.api)
        w = ReadyWatch(self.api, sel)
        inj = Injector(self.api, seed_for(n, repeat), w)
        try:
            w.start()
            counter.reset()
            t0 = time.time()
            _pods(self.core, self.namespace, n, tag)
            if not w.wait_ready(n, 180.0):
                with w.cond:
                    got = len(w.ready)
                raise RuntimeError(f"cluster-autoscaler: only {got}/{n} nodes Ready after 180s; "
                                   f"CA log tail:\n{self.proc.log_tail(15)}")
            took = time.time() - t0
            with w.cond:
                ready, seen = dict(w.ready), dict(w.seen)
            limit, idle = _limit_and_idle(self.api, sel, ready)
            prof = {"first_node_created_s": round(min(seen.values()) - t0, 3),
                    "last_node_created_s": round(max(seen.values()) - t0, 3),
                    "last_ready_s": round(max(ready.values()) - t0, 3)}
            if inj.errors:
                raise RuntimeError(f"injector errors: {inj.errors[:3]}")
            return Sample(took, limit, idle, 0, counter.count, prof)
        finally:
            w.stop()
            inj.close()
            self.core.delete_collection_namespaced_pod(self.namespace, label_selector=f"bench-run={tag}",
                                                       grace_period_seconds=0)
            end = time.time() + 60
            while time.time() < end and self.core.list_namespaced_pod(
                    self.namespace, label_selector=f"bench-run={tag}").items:
                time.sleep(0.2)
            delete_nodes(self.api, sel)
            time.sleep(2.0)  # let CA's next loop see the node group back at 0

    def close(self) -> None:
        self.proc.stop()
        delete_nodes(self.api, pool_selector(CA_POOL))
        self.api.close()


# ---- the scenario --------------------------------------------------------------------------------

def run(ns_list: list[int], repeats: int, seq_ns: list[int], namespace: str, log: Any = print,
        rss_n: int | None = None, ca_ns: list[int] | None = None) -> dict[str, Result]:
    """Returns burst results keyed by scenario name, plus "idle_gpu_minutes" and "api_load"."""
    results: dict[str, Result] = {}
    idle: dict[str, Result] = {}
    api_load: dict[str, Result] = {}
    for n in ns_list:
        results[f"burst_n{n}"] = Result(
            f"burst_n{n}", f"Burst scale-up, {n} nodes x {GPUS} GPUs, lognormal boot (median 1 s): "
            "time until all Ready", baselines=("cluster_autoscaler", "sequential"),
            target="ours/limit <= 1.10 at N=128; ours < cluster_autoscaler at every N")
        idle[f"idle_n{n}"] = Result(f"idle_n{n}", f"Idle GPU-minutes per run, {n} nodes", unit="GPU-min",
                                    baselines=("cluster_autoscaler", "sequential"))
        api_load[f"api_n{n}"] = Result(f"api_n{n}", f"API requests per provisioned node, {n} nodes",
                                       unit="requests/node", baselines=("sequential", "cluster_autoscaler"))
    run_ours(1, 999, namespace)  # warm-up (imports, client construction); not recorded
    for n in ns_list:
        r = results[f"burst_n{n}"]
        r.notes.append("ours is timed until provision() returns (nodes Ready and claimed); one unrecorded "
                       "N=1 warm-up run first. cluster_autoscaler is timed from the first pending pod's creation.")
        for rep in range(repeats):
            s = run_ours(n, rep, namespace)
            r.add("ours", s.seconds)
            r.add("limit", s.limit)
            r.add("ours_over_limit", s.seconds / s.limit if s.limit else 0.0)
            r.extra.setdefault("profile_ours", []).append(s.profile)
            idle[f"idle_n{n}"].add("ours", s.idle_gpu_min)
            a = api_load[f"api_n{n}"]
            a.add("ours", (s.cloud_requests + s.kube_requests) / n)
            a.add("ours_cloud", s.cloud_requests / n)
            a.add("ours_kube", s.kube_requests / n)
            log(f"  burst N={n} rep={rep}: ours {s.seconds:.2f}s (limit {s.limit:.2f}s) "
                f"cloud={s.cloud_requests} kube={s.kube_requests}")
    for n in ns_list:
        r = results[f"burst_n{n}"]
        if n not in seq_ns:
            r.errors["sequential"] = "not run at this N in this mode (see docs/benchmarks.md)"
            continue
        for rep in range(repeats):
            s = run_sequential(n, rep)
            r.add("sequential", s.seconds)
            r.add("limit_sequential", s.limit)
            idle[f"idle_n{n}"].add("sequential", s.idle_gpu_min)
            a = api_load[f"api_n{n}"]
            a.add("sequential", (s.cloud_requests + s.kube_requests) / n)
            a.add("sequential_cloud", s.cloud_requests / n)
            a.add("sequential_kube", s.kube_requests / n)
            log(f"  burst N={n} rep={rep}: sequential {s.seconds:.2f}s (limit {s.limit:.2f}s)")
    ca: CaSide | None = None
    ca_error = ""
    try:
        ca = CaSide(namespace)
    except Exception as exc:  # noqa: BLE001 - reported loudly in the JSON and table
        ca_error = f"cluster-autoscaler FAILED to start: {exc}"
        log("  " + ca_error)
    for n in ns_list:
        r = results[f"burst_n{n}"]
        if ca is None:
            r.errors["cluster_autoscaler"] = ca_error
            idle[f"idle_n{n}"].errors["cluster_autoscaler"] = ca_error
            api_load[f"api_n{n}"].errors["cluster_autoscaler"] = ca_error
            continue
        if ca_ns is not None and n not in ca_ns:
            why = ("not run at this N in --quick: cluster-autoscaler holds GPU pods for its hard-coded 30 s "
                   "batching buffer before scaling up, so each CA run costs >= 30 s")
            r.errors["cluster_autoscaler"] = why
            idle[f"idle_n{n}"].errors["cluster_autoscaler"] = why
            continue
        for rep in range(repeats):
            try:
                s = ca.run(n, rep)
            except Exception as exc:  # noqa: BLE001
                r.errors["cluster_autoscaler"] = f"cluster-autoscaler run FAILED: {exc}"
                log(f"  burst N={n} rep={rep}: cluster-autoscaler FAILED: {exc}")
                break
            r.add("cluster_autoscaler", s.seconds)
            r.add("limit_cluster_autoscaler", s.limit)
            r.extra.setdefault("profile_cluster_autoscaler", []).append(s.profile)
            post = n * GPUS * CA_UNNEEDED_MIN
            idle[f"idle_n{n}"].add("cluster_autoscaler", s.idle_gpu_min + post)
            idle[f"idle_n{n}"].add("cluster_autoscaler_before_training", s.idle_gpu_min)
            api_load[f"api_n{n}"].add("cluster_autoscaler_bench_client", s.kube_requests / n)
            log(f"  burst N={n} rep={rep}: cluster-autoscaler {s.seconds:.2f}s (limit {s.limit:.2f}s)")
    if ca is not None:
        ca.close()
    for n in ns_list:
        a = api_load[f"api_n{n}"]
        a.errors.setdefault("cluster_autoscaler", "CA's own API requests are not counted (separate process; "
                            "its /metrics has no per-run request counter wired in); only the bench client's")
        idle[f"idle_n{n}"].notes.append(
            "ours/sequential: Ready GPUs waiting for the rest of the gang (teardown shrinks the pool right after "
            "training). cluster_autoscaler: the same wait plus N x 8 GPUs x 10 min of default "
            "--scale-down-unneeded-time after training (as configured, not waited out).")
    if rss_n is not None:
        try:
            rr = ours_rss_child(rss_n, namespace)
            results[f"burst_n{rss_n}"].extra["peak_rss_mib_ours_step_process"] = round(rr["peak_rss_mib"], 1)
            log(f"  peak RSS of a fresh process running provision() at N={rss_n}: {rr['peak_rss_mib']:.1f} MiB")
        except Exception as exc:  # noqa: BLE001
            results[f"burst_n{rss_n}"].errors["peak_rss"] = str(exc)
    out: dict[str, Result] = {**results, **idle, **api_load}
    return out
