"""The one entry point every KFP component calls.

It parses the spec (a malformed spec fails the step with ``InvalidSpec``, not a deep traceback), turns
SIGTERM/SIGINT into :class:`~kfp_gpu.errors.Cancelled` raised in the step so its ``finally`` blocks clean
up, writes the HTML report and the metrics, and maps errors to exit codes. A cancelled step never exits 0.
"""

from __future__ import annotations

import html
import importlib
import json
import signal
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from types import FrameType
from typing import Any, Protocol

from kfp_gpu import runtime as runtime_values
from kfp_gpu.errors import Cancelled, InvalidSpec, KfpGpuError
from kfp_gpu.rehearsal_seam import world_time_scale
from kfp_gpu.spec import ProvisioningSpec
from kfp_gpu.steps.result import StepResult, in_world_time

STEPS: dict[str, str] = {
    "preflight": "kfp_gpu.steps.preflight_step:run",
    "warm_pool": "kfp_gpu.steps.warm_pool:run",
    "scale_up": "kfp_gpu.steps.scale_up:run",
    "train": "kfp_gpu.steps.train:run",
    "teardown": "kfp_gpu.steps.teardown:run",
}


class _Metrics(Protocol):
    def log_metric(self, metric: str, value: float) -> None: ...


class _Artifact(Protocol):
    path: str


def resolve(step: str) -> Callable[..., StepResult]:
    """Raises: InvalidSpec for an unknown step name."""
    if step not in STEPS:
        raise InvalidSpec("step", step, f"known steps: {', '.join(STEPS)}")
    module, func = STEPS[step].split(":")
    fn: Callable[..., StepResult] = getattr(importlib.import_module(module), func)
    return fn


@contextmanager
def cancellable(step: str) -> Iterator[None]:
    """Turn SIGTERM/SIGINT into ``Cancelled`` in the main thread for the duration of the block."""

    def handler(signum: int, frame: FrameType | None) -> None:
        raise Cancelled(f"step {step} cancelled by signal {signal.Signals(signum).name}",
                        remediation="nothing to do: the step cleaned up what it had started", signal=signum)

    old = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def _inputs(step: str, spec_json: str, run_id: str, runtime: Mapping[str, Any] | None,
            kwargs: dict[str, Any]) -> ProvisioningSpec:
    """The spec with the run-time values (``runtime``: the task's executor-input parameters) applied, and the
    job's filled in (``kwargs['job_json']``, in place). Teardown falls back to the compiled spec when the run-time
    values are invalid (the run failed in preflight; what it made is released anyway). Raises: InvalidSpec."""
    if spec_json == "__kfp_gpu_unprovisioned__":
        raise InvalidSpec("pipeline", "train()", "this pipeline was compiled without @kfp_gpu.provisioned(spec)",
                          remediation="decorate the pipeline with @kfp_gpu.provisioned(spec) and recompile")
    overrides, values = runtime_values.split(runtime or {})
    try:
        spec = runtime_values.resolve_spec(spec_json, overrides)
    except InvalidSpec:
        if step != "teardown" or not overrides:
            raise
        spec = ProvisioningSpec.from_json(spec_json)
    if "job_json" in kwargs:
        kwargs["job_json"] = runtime_values.resolve_job(kwargs["job_json"], kwargs.pop("job_runtime_json", ""), values)
    if not run_id:
        raise InvalidSpec("run_id", run_id, "must be the pipeline run id (dsl.PIPELINE_JOB_ID_PLACEHOLDER)")
    return spec


def _classified(fn: Callable[[], StepResult], step: str) -> StepResult:
    """``fn()``; a Kubernetes API or transport error that reaches here leaves as a classified one-line error
    (:func:`kfp_gpu.cluster.apierrors.to_error`: an RBAC refusal, transient 429/5xx/timeout, 404...), not a traceback.
    Anything else (a bug) raises as it is."""
    try:
        return fn()
    except Exception as exc:
        from kfp_gpu.cluster import apierrors

        if isinstance(exc, KfpGpuError) or apierrors.classify(exc) is None:
            raise
        raise apierrors.to_error(exc, f"step {step}") from None


def run_step(
    step: str, spec_json: str, run_id: str, upstream_json: str, *, runtime: Mapping[str, Any] | None = None,
    **kwargs: Any,
) -> StepResult:
    """Run one step function in this process, with this process's identity: what the controller's work units
    (:mod:`kfp_gpu.controller.work`) do. Its metrics leave in the world's clock (:func:`in_world_time`: a
    rehearsal compresses time; a real cluster's factor is 1.0). Raises: KfpGpuError."""
    spec = _inputs(step, spec_json, run_id, runtime, kwargs)
    fn = resolve(step)
    with cancellable(step):
        result = _classified(lambda: fn(spec, run_id, upstream_json, **kwargs), step)
    # read after the step, not before: a malformed factor must not keep teardown from releasing what the run holds
    return in_world_time(result, world_time_scale())


def request_step(
    step: str, spec_json: str, run_id: str, *, runtime: Mapping[str, Any] | None = None, **kwargs: Any,
) -> StepResult:
    """What a component does: write the step's intent into the run's GpuGang (namespaced rights only) and wait for
    the controller's answer (:mod:`kfp_gpu.gang.client`). Raises: KfpGpuError."""
    from kfp_gpu.cluster.kube import api_client
    from kfp_gpu.gang import client as gang_client

    spec = _inputs(step, spec_json, run_id, runtime, kwargs)
    resolve(step)
    with cancellable(step):
        api = api_client(spec.target)
        try:
            return _classified(lambda: gang_client.request(step, spec, spec.to_json(), run_id, api, **kwargs), step)
        finally:
            api.close()


def run_component(
    step: str, spec_json: str, run_id: str, upstream_json: str, *,
    report: _Artifact | None = None, metrics: _Metrics | None = None, **kwargs: Any,
) -> str:
    """Component body: run the step with the run-time inputs of its executor input (``sys.argv``), publish its
    report and metrics, exit non-zero on error."""
    try:
        params = runtime_values.executor_parameters(sys.argv)
        result = request_step(step, spec_json, run_id, runtime=params, **kwargs)
    except KfpGpuError as err:
        print(f"kfp-gpu {step} failed: {err}", file=sys.stderr)
        print(json.dumps({"error": err.to_dict()}), file=sys.stderr)
        if report is not None:
            _write(report.path, _page(f"kfp-gpu {step}: failed", f"{err}"))
        raise SystemExit(err.exit_code) from None
    print(result.markdown)
    if report is not None:
        _write(report.path, result.html or _page(f"kfp-gpu {step}", result.markdown))
    if metrics is not None:
        for key, value in sorted(result.metrics.items()):
            metrics.log_metric(key, float(value))
    return result.output_json


def _page(title: str, body: str) -> str:
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title></head>"
            f"<body><h1>{html.escape(title)}</h1><pre>{html.escape(body)}</pre></body></html>")


def _write(path: str, text: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
