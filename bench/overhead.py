"""Control-plane overhead at zero boot: 512 GPUs (64 nodes x 8) and 4,096 GPUs (512 x 8), on the bench world
(bench/world.py: stand-in process, 100 ms API latency; boot, operation and device-plugin times zero; no 5xx).

Wall time of our steps, each measured around the library call a component makes:
preflight (``run_preflight`` with the cluster checks), warm pool (``warm_pool.run``: balloons + request the
whole gang, no wait), scale-up (``scale_up.run``: waits for the 64 nodes and claims them) and job
launch (the train step's gang gate + PyTorchJob create, via TrainState/GangWatch/pytorchjob exactly as
``kfp_gpu.steps.train`` does them; the job itself is not run to completion). Timed by the harness around each
call (ours only: no peer). Targets: 512 GPUs < 2 s, 4,096 GPUs < 6 s.

Zero boot is not zero time: the stand-in registers the Nodes and KWOK makes them Ready on the same 2-core control
plane. ``world_nodes_ready`` (not a step, not in ``total``) is when the bench's external watch
(bench/observe.py) saw the last of the n Nodes Ready with GPUs, counted from the warm pool step's start: the
floor under warm pool + scale-up that no provisioner can beat on this machine.
"""

from __future__ import annotations

import time
from typing import Any

from kubernetes import client

from bench.common import delete_nodes, kubeconfig, new_api, stats, uid
from bench.observe import Observer
from bench.world import StandIn, pool_name, scenario

GPUS = 8


def _one(n: int, namespace: str, obs: Observer | None = None) -> dict[str, float]:
    from kfp_gpu.cluster import pytorchjob
    from kfp_gpu.job import JobTemplate
    from kfp_gpu.providers.gke import GkeProvider
    from kfp_gpu.spec import ProvisioningSpec, Target, WarmPool
    from kfp_gpu.steps import scale_up, train, warm_pool
    from kfp_gpu.steps.capacity import Capacity
    from kfp_gpu.steps.preflight import run_preflight

    sim = StandIn(scenario(uid("bov"), 0, zero_boot=True), kubeconfig()).start()
    cluster = sim.cluster
    api = new_api()
    sel = sim.selector
    out: dict[str, float] = {}
    run_id = uid("bov-")
    job = ""
    try:
        spec = ProvisioningSpec("a100-80gb", n, gpus_per_node=GPUS, target=Target(
            kind="local", cluster=cluster, region="us-central1", endpoint=sim.url, namespace=namespace,
            pools=(pool_name("us-central1-a"),), provisioner="node-pool"),
            zones=("us-central1-a",), scale_up_deadline_s=300.0, warm_pool=WarmPool(nodes=n, ttl_s=600))
        provider = GkeProvider.from_target(spec.target)
        t = time.perf_counter()
        run_preflight(spec, provider, api)
        out["preflight"] = time.perf_counter() - t
        t, t_warm = time.perf_counter(), time.time()
        warm_pool.run(spec, run_id, "", api=api, provider=provider)
        out["warm_pool"] = time.perf_counter() - t
        t = time.perf_counter()
        cap = Capacity.from_json(scale_up.run(spec, run_id, "", api=api, provider=provider).output_json)
        out["scale_up"] = time.perf_counter() - t
        if obs is not None:
            ready = [r.ready for r in obs.matching(lambda r: r.labels.get("kfp-gpu.io/sim-cluster") == cluster, t_warm)
                     if r.ready is not None]
            if len(ready) >= n:
                out["world_nodes_ready"] = max(ready) - t_warm
        template = JobTemplate(name="bench", annotations={pytorchjob.SIM_DURATION_ANNOTATION: "0s"})
        t = time.perf_counter()
        st = train.TrainState(spec, run_id, api, cap, pytorchjob.job_name(run_id, template.name))
        job = st.job
        st.watch.start()
        try:
            st.watch.gate(cap.nodes, cap.gpus_per_node, 60.0)
            body = pytorchjob.manifest(st.job, capacity=cap, template=template, labels=st.owner.labels(),
                                       nodes=spec.nodes, checkpoint_uri="", resume_step=0, run_id=run_id,
                                       gang_nodes=cap.nodes)
            pytorchjob.create_or_get(api, namespace, body)
        finally:
            st.watch.stop()
        out["job_launch"] = time.perf_counter() - t
        out["total"] = sum(out[k] for k in ("preflight", "warm_pool", "scale_up", "job_launch"))
        return out
    finally:  # each cleanup step on its own: a failing one never leaves the stand-in's nodes behind
        core = client.CoreV1Api(api)
        for step in ((lambda: pytorchjob.delete(api, namespace, job)) if job else None,
                     lambda: core.delete_collection_namespaced_pod(
                         namespace, label_selector=f"kfp-gpu.io/run-id={run_id}", grace_period_seconds=0),
                     sim.stop, lambda: delete_nodes(api, sel, timeout_s=180.0)):
            if step is None:
                continue
            try:
                step()
            except Exception as exc:  # noqa: BLE001 - reported, the next step still runs
                print(f"  cleanup of {cluster}: {type(exc).__name__}: {exc}"[:300], flush=True)
        left = core.list_node(label_selector=sel).items
        api.close()
        if left:
            raise RuntimeError(f"control-plane scenario left {len(left)} nodes ({sel})")


def run(n: int, repeats: int, namespace: str, log: Any = print, obs: Observer | None = None) -> dict[str, Any]:
    """``repeats`` measured runs at ``n`` nodes after one unrecorded warm-up (imports, clients); ``obs``: the
    bench's external watch, for ``world_nodes_ready``."""
    _one(1, namespace)
    samples: dict[str, list[float]] = {}
    for rep in range(repeats):
        o = _one(n, namespace, obs)
        for k, v in o.items():
            samples.setdefault(k, []).append(round(v, 4))
        log(f"  control plane {n * GPUS} GPUs r{rep}: total {o['total']:.3f}s " +
            " ".join(f"{k}={v:.3f}" for k, v in o.items() if k != "total"))
    return {"gpus": n * GPUS, "nodes": n, "samples": samples, "stats": {k: stats(v) for k, v in samples.items()}}
