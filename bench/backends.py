"""Request -> gang Ready, per provisioner backend, on one scenario (issue 13's closing figure).

    python -m bench.backends [--repeats 3]       # needs `make cluster-up AUTOSCALER=cluster-autoscaler`

The same gang (2 x 8 a100-80gb, on-demand, us-central1-a) through each backend, repeats interleaved
(node-pool, CA, DWS, node-pool, ...), timed by one external clock around ``scale_up.run`` (the step's whole
work: detection, request, wait, claim), then torn down:

* ``node-pool``: the GKE stand-in resizes the pool (async setSize operation, MIG, VM boot).
* ``provisioning-request (cluster-autoscaler)``: the real cluster-autoscaler, atomic class, kwok node groups.
* ``provisioning-request (DWS)``: the GKE stand-in's queued-provisioning.gke.io (accept, queue, all nodes at once).

One world: every node boots in 240 real-world seconds (2 s at TIME_SCALE=120) with GPUs allocatable at once,
as the CA profile's KWOK nodes do (kfp_gpu.devcluster.ca_profile.BOOT_DELAY_S); so the differences are the
control paths (API calls, the autoscaler's loop, the DWS queue), not the boot model. Writes
``bench/results/backends.json`` with the commit.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import time
import uuid
from collections.abc import Callable
from typing import Any

import yaml
from kubernetes import client

from bench.common import RESULTS, ROOT
from kfp_gpu.devcluster import ca_profile
from kfp_gpu.sim import scenario as scenario_mod
from kfp_gpu.sim.server import SimServer
from kfp_gpu.spec import CapacityType, ProvisioningSpec, Target
from kfp_gpu.steps import scale_up, teardown

BOOT = {"dist": "fixed", "median_s": 240}


def _world(path: str, *, dws: bool) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((ROOT / path).read_text())
    data["cluster"] = f"b{uuid.uuid4().hex[:6]}"
    data["device_plugin_s"] = 0
    data["api"] = {"error_rate": 0.0}
    for p in data["pools"]:
        p["boot"] = dict(BOOT)
    if dws:
        data["dws"] = {"accept_s": 10, "queue": {"dist": "fixed", "median_s": 60}, "booking_s": 600}
    return data


def _spec(ns: str, **target: Any) -> ProvisioningSpec:
    cap = target.pop("capacity", CapacityType.ON_DEMAND)
    return ProvisioningSpec("a100-80gb", 2, capacity=cap, zones=("us-central1-a",), scale_up_deadline_s=120,
                            max_run_duration_s=3600.0 if cap is CapacityType.FLEX_START else 0.0,
                            target=Target(kind="local", region="us-central1", namespace=ns, **target))


def measure(api: client.ApiClient, kubeconfig: Any, ns: str, repeats: int) -> dict[str, list[float]]:
    sims = {"node-pool": SimServer(scenario_mod.from_dict(_world("kfp_gpu/sim/scenarios/default.yaml", dws=False)),
                                   kubeconfig),
            "dws": SimServer(scenario_mod.from_dict(_world("kfp_gpu/sim/scenarios/flex-start.yaml", dws=True)),
                             kubeconfig)}
    for s in sims.values():
        s.start()
    cases: dict[str, Callable[[], ProvisioningSpec]] = {
        "node-pool": lambda: _spec(ns, cluster=sims["node-pool"].state.scenario.cluster,
                                   endpoint=sims["node-pool"].url, pools=("a100-80gb-a",), provisioner="node-pool"),
        "provisioning-request (cluster-autoscaler)": lambda: _spec(
            ns, cluster=ca_profile.CLUSTER, pools=("ca-a100-a",), tolerations=(ca_profile.TAINT,),
            provisioner="provisioning-request"),
        "provisioning-request (DWS)": lambda: _spec(
            ns, cluster=sims["dws"].state.scenario.cluster, endpoint=sims["dws"].url, capacity=CapacityType.FLEX_START,
            provisioner="auto"),
    }
    out: dict[str, list[float]] = {k: [] for k in cases}
    try:
        for _ in range(repeats):
            for name, make in cases.items():
                spec, run = make(), f"bench-{uuid.uuid4().hex[:6]}"
                t0 = time.monotonic()
                scale_up.run(spec, run, "", api=api)
                out[name].append(time.monotonic() - t0)
                teardown.run(spec, run, "", api=api)
                time.sleep(6.0)  # the CA profile scales its empty nodes down after 5 s: every case starts from zero
    finally:
        for s in sims.values():
            s.stop()
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    from kfp_gpu.devcluster import boot

    ctx = boot.up()
    ca_profile.ensure_up()
    api = client.ApiClient(_config(ctx.kubeconfig))
    ns = "kfp-gpu-bench"
    try:
        client.CoreV1Api(api).create_namespace({"metadata": {"name": ns}})
    except client.ApiException as exc:
        if exc.status != 409:
            raise
    got = measure(api, ctx.kubeconfig, ns, a.repeats)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    rows = {k: {"runs_s": [round(v, 3) for v in vs], "median_s": round(statistics.median(vs), 3)}
            for k, vs in got.items()}
    doc = {"commit": commit, "gang": "2 x 8 a100-80gb on-demand, us-central1-a", "boot": "240 s real (2 s) fixed",
           "repeats": a.repeats, "backends": rows}
    (RESULTS / "backends.json").write_text(json.dumps(doc, indent=2) + "\n")
    for k, r in rows.items():
        print(f"{k:45s} median {r['median_s']:6.2f} s  runs {r['runs_s']}")
    return 0


def _config(kubeconfig: Any) -> client.Configuration:
    from kubernetes import config

    cfg = client.Configuration()
    config.load_kube_config(config_file=str(kubeconfig), client_configuration=cfg)
    return cfg


if __name__ == "__main__":
    raise SystemExit(main())
