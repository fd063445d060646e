"""The recovery bench's world: its GKE stand-in (one spot A100 pool, fixed boot), the preemption, the node watch.

Every side of bench/recovery.py starts its own stand-in from :func:`start_sim` (same scenario, same seed).
"""

from __future__ import annotations

import json
import time
import urllib.request

from kubernetes import client

from bench.common import ReadyWatch, kubeconfig, sampled_boot_s, scenario_dict, uid
from bench.recovery_watch import JobPods
from bench.world import API_LATENCY_MS
from kfp_gpu import iam
from kfp_gpu_rehearsal.sim import scenario as scenario_mod
from kfp_gpu_rehearsal.sim.clock import compress
from kfp_gpu_rehearsal.sim.server import SimServer

POOL = "bench-a100-spot-a"
ZONE = "us-central1-a"
ACCEL = "a100-80gb"
GPUS = 8
N = 4
BOOT_REAL_S = 210.0  # the bench world's median A100 boot (real-world s), fixed for every node
BOOT_S = round(compress(BOOT_REAL_S), 4)  # 1.75 s here


def start_sim() -> tuple[SimServer, str]:
    cluster = uid("brec")
    data = scenario_dict("burst", cluster=cluster)
    data["regions"]["us-central1"]["quotas"]["PREEMPTIBLE_NVIDIA_A100_80GB_GPUS"] = {"limit": 4096, "usage": 0}
    data["api_latency_ms"] = API_LATENCY_MS  # the bench world's (bench/world.py)
    data["pools"] = [{"name": POOL, "zone": ZONE, "accelerator": ACCEL, "gpus_per_node": GPUS, "spot": True,
                      "max_nodes": 16, "initial_size": 0,
                      "boot": {"dist": "fixed", "median_s": BOOT_REAL_S, "sigma": 0.0, "seed": 0}}]
    sim = SimServer(scenario_mod.from_dict(data), kubeconfig())
    sim.start()
    return sim, cluster


def set_size(sim: SimServer, cluster: str, size: int) -> None:
    url = (f"{sim.url}/v1/projects/{sim.scenario.project}/locations/{ZONE}/clusters/{cluster}"
           f"/nodePools/{POOL}:setSize")
    req = urllib.request.Request(url, data=json.dumps({"nodeCount": size}).encode(), method="POST",
                                 headers={"Content-Type": "application/json",  # the stand-in enforces IAM
                                          "Authorization": f"Bearer {iam.SIM_GCP_TOKEN}"})
    with urllib.request.urlopen(req, timeout=30) as r:
        r.read()


OVERLAP_S = 0.1  # between two preemptions: inside the first one's 30 s (0.25 s here) notice, so they overlap


def victims_of(pods: JobPods, k: int) -> list[str]:
    """Nodes of worker-1 .. worker-k."""
    out = []
    for i in range(1, k + 1):
        nodes = [str(r["node"]) for r in pods.live_running() if r["name"].endswith(f"worker-{i}")]
        if not nodes:
            raise RuntimeError(f"no running worker-{i} pod")
        out.append(nodes[0])
    return out


def preempt(sim: SimServer, victims: list[str]) -> None:
    for i, v in enumerate(victims):
        if i:
            time.sleep(OVERLAP_S)
        sim.preempt(v)


def boot_of(api: client.ApiClient, node: str) -> float:
    b = sampled_boot_s(client.CoreV1Api(api).read_node(node))
    if b is None:
        raise RuntimeError(f"replacement node {node} has no readable boot latency")
    return b


def pool_watch(api: client.ApiClient, cluster: str) -> ReadyWatch:
    from kfp_gpu_rehearsal.devcluster.nodes import POOL_LABEL

    return ReadyWatch(api, f"{POOL_LABEL}={POOL},kfp-gpu.io/sim-cluster={cluster}")
