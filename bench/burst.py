"""Burst scale-up: every peer RUN on one world (bench/world.py), measured by one external watch (bench/observe.py).

For each N, for each repeat, each side in turn (repeats interleaved across sides), with seed = 1000*N + repeat:
the side's own process (bench/peers.py) sets up, the harness takes t0 and says ``go``; the side obtains capacity
its own way and starts the gang (N pods x 8 GPUs); the harness's watch sees the whole gang Running (job start),
holds the job :data:`JOB_S`, says ``release`` (job end) and watches the side's nodes go, up to a cap.

Where a side's nodes come from:
* ``naive``, ``sequential``, ``ours_node_pool``, ``ours_compute_class``: a fresh stand-in process per side-run (same
  scenario and seed, so the same boot samples, in creation order). ``ours_compute_class``'s nodes come from the
  stand-in's node auto-provisioning for the run's ComputeClass (kfp_gpu_rehearsal/sim/computeclass.py): its pools boot with the
  scenario pool's model and seed of the same zone.
* ``cluster_autoscaler``: the bench's own cluster-autoscaler process (same binary and flags as the dev cluster's
  CA profile, kfp_gpu_rehearsal/devcluster/ca_profile.py FLAGS, minus the ProvisioningRequest ones: two CAs serving the same
  requests would fight over their status), node group ``bench-ca`` (max 600).
* ``cluster_autoscaler_provreq``, ``ours_provisioning_request``: the dev cluster's CA profile (the only CA allowed
  to serve ProvisioningRequests on the shared cluster), node group ``ca-a100-bench`` (us-central1-c, max 512
  nodes, a taint only the bench tolerates). ``ours_provisioning_request``'s steps ask the cloud (quota, pools) of a
  stand-in serving the side-run's bench scenario (:data:`CLOUD_ONLY_SIDES`), like the stand-in sides.
* ``karpenter``: the dev cluster's Karpenter kwok provider, with the bench's KWOKNodeClass
  :data:`KARPENTER_NODE_CLASS` (the Node at launch) and the boot-injection label on its NodePool's nodes.
  ``ours_karpenter``: the same Karpenter; the run's NodePool is the product's, and the bench's controller is
  configured as a platform admin would (:func:`bench.sides.karpenter_controller_env`: the same node class, the
  boot-injection label and the not-ready startup taint in the NodePool's template), so its nodes boot on the same
  draws as the peer's.

Every node that is not the stand-in's waits (KWOK) for the bench's boot injector (bench/world.py
:class:`~bench.world.Injector`), re-seeded with the side-run's seed: the same draws, in creation order, as the
stand-in's pools. The limit is read per node from those draws (bench/observe.py :func:`~bench.observe.measure`).

The sides and whether one can run here: bench/sides.py; the side processes, the bench's own CA and the KWOK canary:
bench/sideprocs.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client

from bench.common import ROOT, Phases, delete_nodes, new_api, uid
from bench.observe import Measured, NodeRec, Observer, measure, pods_before_ready
from bench.sideprocs import CA_POOL, BenchCA, Canary, Child, delete_node_class, ensure_node_class
from bench.sides import (
    CLOUD_ONLY_SIDES,
    KARPENTER_CLUSTER,
    KARPENTER_NODE_CLASS,
    PROFILE_POOL,
    SEQUENTIAL_MAX,
    STANDIN_SIDES,
    not_run_reason,
)
from bench.world import (
    DEVICE_PLUGIN_S,
    GPUS,
    PULL,
    Injector,
    StandIn,
    aws_scenario,
    pool_name,
    pull_watcher,
    scenario,
)
from kfp_gpu_rehearsal.devcluster.nodes import (
    POOL_LABEL,
)
from kfp_gpu_rehearsal.sim.clock import compress, scale

JOB_S = 0.5  # how long the "job" holds the gang (1 world minute)
GANG_TIMEOUT_S = 150.0  # plus GANG_TIMEOUT_PER_NODE_S per node: 406 s at N=512 (a 2-core control plane)
GANG_TIMEOUT_PER_NODE_S = 0.5
CLEAN_WAIT_S = 300.0  # before t0: how long earlier side-runs' nodes may take to go (their controllers' scale-down)


def gang_timeout(n: int) -> float:
    return GANG_TIMEOUT_S + GANG_TIMEOUT_PER_NODE_S * n


@dataclass
class SideRun:
    side: str
    n: int
    repeat: int
    seed: int
    error: str = ""
    m: Measured | None = None
    requests: int = 0
    rss_mib: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    def row(self) -> dict[str, Any]:
        out: dict[str, Any] = {"side": self.side, "n": self.n, "repeat": self.repeat, "seed": self.seed}
        if self.error:
            out["error"] = self.error
        if self.m is not None:
            to_min = scale() / 60.0  # wall GPU-seconds -> world GPU-minutes
            out.update({"total_s": round(self.m.total_s, 4), "limit_s": round(self.m.limit_s, 4),
                        "overhead_s": round(self.m.overhead_s, 4), "nodes_ready_s": round(self.m.nodes_ready_s, 4),
                        "nodes": self.m.nodes,
                        "idle_before_gpu_min": round(self.m.idle_before_gpu_s * to_min, 3),
                        "idle_after_gpu_min": round(self.m.idle_after_gpu_s * to_min, 3),
                        "idle_after_capped": self.m.after_capped,
                        "api_requests_per_node": round(self.requests / max(1, self.n), 3),
                        "peak_rss_mib": self.rss_mib, **self.m.detail})
        out.update(self.extra)
        return out


def _kubeconfig() -> str:
    from bench.common import kubeconfig

    return str(kubeconfig())


class Harness:
    def __init__(self, namespace: str, *, after_cap_s: float, defer_cleanup: bool = False,
                 log: Callable[[str], None] = print, step_kubeconfig: str = "") -> None:
        """``defer_cleanup``: wait for the controllers' scale-down of one side-run while the next runs, and for all
        of them in :meth:`finish` (--quick; the full run waits after each side-run, so none overlaps a measurement).
        ``step_kubeconfig``: the tenant step identity's kubeconfig (bench/ours.py), handed to ours' side processes:
        they call the steps through the run's GpuGang with it, and the bench's kfp-gpu controller does the work.
        """
        self.ns, self.after_cap_s, self.log = namespace, after_cap_s, log
        self.step_kubeconfig = step_kubeconfig
        self.defer_cleanup = defer_cleanup
        self.pending: list[tuple[str, Callable[[], bool], float, Callable[[], None]]] = []
        self.api = new_api()
        self.core = client.CoreV1Api(self.api)
        self.obs = Observer(new_api()).start()
        injector_core = client.CoreV1Api(new_api())
        self.injector = Injector(lambda name, body: injector_core.patch_node(name, body),
                                 lambda name, body: injector_core.patch_node_status(name, body))
        self.obs.node_hooks.append(self.injector.on_node)
        self.pulls = pull_watcher(new_api())  # the image pulls of the injector's nodes (the stand-in pulls for its own)
        self.ca: BenchCA | None = None
        self.ca_error = ""
        self.node_class = False  # the bench's KWOKNodeClass was created (deleted in close)
        self.started = time.time()
        self.canary = Canary(self.api, namespace)

    def start_ca(self) -> None:
        try:
            self.ca = BenchCA(self.api)
        except Exception as exc:  # noqa: BLE001 - the side is then reported as not run, with the reason
            self.ca_error = f"the bench's cluster-autoscaler did not start: {exc}"[:600]

    def _gone(self, what: str, done: Callable[[], bool], timeout_s: float, force: Callable[[], None]) -> None:
        if self.defer_cleanup:
            self.pending.append((what, done, time.time() + timeout_s, force))
        elif not self.obs.wait(done, timeout_s):
            force()

    def finish(self, prefix: str = "") -> list[str]:
        """Wait for the deferred scale-downs (of sides named ``prefix``...); force what is left. Returns what had
        to be forced."""
        forced, keep = [], []
        for what, done, until, force in self.pending:
            if not what.startswith(prefix):
                keep.append((what, done, until, force))
                continue
            t = time.time()
            if not self.obs.wait(done, max(0.0, until - time.time())):
                force()
                forced.append(what)
            if time.time() - t > 1.0:
                self.log(f"  cleanup: waited {time.time() - t:.1f}s for {what}")
        self.pending = keep
        return forced

    def close(self) -> None:
        self.finish()
        self.pulls.stop()
        if self.ca is not None:
            t = time.time()
            self.ca.stop()
            self.log(f"  cleanup: the bench's cluster-autoscaler stopped in {time.time() - t:.1f}s")
        self.canary.close()
        if self.node_class:
            delete_node_class(self.api, self.log)
        self.obs.close()

    def availability(self, side: str, n: int, sequential_max: int = SEQUENTIAL_MAX) -> str:
        """'' when the side can run at this N, else the reason it is not run (:func:`bench.sides.not_run_reason`)."""
        return not_run_reason(self.api, self.core, side, n, ca_started=self.ca is not None, ca_error=self.ca_error,
                              sequential_max=sequential_max)

    def run(self, side: str, n: int, repeat: int, *, dry_zones: tuple[str, ...] = (),
            zones: tuple[str, ...] = ("us-central1-a",)) -> SideRun:
        seed = 1000 * n + repeat
        r = SideRun(side, n, repeat, seed)
        clock = Phases()  # wall_phases_s: where the side-run's wall goes (gang: the measured total)
        for shared in (("cluster_autoscaler_provreq", "ours_provisioning_request"), ("cluster_autoscaler",)):
            if side in shared:  # the same node group: start from zero nodes
                forced = [f for other in shared for f in self.finish(other + " ")]
                if forced:
                    r.extra["previous_cleanup_forced"] = forced
        r.extra.update(self.quiesce())
        clock.lap("quiesce")
        tag = uid(f"b{side[:4].replace('_', '')}-")
        # ours gets the peers' budget for the gang, less 10 s so its own TIMEOUT arrives before the harness gives up
        args: dict[str, Any] = {"side": side, "n": n, "namespace": self.ns, "tag": tag,
                                "deadline_s": gang_timeout(n) - 10.0}
        if side.startswith("ours_"):
            args["step_kubeconfig"] = self.step_kubeconfig
        sim: StandIn | None = None
        selector: Callable[[NodeRec], bool] = lambda rec: False  # noqa: E731
        if side == "ours_compute_class":  # GKE serves the CRD; the stand-in serves classes where it is installed
            from kfp_gpu_rehearsal.devcluster import computeclass_crd

            computeclass_crd.install(self.api)
        if side in STANDIN_SIDES or side in CLOUD_ONLY_SIDES:  # the cloud the side asks: the bench world's
            sim = StandIn(scenario(uid("bw"), seed, dry_zones=dry_zones), Path(_kubeconfig())).start()
            args["url"] = sim.url
            if side in STANDIN_SIDES:  # its nodes are the stand-in's too
                cl = sim.cluster
                selector = lambda rec: rec.labels.get("kfp-gpu.io/sim-cluster") == cl  # noqa: E731
                args.update(cluster=sim.cluster, zone=zones[0], pool=pool_name(zones[0]), zones=list(zones),
                            pools=[pool_name(z) for z in zones])
        owns: Callable[[dict[str, str]], bool] | None = None  # the side's nodes, by labels, as the Injector sees them
        if side == "cluster_autoscaler":
            args["pool"] = CA_POOL
            selector = lambda rec: rec.labels.get(POOL_LABEL) == CA_POOL  # noqa: E731
            owns = lambda labels: labels.get(POOL_LABEL) == CA_POOL  # noqa: E731
        elif side in ("cluster_autoscaler_provreq", "ours_provisioning_request"):
            args["pool"] = PROFILE_POOL
            owns = lambda labels: labels.get(POOL_LABEL) == PROFILE_POOL  # noqa: E731
        elif side in ("karpenter", "ours_karpenter"):  # the peer's NodePool names the bench's node class; ours' the
            self.node_class = self.node_class or ensure_node_class(self.api)  # controller's KFP_GPU_KARPENTER_NODECLASS
            args["node_class"], pool = KARPENTER_NODE_CLASS, tag
            if side == "ours_karpenter":  # its NodePool is named after its run id; its steps ask EKS and Service Quotas
                from kfp_gpu.plan.karpenter import nodepool_name  # (preflight, teardown): the AWS stand-in

                sim = StandIn(aws_scenario(KARPENTER_CLUSTER), Path(_kubeconfig()), "kfp_gpu_rehearsal.sim.aws").start()
                args.update(url=sim.url, run_id=f"bench-{tag}")
                pool = nodepool_name(args["run_id"])
            selector = lambda rec: rec.labels.get("karpenter.sh/nodepool") == pool  # noqa: E731
            owns = lambda labels: labels.get("karpenter.sh/nodepool") == pool  # noqa: E731
        child = Child(args)
        t0 = t_job = time.time()
        limit = gang_timeout(n)
        try:
            line = child.expect("READY", 120.0)
            clock.lap("setup")  # the stand-in (if any) and the side's process up to READY
            if line != "READY":
                raise RuntimeError(f"side did not start: {line} {child.stderr_tail()}")
            base_req = sim.requests() if sim else 0
            if owns is not None:  # from go on, the side's own nodes draw the world's sequence, in creation order
                self.injector.seed(seed, owns)
            t0 = time.time()
            child.say("go")
            ok = self.obs.wait(lambda: self.obs.gang_running_at(tag, n) is not None or not child.lines.empty(),
                               limit)
            while ok and self.obs.gang_running_at(tag, n) is None:
                line = child.expect("GANG", limit - (time.time() - t0))
                if line != "GANG":
                    raise RuntimeError(f"side reported {line} (stderr: {child.stderr_tail()})")
                ok = self.obs.wait(lambda: self.obs.gang_running_at(tag, n) is not None, limit - (time.time() - t0))
            got = self.obs.gang_running_at(tag, n)
            if got is None:
                raise RuntimeError(f"gang of {n} not Running within {limit:g}s "
                                   f"({sum(p.running is not None for p in self.obs.gang(tag))} Running; "
                                   f"side's stderr: {child.stderr_tail()})")
            t_job = got
            clock.lap("gang")  # go -> the whole gang Running (the measured total, plus the watch's reaction)
            cloud_req = (sim.requests() - base_req) if sim else 0
            time.sleep(JOB_S)
            t_end = time.time()
            clock.lap("job")
            child.say("release")
            res_line = child.expect("RESULT", 120.0)
            clock.lap("release")  # the side's own release, up to its RESULT line
            res = json.loads(res_line[len("RESULT "):]) if res_line.startswith("RESULT") else {}
            if res.get("error"):
                r.error = str(res["error"])
            r.rss_mib = float(res.get("peak_rss_mib", 0.0))
            r.requests = int(res.get("kube_requests", 0)) + cloud_req
            if res.get("profile_abs"):
                r.extra["profile_ours_s"] = {k: round(v - t0, 4) for k, v in res["profile_abs"].items()}
            if res.get("cloud_calls_abs"):
                r.extra["cloud_calls_ours_s"] = [[round(a - t0, 3), round(b - t0, 3), what]
                                                 for a, b, what in res["cloud_calls_abs"]]
            r.extra.update({"kube_requests": res.get("kube_requests"), "cloud_requests": cloud_req,
                            "release_kube_requests": res.get("kube_requests_release")})
            gang_nodes = {p.node for p in self.obs.gang(tag) if p.node}
            mine = lambda rec: selector(rec) or rec.name in gang_nodes  # noqa: E731
            nodes = self.obs.matching(mine, t0)
            self.obs.wait(lambda: all(x.gone is not None for x in self.obs.matching(mine, t0)), self.after_cap_s)
            t_cap = time.time()
            clock.lap("after_job")  # the measured idle-after watch (up to after_cap_s)
            r.m = measure(self.obs.matching(mine, t0), t0, t_job, t_end, t_cap, GPUS, compress(DEVICE_PLUGIN_S),
                          compress(PULL.pull_s()))
            if len(nodes) < n:
                r.error = r.error or f"only {len(nodes)} nodes attributed to the side"
            early = self.pods_before_ready(tag)
            if early:
                r.error = r.error or (f"{early} gang pods Running before their node was Ready with GPUs (external "
                                      "watch): the side's nodes did not boot on the world")
            if r.m.detail["undrawn_nodes"]:
                r.error = r.error or (f"{r.m.detail['undrawn_nodes']} of the side's nodes carry no boot drawn from "
                                      "the world's sampler (kfp-gpu.io/boot-sample): its limit is not the world's")
        except Exception as exc:  # noqa: BLE001 - a failed side-run is reported, never dropped
            r.error = f"{type(exc).__name__}: {exc}"[:800]
            child.say("release")
            if not child.expect("RESULT", 60.0).startswith("RESULT") and child.run_id:
                # the step was still running (it reads `release` only when it returns): its teardown, by run id
                r.extra["teardown_by_harness"] = self._release_ours(args, child.run_id)
        finally:
            clock.lap("failed" if r.error else "measure")
            child.close()
            self._cleanup(side, tag, sim, selector, t0, clock)
            r.extra["wall_phases_s"] = clock.laps
        if owns is not None:
            r.extra["injector_draws"] = len(self.injector.drawn)  # == nodes: no other node took the side's draws
        if self.injector.errors:
            r.extra["injector_errors"] = self.injector.errors[:3]
            self.injector.errors.clear()
        return r

    def pods_before_ready(self, tag: str) -> int:
        with self.obs.cond:
            return pods_before_ready(self.obs.gang(tag), dict(self.obs.nodes))

    def _release_ours(self, args: dict[str, Any], run_id: str) -> str:
        """ours' teardown step for ``run_id`` in a fresh process (the side's own was killed mid-step)."""
        try:
            out = subprocess.run([sys.executable, "-m", "bench.peers", "--release", json.dumps({**args, "run_id": run_id})],
                                 cwd=str(ROOT), capture_output=True, text=True, timeout=600)
            return "ok" if out.returncode == 0 else f"exit {out.returncode}: {out.stderr[-300:]}"
        except subprocess.TimeoutExpired:
            return "teardown still running after 600 s"

    def quiesce(self) -> dict[str, Any]:
        """Before t0: earlier side-runs' nodes are gone (up to :data:`CLEAN_WAIT_S`), and KWOK turns a canary pod
        Running (its pod pipeline answers). What it waited, and any node left, go into the row."""
        t = time.time()

        def left() -> list[NodeRec]:
            with self.obs.cond:
                return [x for x in self.obs.nodes.values()
                        if x.gone is None and x.added >= self.started and x.name != Canary.NAME]

        if not self.defer_cleanup:  # --quick overlaps controllers' scale-down with the next side on purpose
            self.obs.wait(lambda: not left(), CLEAN_WAIT_S)
        out: dict[str, Any] = {"quiesce_nodes_s": round(time.time() - t, 2)}
        still = [] if self.defer_cleanup else left()
        if still:
            out["world_not_clean_nodes"] = len(still)
            self.log(f"  quiesce: {len(still)} nodes of earlier side-runs still there after {CLEAN_WAIT_S:g}s")
        t = time.time()
        ok = self.canary.ping(CLEAN_WAIT_S)
        out["quiesce_kwok_s"] = round(time.time() - t, 2)
        if not ok:
            out["kwok_canary_timeout"] = True
            self.log(f"  quiesce: KWOK did not run a canary pod within {CLEAN_WAIT_S:g}s")
        return out

    def _cleanup(self, side: str, tag: str, sim: StandIn | None, selector: Callable[[NodeRec], bool],
                 t0: float, clock: Phases) -> None:
        """Everything the side-run created goes: gang pods, its ProvisioningRequest/PodTemplate/NodePool, the
        stand-in process and its nodes; nodes of the CA profile / Karpenter are left to their controller's
        scale-down, waited for."""
        self.core.delete_collection_namespaced_pod(self.ns, label_selector=f"kfp-gpu.io/bench-gang={tag}",
                                                   grace_period_seconds=0)
        custom = client.CustomObjectsApi(self.api)
        for fn in (lambda: custom.delete_namespaced_custom_object("autoscaling.x-k8s.io", "v1", self.ns,
                                                                  "provisioningrequests", tag),
                   lambda: self.core.delete_namespaced_pod_template(tag, self.ns),
                   lambda: custom.delete_cluster_custom_object("karpenter.sh", "v1", "nodepools", tag)):
            try:
                fn()
            except client.ApiException as exc:
                if exc.status != 404:
                    self.log(f"  cleanup {tag}: {exc.status} {exc.reason}")
        clock.lap("cleanup_objects")
        if sim is not None:
            sim.stop()
            clock.lap("cleanup_standin_stop")
            delete_nodes(self.api, sim.selector)
            clock.lap("cleanup_standin_nodes")
        if side == "cluster_autoscaler":
            # CA scales its empty nodes down itself (5 s unneeded); any still there are deleted (CA forgets them)
            self._gone(f"{side} {tag}", lambda: all(x.gone is not None for x in self.obs.matching(selector, t0)),
                       30.0, lambda: delete_nodes(self.api, f"{POOL_LABEL}={CA_POOL}"))
        if side in ("karpenter", "ours_karpenter", "cluster_autoscaler_provreq", "ours_provisioning_request"):
            gang_nodes = {p.node for p in self.obs.gang(tag) if p.node}
            mine = lambda rec: rec.name in gang_nodes or selector(rec)  # noqa: E731
            self._gone(f"{side} {tag}", lambda: all(x.gone is not None for x in self.obs.matching(mine, t0)), 60.0,
                       lambda: self.log(f"  cleanup: {side} nodes still there after 60 s (their controller's)"))
        clock.lap("cleanup_scale_down")  # the side's controller's scale-down (CA, Karpenter), waited for
