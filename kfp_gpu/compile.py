"""Compile a provisioned pipeline file to YAML for Kubeflow Pipelines or Vertex AI Pipelines."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import yaml
from kfp import compiler
from kfp.dsl import graph_component

from kfp_gpu import dsl as kdsl
from kfp_gpu.errors import InvalidSpec


def load_pipeline(path: str | Path, name: str | None = None) -> graph_component.GraphComponent:
    """Import ``path`` and return its provisioned pipeline (the one named ``name`` when several).

    Raises:
        InvalidSpec: the file is missing, has no provisioned pipeline, or several and no name was given.
    """
    path = Path(path)
    if not path.is_file():
        raise InvalidSpec("pipeline file", str(path), "does not exist")
    root = str(Path.cwd())
    if root not in sys.path:
        sys.path.insert(0, root)
    mod_name = f"_kfp_gpu_user_{path.stem}"
    spec = importlib.util.spec_from_file_location(mod_name, path)
    if spec is None or spec.loader is None:
        raise InvalidSpec("pipeline file", str(path), "is not an importable Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module
    spec.loader.exec_module(module)
    found: dict[str, Any] = {
        attr: obj for attr, obj in vars(module).items()
        if isinstance(obj, graph_component.GraphComponent) and kdsl.spec_of(obj) is not None
    }
    if name is not None:
        for attr, obj in found.items():
            if name in (attr, obj.name):
                return obj
        raise InvalidSpec("--pipeline", name, f"not found in {path}; provisioned pipelines: {sorted(found)}")
    if len(found) != 1:
        raise InvalidSpec(
            "pipeline file", str(path),
            f"must define exactly one @kfp_gpu.provisioned pipeline, found {sorted(found) or 'none'}",
            remediation="pass --pipeline NAME" if found else "decorate the pipeline with @kfp_gpu.provisioned(spec)",
        )
    return next(iter(found.values()))


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
