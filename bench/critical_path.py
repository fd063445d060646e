"""The critical path of the decorated example (pipelines/llm_finetune.py), reported as a DAG property only.

No runner here executes a compiled DAG in parallel (kfp.local's SubprocessRunner runs one task at a time, and the
KFP backend cannot be built locally: docs/architecture.md, verified facts), so no timed ratio against
provision-first is claimed. What is reported is read from the pipeline compiled by this commit's code: which tasks the training task waits for, and
the dependency chains into it. On a parallel executor the decorated layout's path to training is therefore
max(D, P) + T (D = data prep, P = preflight + warm pool + scale-up, T = train), provision-first's is D + P + T.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

from bench.common import ROOT

PIPELINE = "pipelines/llm_finetune.py"
TRAIN = "train-pytorchjob"


def _chains(tasks: dict[str, list[str]], end: str) -> list[list[str]]:
    deps = tasks.get(end, [])
    if not deps:
        return [[end]]
    return [[*c, end] for d in deps for c in _chains(tasks, d)]


def analyse(ir: dict[str, Any]) -> dict[str, Any]:
    """The chains into the training task of a compiled pipeline spec (first YAML document)."""
    dags = [ir["root"]["dag"], *(c["dag"] for c in ir.get("components", {}).values() if "dag" in c)]
    for dag in dags:
        tasks = {n: list(t.get("dependentTasks") or []) for n, t in dag.get("tasks", {}).items()}
        if TRAIN in tasks:
            chains = _chains(tasks, TRAIN)
            heads = {c[0] for c in chains}
            return {"train_waits_for": sorted(tasks[TRAIN]), "chains_into_train": chains,
                    "independent_branches": len(chains), "data_prep_parallel_to_provisioning":
                        len(chains) > 1 and "prepare-data" in heads and "quota-preflight" in heads,
                    "longest_chain_tasks": max(len(c) for c in chains)}
    raise ValueError(f"no {TRAIN} task in the compiled pipeline")


def dag_property() -> dict[str, Any]:
    """Compile the example with this commit's code and analyse it. Raises: RuntimeError if compile fails."""
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "p.yaml"
        cp = subprocess.run([sys.executable, "-m", "kfp_gpu.cli", "compile", PIPELINE, "-o", str(out),
                             "--target", "kfp"], cwd=ROOT, capture_output=True, text=True, timeout=300)
        if cp.returncode != 0 or not out.exists():
            raise RuntimeError(f"compile failed: {cp.stderr[-600:]}")
        ir = next(iter(yaml.safe_load_all(out.read_text())))
    res = analyse(ir)
    res.update({"pipeline": PIPELINE, "method": "DAG property of the pipeline compiled by this commit; no runner "
                "executed it in parallel, so no timed ratio is reported",
                "decorated_path": "max(D, P) + T", "provision_first_path": "D + P + T"})
    return res
