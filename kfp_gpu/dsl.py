"""``@kfp_gpu.provisioned(spec)`` and the ``kfp_gpu.train(...)`` task factory.

The decorator builds this DAG around the user's pipeline body::

    ExitHandler(teardown) {
      preflight -> warm_pool -> scale_up --+
      user data steps ---------------------+--> train (PyTorchJob) --> user eval steps
    }

The user's body is called *inline* inside the exit handler, so user steps that do not depend on
``train()`` have no edge to any provisioning task and start in parallel with provisioning. Only the
tasks ``train()`` creates depend on ``scale_up``. Teardown finds everything by run-id label (exit
tasks cannot take inputs from other tasks).

Two compile targets exist: ``kfp`` (default; adds kfp-kubernetes pod labels and annotations) and
``vertex`` (a single-document YAML with no kubernetes platform config, which Vertex AI requires).

Every kfp-gpu task carries a KFP retry policy (:data:`RETRIES`): a step pod that is evicted or dies is
started again with the same run id, and the step re-attaches to what its first pod made (ledger, claims,
job by deterministic name). On the ``kfp`` target the step pods also carry
``cluster-autoscaler.kubernetes.io/safe-to-evict: "false"`` so the cluster-autoscaler never drains the node a
supervisor runs on; Vertex AI's single-document YAML has no place for pod annotations (docs/user-guide.md).
"""

from __future__ import annotations

import contextlib
import inspect
import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kfp import dsl
from kfp.dsl import base_component, graph_component

from kfp_gpu import channels
from kfp_gpu.errors import InvalidSpec
from kfp_gpu.job import DEFAULT_TRAINER_IMAGE, JobTemplate
from kfp_gpu.ownership import COMPONENT_LABEL, LABEL_MANAGED
from kfp_gpu.runtime import RUNTIME_FIELDS, SPEC_INPUT, check_runtime_fields, parameter_default, python_type
from kfp_gpu.spec import ProvisioningSpec

TARGETS = ("kfp", "vertex")
_ATTR = "_kfp_gpu"
UNPROVISIONED = "__kfp_gpu_unprovisioned__"  # spec_json of a train() built without the decorator
SAFE_TO_EVICT = "cluster-autoscaler.kubernetes.io/safe-to-evict"


@dataclass(frozen=True)
class Retry:
    """A KFP retry policy (``PipelineTask.set_retry``); ``max_duration`` bounds the window, from the first try."""

    retries: int
    backoff: str
    factor: float
    max_duration: str


# Argo ends retrying once max_duration has passed since the first attempt started, so train's window
# covers multi-day runs. Preflight is read-only; the others re-attach by run id (idempotent).
RETRIES: dict[str, Retry] = {
    "quota preflight": Retry(2, "10s", 2.0, "1800s"),
    "warm pool": Retry(3, "15s", 2.0, "3600s"),
    "burst scale-up": Retry(3, "30s", 2.0, "7200s"),
    "train": Retry(3, "30s", 2.0, f"{30 * 86400}s"),
    "teardown": Retry(5, "15s", 2.0, "3600s"),
}


@dataclass
class _Context:
    spec: ProvisioningSpec
    target: str
    run_id: str
    scale_up: dsl.PipelineTask
    runtime: dict[str, Any] = field(default_factory=dict)  # run-time spec field -> its pipeline parameter
    trains: list[dsl.PipelineTask] = field(default_factory=list)


_STACK: list[_Context] = []
__all__ = ["DEFAULT_TRAINER_IMAGE", "JobTemplate", "build", "for_target", "provisioned", "resolved_spec", "spec_of",
           "train"]


def train(
    *,
    name: str | None = None,
    image: Any = None,
    command: Any = None,
    args: Any = None,
    env: Any = None,
    dataset: Any = None,
    after: Sequence[dsl.PipelineTask] = (),
    checkpoint_every: Any = None,
    job: Any = None,
    queue_timeout_s: float | None = None,
    **job_fields: Any,
) -> dsl.PipelineTask:
    """Create the training step inside a ``@kfp_gpu.provisioned`` pipeline: a PyTorchJob, or with
    ``kind="trainjob"`` a Kubeflow Trainer v2 TrainJob on ``runtime`` (default ``torch-distributed``, a
    ClusterTrainingRuntime; ``runtime_kind="TrainingRuntime"`` for a namespaced one). See :mod:`kfp_gpu.jobkinds`.

    It depends on burst scale-up and on its data inputs (``dataset`` artifact, ``after`` tasks) only. Every
    job field (``image``, ``command``, ``args``, ``env`` values and the other ``job_fields``) may hold pipeline
    parameters and upstream task outputs, or strings built from them (``f"--steps={steps}"``): they are
    resolved when the step runs, never serialised at compile time (:mod:`kfp_gpu.channels`). Fields without
    them are validated here; fields with them are validated by the train step once the values are known.
    ``job`` takes a ``kubeflow.training`` PyTorchJob model or a ``kubeflow`` SDK TrainJob model
    (``kubeflow_trainer_api.models.TrainerV1alpha1TrainJob``); the other fields apply over it.
    ``queue_timeout_s``: how long the job may wait for admission in its Kueue queue (default 3600 s).

    Raises:
        InvalidSpec: called outside a provisioned pipeline, a bad job template field (incl. ``kind``, ``runtime``,
            ``runtime_kind`` and fields a TrainJob cannot carry), a value that is neither
            JSON nor a pipeline parameter/task output, a channel in ``name`` (it names the task), or a
            ``queue_timeout_s`` that is not a positive number.
    """
    from kfp.dsl import pipeline_context

    from kfp_gpu import components

    if not _STACK and pipeline_context.Pipeline.get_default_pipeline() is not None:
        # Being built by a @dsl.pipeline under @kfp_gpu.provisioned: that inner graph is thrown away
        # and rebuilt by the decorator. Used without the decorator, the step refuses to run.
        return components.train_pytorchjob(
            spec_json=UNPROVISIONED, run_id="", capacity_json="", job_json="{}",
        )
    if not _STACK:
        raise InvalidSpec(
            "kfp_gpu.train", name, "must be called inside a pipeline decorated with @kfp_gpu.provisioned(spec)",
            remediation="decorate the pipeline function with @kfp_gpu.provisioned(spec)",
        )
    if channels.has_channels(name):
        raise InvalidSpec("train.name", str(name), "names the task, so it is fixed at compile time",
                          remediation="pass a literal name; pass run-time values in args, env or other job fields")
    ctx = _STACK[-1]
    given = {"name": name, "image": image, "command": command, "args": args, "env": env,
             "checkpoint_every": checkpoint_every, **job_fields}
    fields = {k: v for k, v in given.items() if v is not None}
    params = channels.Params()
    encoded: dict[str, Any] = {}
    whole: dict[str, Any] = {}  # a list/dict parameter standing for a whole field: filled in at run time
    for key, value in fields.items():
        if channels.whole_collection(value):
            whole[key] = channels.encode(key, value, params)
        elif channels.has_channels(value):
            encoded[key] = channels.encode(key, value, params)
        else:
            channels.check_plain(key, value)
            encoded[key] = value
    template = JobTemplate.build(job=job, **encoded)
    kwargs: dict[str, Any] = dict(
        spec_json=ctx.spec.to_json(), run_id=ctx.run_id, capacity_json=ctx.scale_up.outputs["Output"],
        job_json=template.to_json(),
    )
    if whole:
        kwargs["job_runtime_json"] = json.dumps(whole, sort_keys=True)
    if dataset is not None:
        kwargs["dataset"] = dataset
    if queue_timeout_s is not None:
        from kfp_gpu.steps.admission import check_timeout

        check_timeout(queue_timeout_s)
        kwargs["queue_timeout_s"] = float(queue_timeout_s)
    task = _call(components.train_pytorchjob, ctx.runtime, params.inputs(), **kwargs)
    task.set_display_name(name or "train")
    task.set_caching_options(False)
    for t in after:
        task.after(t)
    _platform(task, ctx.target, "train")
    ctx.trains.append(task)
    return task


def _call(
    component: Any, runtime: Mapping[str, Any], params: Mapping[str, tuple[str, Any]], **kwargs: Any,
) -> dsl.PipelineTask:
    """Call a kfp-gpu component with its run-time inputs: ``spec__<field>`` for each run-time spec field
    (bound to the pipeline parameter) and ``pN`` for each channel of the job."""
    extra = {f"{SPEC_INPUT}{k}": (RUNTIME_FIELDS[k], ch) for k, ch in runtime.items()}
    extra.update(params)
    variant = channels.with_inputs(component, {k: kind for k, (kind, _) in extra.items()})
    task: dsl.PipelineTask = variant(**kwargs, **{k: ch for k, (_, ch) in extra.items()})
    return task


def provisioned(
    spec: ProvisioningSpec, *, name: str | None = None, description: str | None = None, target: str = "kfp",
    runtime: Sequence[str] = (),
) -> Callable[[Any], graph_component.GraphComponent]:
    """Wrap a ``@dsl.pipeline`` (or plain pipeline function) with latency-aware GPU provisioning.

    ``runtime`` names spec fields chosen when the pipeline is run (``nodes``, ``accelerator``,
    ``gpus_per_node``, ``capacity``, ``zones``, ``scale_up_deadline_s``, ``reservation``, ``checkpoint_uri``):
    each becomes a pipeline parameter of that name whose default is the spec's value (the Kubeflow UI run
    form, Vertex ``parameter_values``). Every kfp-gpu step runs with the spec those values resolve to; quota
    preflight validates it first, with the same messages as a bad value in the Python spec.

    Raises:
        InvalidSpec: ``spec`` is not a ProvisioningSpec, the target is unknown, ``runtime`` names an unknown
            field or one the pipeline already has as a parameter, the pipeline returns outputs (an ExitHandler
            cannot return pipeline outputs), it already uses an ExitHandler, or it never calls ``kfp_gpu.train``.
    """
    if not isinstance(spec, ProvisioningSpec):
        raise InvalidSpec("spec", type(spec).__name__, "must be a kfp_gpu.ProvisioningSpec")
    if target not in TARGETS:
        raise InvalidSpec("target", target, f"allowed: {', '.join(TARGETS)}")
    fields = check_runtime_fields(runtime)

    def decorate(pipeline: Any) -> graph_component.GraphComponent:
        func, pname, pdesc = _unwrap(pipeline)
        info = (spec, func, name or pname, description or pdesc, fields)
        built = build(spec, func, name=info[2], description=info[3], target=target, runtime=fields)
        setattr(built, _ATTR, info)
        return built

    return decorate


def build(
    spec: ProvisioningSpec, func: Callable[..., Any], *, name: str, description: str | None, target: str,
    runtime: Sequence[str] = (),
) -> graph_component.GraphComponent:
    """Build the provisioned pipeline for one compile target. Raises: InvalidSpec (see provisioned)."""
    from kfp_gpu import components

    sig = inspect.signature(func)
    if sig.return_annotation not in (inspect.Signature.empty, None, type(None)):
        raise InvalidSpec(
            "pipeline return", sig.return_annotation,
            "a provisioned pipeline cannot return outputs (KFP ExitHandlers cannot return pipeline outputs)",
            remediation="write results to artifacts of the final step instead of returning them",
        )
    for field_name in runtime:
        if field_name in sig.parameters:
            raise InvalidSpec(
                "runtime", field_name, f"pipeline {name!r} already has a parameter of that name",
                remediation=f"rename the pipeline's own {field_name!r} parameter or drop it from runtime=",
            )
    user_params = list(sig.parameters.values())
    rt_params = [inspect.Parameter(f, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=parameter_default(spec, f),
                                   annotation=python_type(f)) for f in runtime]

    def outer(*args: Any) -> None:
        user_args, rt = args[:len(user_params)], dict(zip(runtime, args[len(user_params):], strict=True))
        spec_json, run_id = spec.to_json(), dsl.PIPELINE_JOB_ID_PLACEHOLDER
        td = _call(components.teardown, rt, {}, spec_json=spec_json, run_id=run_id)
        td.set_display_name("kfp-gpu teardown").set_caching_options(False)
        _platform(td, target, "teardown")
        with dsl.ExitHandler(td, name="kfp-gpu-provisioned"):
            pf = _call(components.quota_preflight, rt, {}, spec_json=spec_json, run_id=run_id)
            wp = _call(components.reserve_warm_pool, rt, {}, spec_json=spec_json, run_id=run_id,
                       preflight_json=pf.outputs["Output"])
            su = _call(components.burst_scale_up, rt, {}, spec_json=spec_json, run_id=run_id,
                       warm_pool_json=wp.outputs["Output"])
            for task, label in ((pf, "quota preflight"), (wp, "warm pool"), (su, "burst scale-up")):
                task.set_display_name(f"kfp-gpu {label}").set_caching_options(False)
                _platform(task, target, label)
            ctx = _Context(spec, target, run_id, su, rt)
            with _pushed(ctx):
                func(*user_args)
            if not ctx.trains:
                raise InvalidSpec(
                    "pipeline", name, "never calls kfp_gpu.train(...), so nothing would use the GPUs",
                    remediation="create the training step with kfp_gpu.train(...) inside the pipeline",
                )

    outer.__signature__ = sig.replace(  # type: ignore[attr-defined,unused-ignore]
        parameters=user_params + rt_params, return_annotation=inspect.Signature.empty)
    outer.__name__ = func.__name__
    outer.__doc__ = func.__doc__
    outer.__annotations__ = {
        **{k: v for k, v in func.__annotations__.items() if k != "return"},
        **{p.name: p.annotation for p in rt_params},
    }
    try:
        return dsl.pipeline(name=name, description=description)(outer)
    except InvalidSpec:
        raise
    except Exception as exc:
        if "ExitHandler" in str(exc) or "exit handler" in str(exc).lower():
            raise InvalidSpec(
                "pipeline", name, f"already uses an ExitHandler, which KFP allows only at the outermost scope ({exc})",
                remediation="remove the pipeline's own dsl.ExitHandler; kfp-gpu's teardown is the exit handler",
            ) from None
        raise


def for_target(pipeline: graph_component.GraphComponent, target: str) -> graph_component.GraphComponent:
    """The same provisioned pipeline built for another compile target. Raises: InvalidSpec."""
    info = getattr(pipeline, _ATTR, None)
    if info is None:
        raise InvalidSpec("pipeline", getattr(pipeline, "name", pipeline), "is not decorated with @kfp_gpu.provisioned")
    if target not in TARGETS:
        raise InvalidSpec("target", target, f"allowed: {', '.join(TARGETS)}")
    spec, func, name, desc, runtime = info
    built = build(spec, func, name=name, description=desc, target=target, runtime=runtime)
    setattr(built, _ATTR, info)
    return built


def spec_of(pipeline: Any) -> ProvisioningSpec | None:
    info = getattr(pipeline, _ATTR, None)
    if info is None:
        return None
    spec: ProvisioningSpec = info[0]
    return spec


def resolved_spec(pipeline: Any, arguments: Mapping[str, Any]) -> ProvisioningSpec | None:
    """The spec a run of ``pipeline`` with ``arguments`` (pipeline parameter values) provisions: the decorated
    spec with the ``runtime=`` fields found in ``arguments`` applied. ``None`` for an undecorated pipeline.

    Raises:
        InvalidSpec: an argument makes the spec invalid (named, as preflight would say).
    """
    info = getattr(pipeline, _ATTR, None)
    if info is None:
        return None
    spec: ProvisioningSpec = info[0]
    from kfp_gpu.runtime import resolve_spec

    return resolve_spec(spec.to_json(), {k: arguments[k] for k in info[4] if k in arguments})


def _unwrap(pipeline: Any) -> tuple[Callable[..., Any], str, str | None]:
    if isinstance(pipeline, graph_component.GraphComponent):
        spec = pipeline.component_spec
        return pipeline.pipeline_func, spec.name, spec.description
    if isinstance(pipeline, base_component.BaseComponent):
        raise InvalidSpec("pipeline", pipeline.name, "is a component, not a pipeline function",
                          remediation="decorate a @dsl.pipeline function")
    if not callable(pipeline):
        raise InvalidSpec("pipeline", pipeline, "must be a function")
    return pipeline, pipeline.__name__.replace("_", "-"), inspect.getdoc(pipeline)


@contextlib.contextmanager
def _pushed(ctx: _Context) -> Iterator[None]:
    _STACK.append(ctx)
    try:
        yield
    finally:
        _STACK.pop()


def _platform(task: dsl.PipelineTask, target: str, label: str) -> None:
    """The retry policy on every target; kfp target only: pod labels for the janitor/RBAC and the
    cluster-autoscaler annotation (vertex gets no kubernetes platform config)."""
    r = RETRIES[label]
    task.set_retry(num_retries=r.retries, backoff_duration=r.backoff, backoff_factor=r.factor,
                   backoff_max_duration=r.max_duration)
    if target != "kfp":
        return
    from kfp import kubernetes

    kubernetes.add_pod_label(task, LABEL_MANAGED, "true")
    kubernetes.add_pod_label(task, COMPONENT_LABEL, label.replace(" ", "-"))
    kubernetes.add_pod_annotation(task, SAFE_TO_EVICT, "false")
