"""`make demo`: the example pipeline end to end through kfp.local against the local GKE.

Boots (or reuses) the local control plane, starts the GKE stand-in on it, runs
``pipelines/llm_finetune.py`` with kfp.local's SubprocessRunner, then prints the provisioning timeline,
the cost-risk report and proof that nothing of the run is left.
"""

from __future__ import annotations

import glob
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from kfp_gpu.spec import ProvisioningSpec
from kfp_gpu.timeline import Timeline


def _teardown_output(root: str) -> dict[str, object]:
    for path in sorted(glob.glob(f"{root}/**/executor_output.json", recursive=True)):
        if "teardown" in path:
            params = json.loads(Path(path).read_text()).get("parameterValues", {})
            if "Output" in params:
                return dict(json.loads(params["Output"]))
    for path in sorted(glob.glob(f"{root}/**/teardown/**/Output", recursive=True)):
        return dict(json.loads(Path(path).read_text()))
    return {}


def main(nodes: int = 4, keep: bool = True) -> int:
    """Run the demo; the local cluster stays up unless ``keep=False``. Returns the process exit code."""
    from kfp import local

    from kfp_gpu.devcluster import boot
    from kfp_gpu.report.cost import cost_report
    from kfp_gpu.report.terminal import cost_table, gantt
    from kfp_gpu.sim.server import SimServer

    print("kfp-gpu demo: booting the local GKE (etcd, kube-apiserver, scheduler, controller-manager, KWOK, "
          "Training Operator)...", flush=True)
    ctx = boot.up()
    os.environ["KUBECONFIG"] = str(ctx.kubeconfig)
    sim = SimServer(None, ctx.kubeconfig)
    url = sim.start()
    os.environ["KFP_GPU_SIM_ENDPOINT"] = url
    print(f"GKE/Compute stand-in on {url}; node pools become KWOK GPU nodes\n", flush=True)
    root = tempfile.mkdtemp(prefix="kfp-gpu-demo-")
    sys.path.insert(0, str(Path.cwd()))
    import importlib

    example = importlib.import_module("pipelines.llm_finetune")
    spec: ProvisioningSpec = example.SPEC
    llm_finetune = example.llm_finetune
    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=root, raise_on_error=True)
    t0 = time.time()
    failure = ""
    try:
        llm_finetune()
    except Exception as exc:  # kfp.local raises after the exit handler (teardown) has run
        failure = str(exc).splitlines()[0]
    took = time.time() - t0
    out = _teardown_output(root)
    sim.stop()
    status = f"FAILED: {failure}" if failure else "SUCCEEDED"
    print(f"\n=== pipeline llm-finetune {status} in {took:.1f}s (kfp.local, SubprocessRunner) ===")
    tl = Timeline.from_json(str(out.get("timeline") or "")) if out.get("timeline") else Timeline()
    if tl.nodes:
        print("\nProvisioning timeline (requested -> registered -> Ready -> released):")
        print(gantt(tl, width=100))
        print("\nCost-risk report:")
        print(cost_table(cost_report(spec, tl), width=100))
    else:
        print("no timeline found in the teardown output (did the run fail? see the logs above)")
    leftovers = {k: out.get(k) for k in ("errors",) if out.get(k)}
    released = list(out.get("nodes_released") or [])  # type: ignore[call-overload]
    print(f"\nteardown: released {len(released)} nodes, restored pools "
          f"{out.get('pools_restored')}, deleted jobs {out.get('jobs')}; errors: {leftovers or 'none'}")
    print(f"artifacts and HTML reports: {root}")
    if not keep:
        boot.down()
    return 0 if tl.nodes and not leftovers and not failure else 1
