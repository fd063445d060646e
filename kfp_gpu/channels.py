"""Compile side of run-time values: pipeline parameters and task outputs in job fields, spec fields as
pipeline parameters. The run-time side is :mod:`kfp_gpu.runtime`.

A job field holding a ``PipelineChannel`` (a pipeline parameter or an upstream task output), or a string
built from one (``f"--steps={steps}"``), is not serialised at compile time: it is encoded with markers, and
the task gets one extra input ``pN`` per distinct channel, bound to it. KFP resolves the inputs when the task
starts; the train step substitutes them (:func:`kfp_gpu.runtime.resolve_job`).
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Mapping
from typing import Any

from kfp.dsl import base_component, pipeline_channel, structures

from kfp_gpu.errors import InvalidSpec
from kfp_gpu.runtime import PARAM

_PATTERN = re.compile(pipeline_channel._PIPELINE_CHANNEL_PLACEHOLDER_REGEX)  # noqa: SLF001 - KFP's own f-string form


class Params:
    """The distinct channels of one ``train()`` call, named ``p0..pN`` in order of appearance."""

    def __init__(self) -> None:
        self.channels: dict[str, pipeline_channel.PipelineParameterChannel] = {}  # pN -> channel
        self._by_pattern: dict[str, str] = {}

    def name_of(self, field: str, channel: pipeline_channel.PipelineChannel) -> str:
        """Raises: InvalidSpec for an artifact channel (artifacts are passed as ``dataset=``)."""
        if not isinstance(channel, pipeline_channel.PipelineParameterChannel):
            raise InvalidSpec(f"train.{field}", channel.pattern,
                              "is an artifact; job fields take parameters (strings, numbers, lists)",
                              remediation="pass the artifact as dataset=..., or pass a parameter output instead")
        key = channel.pattern
        if key not in self._by_pattern:
            name = f"p{len(self.channels)}"
            self._by_pattern[key] = name
            self.channels[name] = channel
        return self._by_pattern[key]

    def inputs(self) -> dict[str, tuple[str, Any]]:
        """Extra task inputs: name -> (KFP parameter type, channel)."""
        return {name: (_type_name(ch), ch) for name, ch in self.channels.items()}


def _type_name(channel: pipeline_channel.PipelineChannel) -> str:
    t = channel.channel_type
    return t if isinstance(t, str) else json.dumps(t)


def has_channels(value: Any) -> bool:
    if isinstance(value, pipeline_channel.PipelineChannel):
        return True
    if isinstance(value, str):
        return bool(_PATTERN.search(value))
    if isinstance(value, Mapping):
        return any(has_channels(k) or has_channels(v) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return any(has_channels(v) for v in value)
    return False


def encode(field: str, value: Any, params: Params) -> Any:
    """``value`` as JSON with placeholders in place of channels: ``{"__kfp_gpu_param__": "p0"}`` for a channel,
    ``{"__kfp_gpu_param__": ["--steps=", {"__kfp_gpu_param__": "p0"}]}`` for a string built from channels.

    Raises:
        InvalidSpec: naming ``train.<field>`` for a value that is neither JSON nor a channel.
    """
    if isinstance(value, pipeline_channel.PipelineChannel):
        return {PARAM: params.name_of(field, value)}
    if isinstance(value, str):
        if not _PATTERN.search(value):
            return value
        parts: list[Any] = []
        pos = 0
        for m in _PATTERN.finditer(value):
            if m.start() > pos:
                parts.append(value[pos:m.start()])
            ch = pipeline_channel.extract_pipeline_channels_from_string(m.group(0))[0]
            parts.append({PARAM: params.name_of(field, ch)})
            pos = m.end()
        if pos < len(value):
            parts.append(value[pos:])
        return {PARAM: parts}
    if value is None or isinstance(value, (bool, int, float)):
        return value
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for k, v in value.items():
            if not isinstance(k, str) or has_channels(k):
                raise InvalidSpec(f"train.{field}", k, "keys must be plain strings fixed at compile time")
            out[k] = encode(f"{field}.{k}", v, params)
        return out
    if isinstance(value, (list, tuple)):
        return [encode(f"{field}[{i}]", v, params) for i, v in enumerate(value)]
    raise InvalidSpec(f"train.{field}", f"{type(value).__name__} object",
                      "is not JSON-serialisable (strings, numbers, booleans, lists and dicts, or pipeline parameters "
                      "and task outputs)", remediation=f"pass {field} as plain values")


def whole_collection(value: Any) -> bool:
    """A single channel carrying a list or dict (``args=pipeline_list_param``): it replaces the whole field."""
    return isinstance(value, pipeline_channel.PipelineParameterChannel) and _type_name(value) in ("List", "Dict")


def check_plain(field: str, value: Any) -> None:
    """A job field without channels must be JSON or an OpenAPI model (``to_dict``).

    Raises:
        InvalidSpec: naming ``train.<field>`` otherwise.
    """
    if hasattr(value, "to_dict") and callable(value.to_dict):
        return
    encode(field, value, Params())


def with_inputs(component: base_component.BaseComponent, extra: Mapping[str, str]) -> base_component.BaseComponent:
    """A copy of ``component`` with extra parameter inputs (name -> KFP type); the original is untouched.

    The component body reads them from its executor input (:func:`kfp_gpu.runtime.executor_parameters`).
    """
    if not extra:
        return component
    variant = copy.copy(component)
    spec = copy.deepcopy(component.component_spec)
    spec.inputs = dict(spec.inputs or {})
    for name, kind in extra.items():
        spec.inputs[name] = structures.InputSpec(type=kind)
    variant.component_spec = spec
    variant._component_inputs = set(component._component_inputs) | set(extra)  # noqa: SLF001 - see BaseComponent
    return variant
