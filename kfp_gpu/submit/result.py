"""What a submission returns, whatever the backend."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

from kfp_gpu.errors import InvalidSpec


@dataclass(frozen=True)
class SubmitResult:
    """``run_id``: KFP run id or Vertex PipelineJob id; ``pipeline_id``: KFP pipeline id or the
    pipeline name (Vertex); ``url``: where a human can watch it."""

    run_id: str
    pipeline_id: str
    url: str
    backend: str = "kfp"
    version_id: str = ""
    experiment_id: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def load_package(package_path: str | Path) -> list[dict[str, Any]]:
    """The YAML documents of a compiled pipeline package (one, or two with kfp-kubernetes config).

    Raises:
        InvalidSpec: the file is missing, is not YAML, or its first document is not a PipelineSpec.
    """
    p = Path(package_path)
    if not p.is_file():
        raise InvalidSpec(
            "package_path", str(p), "no such file",
            remediation="compile first: kfp-gpu compile <pipeline.py> -o pipeline.yaml",
        )
    try:
        docs = [d for d in yaml.safe_load_all(p.read_text(encoding="utf-8")) if d is not None]
    except yaml.YAMLError as exc:
        raise InvalidSpec("package_path", str(p), f"is not valid YAML ({exc.__class__.__name__})") from None
    if not docs or not isinstance(docs[0], dict) or "pipelineInfo" not in docs[0] or "root" not in docs[0]:
        raise InvalidSpec(
            "package_path", str(p), "is not a compiled KFP pipeline (no pipelineInfo/root)",
            remediation="pass the YAML written by kfp.compiler.Compiler or kfp-gpu compile",
        )
    return docs


def check_params(doc: dict[str, Any], params: dict[str, Any]) -> None:
    """Every parameter must be a pipeline input, and every required input must be given.

    Raises:
        InvalidSpec: naming ``params.<name>`` for an unknown or missing parameter.
    """
    declared = dict(((doc.get("root") or {}).get("inputDefinitions") or {}).get("parameters") or {})
    for name in params:
        if name not in declared:
            raise InvalidSpec(f"params.{name}", params[name],
                              f"not a pipeline input; inputs are: {', '.join(sorted(declared)) or '(none)'}")
    for name, d in declared.items():
        optional = isinstance(d, dict) and (d.get("isOptional") or "defaultValue" in d)
        if not optional and name not in params:
            raise InvalidSpec(f"params.{name}", None, "is a required pipeline input",
                              remediation=f"pass {name}=... in the parameters")
