"""Compile a provisioned pipeline file to YAML for Kubeflow Pipelines or Vertex AI Pipelines."""

from __future__ import annotations

import importlib.util
import sys
import traceback
from pathlib import Path
from typing import Any

import yaml
from kfp import compiler
from kfp.dsl import graph_component

from kfp_gpu import dsl as kdsl
from kfp_gpu.errors import InvalidSpec, KfpGpuError

_FILE_FIX = "pass the path of a Python file that defines one @kfp_gpu.provisioned pipeline (e.g. pipelines/llm_finetune.py)"


def load_pipeline(path: str | Path, name: str | None = None) -> graph_component.GraphComponent:
    """Import ``path`` and return its provisioned pipeline (the one named ``name`` when several).

    Raises:
        InvalidSpec: the file is missing, not a Python file, fails to import (its first error line and where, one
            line: the user's file, not ours), has no provisioned pipeline, or several and no name was given.
    """
    path = Path(path)
    if not path.is_file():
        why = "is a directory, not a file" if path.is_dir() else "does not exist"
        raise InvalidSpec("pipeline file", str(path), why, remediation=_FILE_FIX)
    root = str(Path.cwd())
    if root not in sys.path:
        sys.path.insert(0, root)
    mod_name = f"_kfp_gpu_user_{path.stem}"
    spec = importlib.util.spec_from_file_location(mod_name, path)
    if spec is None or spec.loader is None:
        raise InvalidSpec("pipeline file", str(path), "is not an importable Python file", remediation=_FILE_FIX)
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module
    try:
        spec.loader.exec_module(module)
    except KfpGpuError:  # the decorator's own checks (InvalidSpec ...) already say field, value and fix
        sys.modules.pop(mod_name, None)
        raise
    except Exception as exc:  # noqa: BLE001 - the user's file: its error, in one line
        sys.modules.pop(mod_name, None)
        raise InvalidSpec("pipeline file", str(path), f"fails to import: {import_error(exc, path)}",
                          remediation=f"run python {path} for the traceback and fix that line") from None
    found: dict[str, Any] = {
        attr: obj for attr, obj in vars(module).items()
        if isinstance(obj, graph_component.GraphComponent) and kdsl.spec_of(obj) is not None
    }
    if name is not None:
        for attr, obj in found.items():
            if name in (attr, obj.name):
                return obj
        raise InvalidSpec("--pipeline", name, f"not found in {path}; provisioned pipelines: {sorted(found)}",
                          remediation=f"pass --pipeline with one of {sorted(found)}" if found else
                          "decorate the pipeline with @kfp_gpu.provisioned(spec)")
    if len(found) != 1:
        raise InvalidSpec(
            "pipeline file", str(path),
            f"must define exactly one @kfp_gpu.provisioned pipeline, found {sorted(found) or 'none'}",
            remediation="pass --pipeline NAME" if found else "decorate the pipeline with @kfp_gpu.provisioned(spec)",
        )
    return next(iter(found.values()))


def import_error(exc: BaseException, path: Path) -> str:
    """``TYPE: first line at FILE:LINE`` for an exception raised while importing ``path``: a SyntaxError names its
    own file and line; otherwise the innermost frame in ``path`` (else the innermost frame) names where."""
    first = (str(exc.msg if isinstance(exc, SyntaxError) else exc).strip().splitlines() or [""])[0]
    if isinstance(exc, SyntaxError) and exc.filename:
        return f"{type(exc).__name__}: {first} at {exc.filename}:{exc.lineno}"
    frames = traceback.extract_tb(exc.__traceback__)
    own = [f for f in frames if Path(f.filename).resolve() == path.resolve()]
    where = (own or frames)[-1:]
    return f"{type(exc).__name__}: {first}" + (f" at {where[0].filename}:{where[0].lineno}" if where else "")


def compile_pipeline(
    path: str | Path, output: str | Path, *, target: str = "kfp", name: str | None = None,
) -> Path:
    """Compile the provisioned pipeline in ``path`` to ``output``.

    ``kfp`` may emit a second YAML document with kfp-kubernetes platform config; ``vertex`` always emits
    a single document without it, which ``google.cloud.aiplatform.PipelineJob`` accepts.

    Raises:
        InvalidSpec: see :func:`load_pipeline`, or an unknown target.
    """
    pipeline = kdsl.for_target(load_pipeline(path, name), target)
    out = Path(output)
    out.parent.mkdir(parents=True, exist_ok=True)
    compiler.Compiler().compile(pipeline, str(out))
    if target == "vertex":
        docs = [d for d in yaml.safe_load_all(out.read_text()) if d]
        if len(docs) != 1 or "platforms" in docs[0]:
            raise InvalidSpec("target", target, "vertex output must be one YAML document without platform config")
    return out


def dag_edges(package_path: str | Path) -> dict[str, list[str]]:
    """task name -> its dependencies, across the root DAG and the exit-handler sub-DAG."""
    docs = [d for d in yaml.safe_load_all(Path(package_path).read_text()) if d]
    spec = docs[0]
    edges: dict[str, list[str]] = {}
    dags = [spec["root"]["dag"]] + [c["dag"] for c in spec["components"].values() if "dag" in c]
    for dag in dags:
        for task, body in dag["tasks"].items():
            edges[task] = sorted(body.get("dependentTasks", []))
    return edges
