"""`make demo` installs no torch (Makefile: the demo's venv has no TORCH_CPU/FRAMEWORKS), so `kfp-gpu run
pipelines/llm_finetune.py` must not import it: not the CLI, the rehearsal (kfp_gpu_rehearsal.demo, the dev cluster, the
stand-in, the controller), loading and compiling the example pipeline, nor any step module the kfp.local
subprocesses import (the train step creates a PyTorchJob whose pods KWOK plays; no torch runs here)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

GUARD = r"""
import importlib, importlib.abc, sys
tried = []
class NoTorch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "accelerate", "lightning", "pytorch_lightning", "torchmetrics"):
            tried.append(name)
            raise ModuleNotFoundError(f"No module named {name!r} (the demo venv has no torch)")
        return None
sys.meta_path.insert(0, NoTorch())
import kfp_gpu.cli, kfp_gpu_rehearsal.demo, kfp_gpu.controller.runner, kfp_gpu_rehearsal.sim.server, kfp_gpu_rehearsal.devcluster.boot
from kfp_gpu.steps.entry import STEPS
for mod in STEPS.values():
    importlib.import_module(mod.split(":")[0])
graph = kfp_gpu_rehearsal.demo.load("pipelines/llm_finetune.py")
from kfp import compiler
import tempfile, os
with tempfile.TemporaryDirectory() as d:
    compiler.Compiler().compile(graph, os.path.join(d, "p.yaml"))
print("TRIED", tried)
sys.exit(1 if tried or any(m.split(".")[0] == "torch" for m in sys.modules) else 0)
"""


def test_kfp_gpu_run_of_the_example_imports_no_torch() -> None:
    r = subprocess.run([sys.executable, "-c", GUARD], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
