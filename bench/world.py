"""The one world every side of the benchmark runs on (issue 18).

Real-world durations compressed by the stand-in's one factor, :data:`kfp_gpu_rehearsal.devcluster.worldtime.TIME_SCALE` (120: one
real-world minute lasts 0.5 s here); API round trips are not compressed (:data:`API_LATENCY_MS` = 100 ms by
default, as a client really pays them). Every side of one (scenario, N, repeat) uses the same seed, so the
stand-in's pools and the bench's boot injector (cluster-autoscaler nodes) draw the same boot samples.

* Boot: lognormal, median 210 s, sigma 0.45, floor 60 s (the stand-in's A100 default, docs/sim.md rule 1),
  counted from the create request to the Node registering, then :data:`DEVICE_PLUGIN_S` (90 s, the stand-in's
  documented default, docs/sim.md rule 2) until ``nvidia.com/gpu`` is allocatable. Every side's nodes draw from
  the same seeded sampler: the stand-in's pools (its nodes' ``kfp-gpu.io/boot-sample``), and :class:`Injector`
  for the nodes the cluster-autoscalers and Karpenter create (:class:`BootDraws`: PENDING + the draw, then the
  same 90 s), so "the largest drawn boot + 90 s", read per node, is the physical limit on every side. The
  zero-boot world (control-plane overhead) keeps both at 0.
* Image pull: every side's gang pods (``kfp-gpu.io/image-pull=world``) wait for :data:`PULL` (10 GB at 125 MiB/s, the
  stand-ins' documented default, docs/sim.md rule 2b) on a fresh node, once per node: the stand-in for its nodes,
  :func:`pull_watcher` for the injector's. The zero-boot world pulls nothing.
* Asynchronous resize operations (PENDING 3 s, VM creations spread over 20 s), a seeded 1 % of 5xx answers
  (half of them after a mutation took effect), Compute's 1,500 requests/minute budget (docs/sim.md, API layer).
* The stand-in runs as its own process (``python -m kfp_gpu_rehearsal.sim``), as a cloud does, one per side-run.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import yaml

from kfp_gpu_rehearsal.devcluster.nodes import (
    BOOT_DELAY_ANNOTATION,
    BOOT_INJECTION_LABEL,
    POOL_LABEL,
    READY_AT_ANNOTATION,
)
from kfp_gpu_rehearsal.devcluster.worldtime import TIME_SCALE
from kfp_gpu_rehearsal.sim.clock import compress
from kfp_gpu_rehearsal.sim.kube import BOOT_SAMPLE_ANNOTATION
from kfp_gpu_rehearsal.sim.worldspec import BootLatency, PullSpec

ACCEL = "a100-80gb"
GPUS = 8
REGION = "us-central1"
ZONES = ("us-central1-a", "us-central1-b", "us-central1-c")
API_LATENCY_MS = 100.0
BOOT_MEDIAN_S, BOOT_SIGMA, BOOT_MIN_S = 210.0, 0.45, 60.0  # real-world seconds
PENDING_S = 3.0
DEVICE_PLUGIN_S = 90.0  # Node registered -> GPUs allocatable (driver installer + device plugin), docs/sim.md rule 2
POLL_S = compress(10.0)  # a hand-written poll loop's 10 s, compressed like every other world duration
ERROR_RATE = 0.01
PULL = PullSpec()  # every side's gang pods pull the same image on a fresh node (docs/sim.md rule 2b)


def pool_name(zone: str) -> str:
    return f"bench-a100-{zone[-1]}"


def boot_model(seed: int, *, zero: bool = False) -> BootLatency:
    if zero:
        return BootLatency(dist="fixed", median_s=0.0, seed=seed)
    return BootLatency(dist="lognormal", median_s=BOOT_MEDIAN_S, sigma=BOOT_SIGMA, seed=seed, min_s=BOOT_MIN_S)


class BootDraws:
    """The world's boot draws for nodes no stand-in creates, in creation order: the stand-in pool's own sampler
    (:func:`boot_model` ``(seed).sampler()``, as kfp_gpu_rehearsal/sim/state.py seeds each pool), so the k-th node of any
    side draws the k-th sample of the same sequence."""

    def __init__(self, seed: int) -> None:
        self.model = boot_model(seed)
        self.rng: random.Random = self.model.sampler()

    def next(self) -> tuple[float, float]:
        """(boot sample, ready in), wall seconds: the request -> the node registering (the stand-in's operation
        PENDING + the draw; its ``kfp-gpu.io/boot-sample``), and -> GPUs usable (+ the device-plugin delay)."""
        sample = compress(PENDING_S + self.model.sample(self.rng))
        return sample, sample + compress(DEVICE_PLUGIN_S)


NOT_READY_STATUS: dict[str, Any] = {"status": {"conditions": [{
    "type": "Ready", "status": "False", "reason": "KubeletNotReady", "message": "simulated boot (bench injector)"}]}}


class Injector:
    """Boots the nodes labelled ``kfp-gpu.io/boot-injection=pending`` (the bench cluster-autoscaler's node group, the
    CA profile's bench group, the bench's Karpenter NodePools): KWOK holds such a node NotReady until this sets its
    ``kfp-gpu.io/ready-at`` = the moment the watch saw the node (the side's create request, as far as the watch can
    tell; the patch's own latency is not charged to the side) + the next draw of :class:`BootDraws`, with the
    draw in ``kfp-gpu.io/boot-sample``. :meth:`seed` before each side-run: every side of (N, repeat) draws the
    same sequence. ``patch(name, body)`` writes the node (in a thread of its own: the watch is not held up).

    A node created without a Ready condition (Karpenter's kwok provider's) first gets ``Ready=False``
    (``patch_status``), as a kubelet registers: kube-controller-manager removes the ``node.kubernetes.io/not-ready``
    taint from a node that has no Ready condition at all, and the scheduler would then bind pods to a node that
    has not booted."""

    def __init__(self, patch: Callable[[str, dict[str, Any]], None],
                 patch_status: Callable[[str, dict[str, Any]], None] | None = None) -> None:
        self.patch, self.patch_status = patch, patch_status
        self.lock = threading.Lock()
        self.errors: list[str] = []
        self.seed(0)

    def seed(self, seed: int, owns: Callable[[dict[str, str]], bool] | None = None) -> None:
        """The side-run's sequence, for the nodes ``owns`` (by labels; None: every pending node). Any other
        pending node (another controller's scale-up on the shared cluster) boots on a separate stream, so it
        never takes one of the side's draws."""
        with self.lock:
            self.draws, self.owns = BootDraws(seed), owns
            self.stray = BootDraws(seed + 7_919_000)
            self.drawn: list[str] = []  # the nodes that took the side's draws, in order (the row records them)

    def body(self, seen: float, labels: dict[str, str] | None = None) -> dict[str, Any]:
        """The next node's patch, for a node seen at ``seen`` (epoch seconds) with ``labels``."""
        with self.lock:
            mine = self.owns is None or self.owns(labels or {})
            sample, ready_in = (self.draws if mine else self.stray).next()
            if mine:
                self.drawn.append(str((labels or {}).get("kubernetes.io/hostname", "?")))
        at = datetime.fromtimestamp(seen, tz=timezone.utc) + timedelta(seconds=ready_in)
        return {"metadata": {"annotations": {READY_AT_ANNOTATION: at.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
                                             BOOT_DELAY_ANNOTATION: f"{ready_in:.6f}s",
                                             BOOT_SAMPLE_ANNOTATION: f"{sample:.6f}"}}}

    def on_node(self, obj: dict[str, Any], seen: float) -> None:
        md = obj.get("metadata") or {}
        if (md.get("labels") or {}).get(BOOT_INJECTION_LABEL) != "pending" or \
                BOOT_DELAY_ANNOTATION in (md.get("annotations") or {}):
            return
        conds = (obj.get("status") or {}).get("conditions") or []
        not_ready = None if any(c.get("type") == "Ready" for c in conds) else NOT_READY_STATUS
        body = self.body(seen, dict(md.get("labels") or {}))
        threading.Thread(target=self._patch, args=(md["name"], body, not_ready), daemon=True).start()

    def _patch(self, name: str, body: dict[str, Any], status: dict[str, Any] | None = None) -> None:
        try:
            if status is not None and self.patch_status is not None:
                self.patch_status(name, status)
            self.patch(name, body)
        except Exception as exc:  # noqa: BLE001 - reported in the result
            self.errors.append(f"{name}: {exc}")


def profile_boot_drawn(core: Any, pool: str) -> str:
    """'' when the running CA profile's bench node group ``pool`` boots on the Injector (its template in the provider's
    ConfigMap carries ``kfp-gpu.io/boot-injection=pending``), else why the ProvisioningRequest sides are not run
    (CA reads the templates once, at its start)."""
    from kubernetes import client

    from kfp_gpu_rehearsal.devcluster import ca_profile

    try:
        cm = core.read_namespaced_config_map(ca_profile.TEMPLATES_CM, ca_profile.NAMESPACE)
        items = json.loads((cm.data or {}).get("templates", "{}")).get("items") or []
    except (client.ApiException, ValueError) as exc:
        return f"the CA profile's node templates ({ca_profile.NAMESPACE}/{ca_profile.TEMPLATES_CM}) unreadable: {exc}"
    tmpl = next((t for t in items if (t.get("metadata") or {}).get("labels", {}).get(POOL_LABEL) == pool), None)
    if tmpl is None or tmpl["metadata"]["labels"].get(BOOT_INJECTION_LABEL) != "pending":
        return (f"the running CA profile's node group {pool} boots on a fixed delay, not on the world's "
                "sampler (it predates this bench): `make cluster-up AUTOSCALER=cluster-autoscaler,karpenter` restarts "
                "it with the current templates")
    return ""


def scenario(cluster: str, seed: int, *, zero_boot: bool = False, dry_zones: tuple[str, ...] = (),
             api_latency_ms: float = API_LATENCY_MS, max_nodes: int = 600) -> dict[str, Any]:
    """The stand-in scenario of one side-run (durations in real-world seconds)."""
    b = boot_model(seed, zero=zero_boot)
    boot = {"dist": b.dist, "median_s": b.median_s, "sigma": b.sigma, "seed": seed, "min_s": b.min_s}
    return {
        "project": "local-project", "cluster": cluster, "api_latency_ms": api_latency_ms, "cloud": "gcp",
        "device_plugin_s": 0.0 if zero_boot else DEVICE_PLUGIN_S,
        "image_pull": {"image_gb": 0.0 if zero_boot else PULL.image_gb, "pull_mib_s": PULL.pull_mib_s},
        "operations": {"pending_s": 0.0 if zero_boot else PENDING_S, "set_size_s": 0.0 if zero_boot else 20.0,
                       "delete_instances_s": 45.0},
        "regions": {REGION: {"zones": list(ZONES), "quotas": {
            "NVIDIA_A100_80GB_GPUS": {"limit": 65536, "usage": 0}, "CPUS": {"limit": 10_000_000, "usage": 0}}}},
        "global_quotas": {"GPUS_ALL_REGIONS": {"limit": 65536, "usage": 0}},
        "pools": [{"name": pool_name(z), "zone": z, "accelerator": ACCEL, "gpus_per_node": GPUS, "spot": False,
                   "max_nodes": max_nodes, "initial_size": 0, "boot": dict(boot)} for z in ZONES],
        "stockouts": [{"zone": z, "window": "always"} for z in dry_zones],
        "api": {"requests_per_minute": 1500, "error_rate": 0.0 if zero_boot else ERROR_RATE, "seed": seed,
                "committed_5xx": 0.5},
    }


def aws_scenario(cluster: str, *, api_latency_ms: float = API_LATENCY_MS) -> dict[str, Any]:
    """The AWS stand-in's scenario for a side whose nodes come from Karpenter (``ours_karpenter``): its steps ask
    EKS and Service Quotas here (preflight, teardown), with P-instance quota for the largest gang (512 x 96 vCPUs)
    on both capacity types, as :func:`scenario` gives the GCP sides 65,536 GPUs; no node groups (Karpenter launches)."""
    from kfp_gpu import accelerators

    return {"cluster": cluster, "region": "us-east-1", "zones": ["us-east-1a", "us-east-1b", "us-east-1c"],
            "api_latency_ms": api_latency_ms,
            "quotas": {accelerators.AWS_QUOTA_P_ON_DEMAND: 1_000_000.0, accelerators.AWS_QUOTA_P_SPOT: 1_000_000.0}}


def description() -> dict[str, Any]:
    """What the JSON records about the world."""
    return {"time_scale": TIME_SCALE, "boot": {"dist": "lognormal", "median_real_s": BOOT_MEDIAN_S,
                                               "sigma": BOOT_SIGMA, "min_real_s": BOOT_MIN_S,
                                               "median_wall_s": round(compress(BOOT_MEDIAN_S), 4)},
            "api_latency_ms": API_LATENCY_MS, "api_error_rate": ERROR_RATE, "operation_pending_real_s": PENDING_S,
            "device_plugin_real_s": DEVICE_PLUGIN_S,
            "boot_draws": "one seeded sampler for every side's nodes (the stand-in's pools, the bench injector for "
                          "the autoscalers' and Karpenter's nodes); limit read per node",
            "image_pull": {"image_gb": PULL.image_gb, "pull_mib_s": PULL.pull_mib_s, "serial": True,
                           "pull_real_s": round(PULL.pull_s(), 2), "pull_wall_s": round(compress(PULL.pull_s()), 4)},
            "poll_interval_real_s": 10.0, "poll_interval_wall_s": round(POLL_S, 4), "accelerator": ACCEL,
            "gpus_per_node": GPUS, "ca_scale_down": ca_scale_down()}


SCALE_DOWN_FLAGS = ("--scan-interval", "--scale-down-unneeded-time", "--max-scale-down-parallelism",
                    "--node-delete-delay-after-taint")


def scale_down_flags(argv: list[str] | tuple[str, ...]) -> dict[str, str]:
    """The empty-node scale-down flags in a cluster-autoscaler argv (``default`` where unset)."""
    got = {f.split("=", 1)[0]: f.split("=", 1)[1] for f in argv if "=" in f}
    return {k.lstrip("-"): got.get(k, "default") for k in SCALE_DOWN_FLAGS}


def ca_scale_down() -> dict[str, Any]:
    """How both cluster-autoscalers of the run remove empty nodes: the bench CA's flags (the cluster_autoscaler
    side: ca_profile.FLAGS) and the running CA profile's, read from its recorded args (the ProvisioningRequest
    sides'; a profile started by older code keeps its flags until the next ``up``), so the report never states a
    rate the run did not have."""
    from kfp_gpu_rehearsal.devcluster import ca_profile, versions

    args = versions.cluster_dir() / f"{ca_profile.NAME}.args"
    try:
        profile: dict[str, str] | str = scale_down_flags(args.read_text().split())
    except OSError:
        profile = "not running"
    return {"bench_ca": scale_down_flags(ca_profile.FLAGS), "ca_profile": profile}


def pull_watcher(api_client: Any) -> Any:
    """The image pulls of the injector's nodes (``kfp-gpu.io/boot-injection``): :data:`PULL` once per node and image,
    as the stand-in does for its own (kfp_gpu_rehearsal.sim.imagepull). Call ``.stop()`` when done."""
    from kfp_gpu_rehearsal.sim.imagepull import NodeImages, PullWatcher

    images = NodeImages(PULL)
    return PullWatcher(lambda: images, api_client, BOOT_INJECTION_LABEL).start()


class StandIn:
    """The GKE stand-in (``module`` ``kfp_gpu_rehearsal.sim``; the AWS one: ``kfp_gpu_rehearsal.sim.aws``) as its own
    process, serving one scenario; nodes it creates carry ``kfp-gpu.io/sim-cluster=<cluster>``. Raises (start):
    RuntimeError when it does not come up."""

    def __init__(self, data: dict[str, Any], kubeconfig: Path, module: str = "kfp_gpu_rehearsal.sim") -> None:
        self.data, self.kubeconfig, self.module = data, kubeconfig, module
        self.cluster = str(data["cluster"])
        self.dir = Path(tempfile.mkdtemp(prefix="bench-standin-"))
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""

    @property
    def selector(self) -> str:
        return f"kfp-gpu.io/sim-cluster={self.cluster}"

    def start(self, timeout_s: float = 30.0) -> StandIn:
        scen, url_file = self.dir / "scenario.yaml", self.dir / "url"
        scen.write_text(yaml.safe_dump(self.data))
        log = (self.dir / "log").open("wb")
        self.proc = subprocess.Popen([sys.executable, "-m", self.module, "--scenario", str(scen), "--port", "0",
                                      "--kubeconfig", str(self.kubeconfig), "--url-file", str(url_file)],
                                     stdout=log, stderr=subprocess.STDOUT)
        log.close()
        end = time.time() + timeout_s
        while time.time() < end:
            if url_file.exists() and url_file.read_text().strip():
                self.url = url_file.read_text().strip()
                return self
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        tail = (self.dir / "log").read_text(errors="replace")[-1500:]
        self.stop()
        raise RuntimeError(f"stand-in did not start within {timeout_s:g}s: {tail}")

    def requests(self) -> int:
        with urllib.request.urlopen(f"{self.url}/sim/v1/requests", timeout=10) as r:
            return int(json.loads(r.read()).get("total", 0))

    def stop(self) -> None:
        p, self.proc = self.proc, None
        if p is not None and p.poll() is None:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(10)


def git_state(root: Path) -> dict[str, Any]:
    def git(*args: str) -> str:
        out = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=False)
        return out.stdout

    dirty = [line[3:] for line in git("status", "--porcelain").splitlines() if line.strip()]
    return {"commit": git("rev-parse", "HEAD").strip(), "dirty": bool(dirty), "dirty_paths": sorted(dirty)[:50],
            "bench_dirty": any(p.startswith(("bench/", "kfp_gpu/")) for p in dirty)}


def env_kubeconfig() -> Path:
    from bench.common import kubeconfig

    return Path(os.environ.get("KUBECONFIG") or kubeconfig())
