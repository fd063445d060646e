"""Run-time values: what a step resolves when the pipeline runs, not when it is compiled.

Two kinds travel as extra inputs of the kfp-gpu tasks (the DSL side is :mod:`kfp_gpu.channels`):

* **Spec fields chosen at run time** (``@kfp_gpu.provisioned(spec, runtime=("nodes", ...))``): every kfp-gpu
  task gets inputs ``spec__<field>`` bound to the pipeline parameter ``<field>``; :func:`resolve_spec` applies
  them over the compiled spec and validates the result with the usual :class:`InvalidSpec` messages.
* **Pipeline parameters and task outputs passed to** ``kfp_gpu.train(...)``: the job fields that hold them
  travel in the job template JSON as placeholders (``{"__kfp_gpu_param__": "p0"}``, or
  ``{"__kfp_gpu_param__": ["--steps=", {"__kfp_gpu_param__": "p0"}]}`` for a string built from them), the train
  task gets inputs ``p0..pN`` bound to the channels, and :func:`resolve_job` substitutes them and rebuilds
  (and so re-validates) the job template.

The values reach the component as extra inputs of its executor input; :func:`executor_parameters` reads them
from the ``--executor_input`` argument every KFP lightweight component is started with. Free of kfp imports.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from kfp_gpu.errors import InvalidSpec
from kfp_gpu.job import PLACEHOLDER_KEY, JobTemplate
from kfp_gpu.spec import ProvisioningSpec

PARAM = PLACEHOLDER_KEY
SPEC_INPUT = "spec__"  # extra input ``spec__nodes`` of every kfp-gpu task <- pipeline parameter ``nodes``
_PARAM_INPUT = re.compile(r"^p\d+$")

# Spec fields that may be chosen at run time -> the KFP parameter type of their pipeline parameter.
RUNTIME_FIELDS: dict[str, str] = {
    "nodes": "Integer",
    "accelerator": "String",
    "gpus_per_node": "Integer",
    "capacity": "String",
    "zones": "List",
    "scale_up_deadline_s": "Float",
    "reservation": "String",
    "checkpoint_uri": "String",
}
_PY_TYPES: dict[str, type] = {"Integer": int, "String": str, "List": list, "Float": float}


def check_runtime_fields(names: Sequence[str]) -> tuple[str, ...]:
    """Raises: InvalidSpec for a name that is not a run-time spec field, or a repeated one."""
    if isinstance(names, str):
        names = (names,)
    out: list[str] = []
    for name in names:
        if name not in RUNTIME_FIELDS:
            raise InvalidSpec("runtime", name, f"not a spec field chosen at run time; allowed: {', '.join(RUNTIME_FIELDS)}",
                              remediation="list spec field names, e.g. runtime=('nodes', 'accelerator', 'capacity')")
        if name in out:
            raise InvalidSpec("runtime", name, "listed twice")
        out.append(name)
    return tuple(out)


def parameter_default(spec: ProvisioningSpec, name: str) -> Any:
    """The pipeline parameter's default: the spec's own value, in the parameter's type."""
    value = spec.to_dict()[name]
    kind = RUNTIME_FIELDS[name]
    if kind == "Float":
        return float(value)
    if kind == "List":
        return list(value)
    return value


def python_type(name: str) -> type:
    return _PY_TYPES[RUNTIME_FIELDS[name]]


def executor_parameters(argv: Sequence[str]) -> dict[str, Any]:
    """The parameter values of the KFP executor input in ``argv`` (``{}`` when started without one).

    Raises:
        InvalidSpec: ``--executor_input`` is not JSON.
    """
    args = list(argv)
    if "--executor_input" not in args:
        return {}
    i = args.index("--executor_input")
    try:
        doc = json.loads(args[i + 1])
    except (IndexError, ValueError) as exc:
        raise InvalidSpec("--executor_input", (args[i + 1:i + 2] or [""])[0][:80], f"is not JSON ({exc})") from None
    return dict(((doc.get("inputs") or {}).get("parameterValues")) or {})


def split(params: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(spec overrides by field name, job values by ``pN``) of the extra inputs in ``params``."""
    spec = {k[len(SPEC_INPUT):]: v for k, v in params.items() if k.startswith(SPEC_INPUT)}
    job = {k: v for k, v in params.items() if _PARAM_INPUT.match(k)}
    return spec, job


def resolve_spec(spec_json: str, overrides: Mapping[str, Any]) -> ProvisioningSpec:
    """The compiled spec with the run-time ``overrides`` applied, validated as a whole.

    Raises:
        InvalidSpec: the spec JSON is malformed, a field is not a run-time field, or a value is invalid
            (the same message a bad value in the Python spec gives, naming the field).
    """
    if not overrides:
        return ProvisioningSpec.from_json(spec_json)
    data = ProvisioningSpec.from_json(spec_json).to_dict()
    for name, value in overrides.items():
        if name not in RUNTIME_FIELDS:
            raise InvalidSpec(f"{SPEC_INPUT}{name}", value, f"not a run-time spec field; allowed: {', '.join(RUNTIME_FIELDS)}")
        data[name] = _coerce(name, value)
    return ProvisioningSpec.from_dict(data)


def _coerce(name: str, value: Any) -> Any:
    """A parameter value as the spec field wants it (KFP may hand integers over as 4.0, lists as JSON text)."""
    kind = RUNTIME_FIELDS[name]
    if kind == "Integer" and isinstance(value, float) and value.is_integer():
        return int(value)
    if kind == "Integer" and isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    if kind == "Float" and isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value
    if kind == "List" and isinstance(value, str):
        text = value.strip()
        if text.startswith("["):
            try:
                return list(json.loads(text))
            except ValueError:
                return value
        return [z.strip() for z in text.split(",") if z.strip()]
    return value


def as_text(value: Any) -> str:
    """A run-time value inside a string (``f"--steps={steps}"``): strings as they are, the rest as JSON."""
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)


def substitute(obj: Any, values: Mapping[str, Any]) -> Any:
    """``obj`` (JSON) with every placeholder replaced: ``{PARAM: "p0"}`` by the value of ``p0``,
    ``{PARAM: [parts...]}`` by the parts joined as text.

    Raises:
        InvalidSpec: a placeholder names a value the task was not given.
    """
    if isinstance(obj, dict):
        if set(obj) == {PARAM}:
            ref = obj[PARAM]
            if isinstance(ref, list):
                return "".join(as_text(substitute(part, values)) for part in ref)
            if ref not in values:
                raise InvalidSpec("job run-time value", ref, f"was not passed to the train step (got {sorted(values)})",
                                  remediation="recompile the pipeline with this kfp-gpu version")
            return values[ref]
        return {k: substitute(v, values) for k, v in obj.items()}
    if isinstance(obj, list):
        return [substitute(v, values) for v in obj]
    return obj


def resolve_job(job_json: str, runtime_json: str, values: Mapping[str, Any]) -> str:
    """The job template JSON with its run-time values filled in, validated as a whole.

    ``job_json`` may hold placeholders; ``runtime_json`` holds whole fields given as one list/dict parameter.

    Raises:
        InvalidSpec: the JSON is malformed, a value is missing, or a filled-in field is invalid (named).
    """
    if not runtime_json and PARAM not in job_json:
        return job_json
    try:
        data = json.loads(job_json)
        whole = json.loads(runtime_json) if runtime_json else {}
    except ValueError as exc:
        raise InvalidSpec("job_json", job_json[:80], f"is not JSON ({exc})") from None
    if not isinstance(data, dict) or not isinstance(whole, dict):
        raise InvalidSpec("job_json", job_json[:80], "must be a JSON object of job fields")
    data = substitute(data, values)
    data.update(substitute(whole, values))
    return JobTemplate.from_json(json.dumps(data)).to_json()
