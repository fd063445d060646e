from __future__ import annotations

import random

from kfp_gpu.timeline import NodeState, Timeline

T0 = 1_700_000_000.0


def make_timeline(n: int, *, preempt: int = 1, seed: int = 7, job: bool = True) -> Timeline:
    """n nodes requested at T0, booting with jitter; ``preempt`` of them preempted; a job-running span."""
    rnd = random.Random(seed)
    tl = Timeline(run_id="run-123")
    pools = ["gpu-a", "gpu-b"]
    zones = ["us-central1-a", "us-central1-b", "us-central1-c"]
    end = T0 + 900.0
    for i in range(n):
        node = tl.node(f"gke-node-{i:03d}", pool=pools[i % 2], zone=zones[i % 3], gpus=8, spot=True)
        req = T0 + rnd.uniform(0, 5)
        reg = req + rnd.uniform(40, 80)
        ready = reg + rnd.uniform(30, 60 if i else 200)
        node.advance(NodeState.REQUESTED, req)
        node.advance(NodeState.REGISTERED, reg)
        node.advance(NodeState.READY, ready)
        if i < preempt:
            node.advance(NodeState.PREEMPTED, ready + 300)
            node.advance(NodeState.RELEASED, ready + 320)
        else:
            node.advance(NodeState.RELEASED, end)
    if job:
        tl.event("job-running", T0 + 320.0, gpus=8 * n)
        tl.event("job-finished", T0 + 880.0)
    return tl
