"""`kfp-gpu run PIPELINE.py` and `make demo`: rehearse a provisioned pipeline end to end on the local GKE.

Boots (or reuses) the local control plane, starts the GKE stand-in on it, runs the file's
``@kfp_gpu.provisioned`` pipeline with kfp.local's SubprocessRunner (``--arg k=v`` values become pipeline
arguments, typed by the pipeline's signature), then prints the provisioning timeline, the cost-risk
report and proof that nothing of the run is left. The terminal gets one progress line per step; kfp.local's
own logs (executor inputs and outputs, step logs) go to a file whose path is printed.
``kfp-gpu demo`` is ``kfp-gpu run pipelines/llm_finetune.py``.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

from kfp_gpu import rehearsal_seam
from kfp_gpu.errors import InvalidSpec, KfpGpuError
from kfp_gpu.report._common import duration
from kfp_gpu.spec import ProvisioningSpec
from kfp_gpu.timeline import Timeline
from kfp_gpu_rehearsal.leftovers import leftovers, release_leftover_gangs, run_of, teardown_output

EXAMPLE = Path(__file__).resolve().parent.parent / "pipelines" / "llm_finetune.py"
LOG_NAME = "executor.log"
_TRUE, _FALSE = {"true", "1", "yes", "on"}, {"false", "0", "no", "off"}
_JSON_TYPES: dict[str, type] = {"List": list, "Dict": dict}


# ---- pipeline arguments -------------------------------------------------------------------------------
def _convert(name: str, kind: str, raw: str) -> Any:
    """``raw`` as the pipeline parameter type ``kind`` (KFP IR names: Integer, Float, Boolean, String, ...).

    Raises: InvalidSpec naming ``--arg name``, the value and the expected type.
    """
    field = f"--arg {name}"
    try:
        if kind == "Integer":
            return int(raw)
        if kind == "Float":
            return float(raw)
        if kind == "Boolean":
            if raw.lower() in _TRUE | _FALSE:
                return raw.lower() in _TRUE
            raise ValueError(raw)
        if kind == "String":
            return raw
        if kind in _JSON_TYPES:
            value = json.loads(raw)
            if not isinstance(value, _JSON_TYPES[kind]):
                raise ValueError(raw)
            return value
    except ValueError:
        example = {"Integer": "an integer, e.g. 3", "Float": "a number, e.g. 0.5", "Boolean": "true or false",
                   "List": 'a JSON list, e.g. ["a", "b"]', "Dict": 'a JSON object, e.g. {"k": 1}'}[kind]
        raise InvalidSpec(field, raw, f"must be {example} (the pipeline declares it {kind})",
                          remediation=f"pass --arg {name}=<{kind.lower()}>") from None
    raise InvalidSpec(field, raw, f"is an input of type {kind}; kfp-gpu run passes parameters only",
                      remediation="give the input a default, or turn it into a parameter (int, float, bool, str, list, dict)")


def typed_args(pairs: Sequence[str], inputs: Mapping[str, Any], pipeline: str) -> dict[str, Any]:
    """``["k=v", ...]`` -> ``{k: typed v}`` for a pipeline whose root inputs are ``inputs`` (name -> KFP
    ``InputSpec`` with ``type``, ``default`` and ``optional``).

    Raises:
        InvalidSpec: a pair without ``=``, a name given twice or not a parameter of the pipeline (the
            message lists the parameters), a value of the wrong type, or a required parameter missing.
    """
    params = ", ".join(f"{n}:{getattr(s, 'type', '?')}" for n, s in sorted(inputs.items())) or "(none)"
    out: dict[str, Any] = {}
    for pair in pairs:
        name, sep, raw = pair.partition("=")
        name = name.strip()
        if not sep or not name:
            raise InvalidSpec("--arg", pair, "must be NAME=VALUE", remediation=f"parameters of {pipeline}: {params}")
        if name not in inputs:
            raise InvalidSpec("--arg", name, f"is not a parameter of pipeline {pipeline}",
                              remediation=f"use one of: {params}")
        if name in out:
            raise InvalidSpec("--arg", name, "is given twice", remediation="pass each parameter once")
        out[name] = _convert(name, str(getattr(inputs[name], "type", "String")), raw)
    missing = sorted(n for n, s in inputs.items()
                     if n not in out and not getattr(s, "optional", False) and getattr(s, "default", None) is None)
    if missing:
        raise InvalidSpec("--arg", ", ".join(missing), f"required by pipeline {pipeline} (no default)",
                          remediation=" ".join(f"--arg {n}=VALUE" for n in missing))
    return out


def load(pipeline_file: str | Path, name: str | None = None) -> Any:
    """The provisioned pipeline of ``pipeline_file`` (see :func:`kfp_gpu.compile.load_pipeline`).

    Raises:
        InvalidSpec: no such file, no (or an undecorated) pipeline, several without ``name``, or the
            file fails to import (named with its first error line).
    """
    from kfp_gpu.compile import load_pipeline

    return load_pipeline(pipeline_file, name)


# ---- the terminal: progress lines while kfp.local writes its logs to a file ----------------------------
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_STARTED = re.compile(r"Executing task '([^']+)'")
_FINISHED = re.compile(r"Task '([^']+)' finished with status (\w+)")
_RUN_ID = re.compile(r'"run_id":\s*"([^"]+)"')
_IMAGE = re.compile(r"kfp-gpu-image: (.+)$")  # kfp_gpu_rehearsal.devcluster.containers.MARK


class Progress(io.TextIOBase):
    """A stdout stand-in for kfp.local: every byte goes to ``log``; task start/finish lines become one
    progress line each on ``terminal``, its duration in the world's clock (``scale`` real-world seconds per
    second); the first run id of a kfp-gpu step is remembered, and so is the error a failed kfp-gpu step printed (its
    ``{"error": ...}`` line), which is shown under the task's failure line."""

    def __init__(self, log: TextIO, terminal: TextIO, clock: Callable[[], float] = time.monotonic,
                 scale: float = 1.0) -> None:
        super().__init__()
        self.log, self.terminal, self.clock, self.scale = log, terminal, clock, scale
        self.started: dict[str, float] = {}
        self.finished: dict[str, str] = {}
        self.run_id = ""
        self.step_errors: dict[str, str] = {}  # task -> the one-line error its step printed
        self._shown: dict[str, str] = {}
        self._partial = ""

    def writable(self) -> bool:
        return True

    def write(self, s: str) -> int:
        self.log.write(s)
        lines = (self._partial + s).split("\n")
        self._partial = lines.pop()
        for line in lines:
            self._line(_ANSI.sub("", line))
        return len(s)

    def flush(self) -> None:
        self.log.flush()

    def _line(self, line: str) -> None:
        if m := _STARTED.search(line):
            self.started[m.group(1)] = self.clock()
            self._say(f"  > {m.group(1)} started")
        elif m := _FINISHED.search(line):
            task, status = m.group(1), m.group(2)
            now = self.clock()
            took = now - self.started.get(task, now)
            self.finished[task] = status
            verb = "finished" if status == "SUCCESS" else f"failed ({status})"
            self._say(f"  {'✓' if status == 'SUCCESS' else '✗'} {task} {verb} in {duration(took * self.scale)}")
            why = self.step_errors.get(task, "")
            if status != "SUCCESS" and why and self._shown.get(task) != why:
                self._shown[task] = why
                self._say(f"    {why}")
        elif self.started and (why := _step_error(line)):
            self.step_errors[list(self.started)[-1]] = why
        elif self.started and (m := _IMAGE.search(line)):
            self._say(f"    {list(self.started)[-1]} runs in {m.group(1)}")
        elif not self.run_id and (m := _RUN_ID.search(line)):
            self.run_id = m.group(1)

    def _say(self, text: str) -> None:
        print(text, file=self.terminal, flush=True)


def _step_error(line: str) -> str:
    """The one-line error of a kfp-gpu step's ``{"error": {...}}`` line (``KfpGpuError.to_dict``, read back with
    ``from_dict``: message and fix), or ""."""
    text = line.strip()
    if not text.startswith('{"error"'):
        return ""
    try:
        return str(KfpGpuError.from_dict(json.loads(text)["error"]))
    except (ValueError, KeyError, TypeError, AttributeError):
        return ""


def _to(log: TextIO) -> Callable[..., None]:
    def show(message: Warning | str, category: type[Warning], filename: str, lineno: int,
             file: TextIO | None = None, line: str | None = None) -> None:
        log.write(warnings.formatwarning(message, category, filename, lineno, line))
    return show


# ---- the rehearsal ---------------------------------------------------------------------------------------
def extras_for(spec: ProvisioningSpec) -> tuple[str, ...]:
    """The optional local-cluster components (:mod:`kfp_gpu_rehearsal.devcluster.extras` names) a rehearsal of ``spec``
    needs: ``gcs`` (fake-gcs-server) for a ``gs://`` checkpoint_uri, ``karpenter`` (Karpenter's kwok provider) for
    ``target.provisioner="karpenter"``. Pure; raises nothing."""
    return tuple(name for name, needed in (
        ("gcs", spec.checkpoint_uri.startswith("gs://")),
        ("karpenter", spec.target.provisioner == "karpenter"),
    ) if needed)


def aws_standin_port(spec: ProvisioningSpec) -> int | None:
    """The port of the AWS stand-in an EKS target's ``endpoint`` names on this machine (``http://127.0.0.1:PORT``
    or ``localhost``), which the rehearsal starts; None for other targets or a real AWS endpoint. Pure; raises
    nothing (an endpoint without a port is the stand-in's default, 8788)."""
    from urllib.parse import urlsplit

    from kfp_gpu.spec import TargetKind

    if spec.target.kind is not TargetKind.EKS or not spec.target.endpoint:
        return None
    url = urlsplit(spec.target.endpoint)
    if url.scheme != "http" or url.hostname not in ("127.0.0.1", "localhost"):
        return None
    try:
        return url.port or 8788
    except ValueError:
        return None


def run(pipeline_file: str | Path, args: Sequence[str] = (), *, pipeline: str | None = None,
        scenario: str | None = None, keep: bool = True, terminal: TextIO | None = None, containers: bool = False) -> int:
    """Rehearse the provisioned pipeline of ``pipeline_file`` locally; returns the process exit code
    (0: succeeded, timeline recorded, nothing left behind). The local cluster stays up unless ``keep=False``.
    ``containers``: the kfp-gpu steps run in the locally built component image (:mod:`kfp_gpu_rehearsal.devcluster.containers`).

    Raises:
        InvalidSpec: see :func:`load`, :func:`typed_args` and the scenario's
            :func:`kfp_gpu_rehearsal.sim.scenario.load` (all checked before anything boots).
        KfpGpuError: the local cluster or the stand-in cannot start.
    """
    from kfp import local

    from kfp_gpu.dsl import resolved_spec, spec_of
    from kfp_gpu.gang import api as gang_api
    from kfp_gpu.gang.client import OWNER_PID_ENV
    from kfp_gpu.report._common import world
    from kfp_gpu.report.cost import cost_report
    from kfp_gpu.report.terminal import cost_table, gantt
    from kfp_gpu_rehearsal import run_services as served
    from kfp_gpu_rehearsal.devcluster import boot, controller, crds
    from kfp_gpu_rehearsal.devcluster.worldtime import TIME_SCALE
    from kfp_gpu_rehearsal.sim import scenario as scenario_mod
    from kfp_gpu_rehearsal.sim.server import SimServer

    out_ = terminal or sys.stdout
    say: Callable[[str], None] = lambda text: print(text, file=out_, flush=True)  # noqa: E731
    ctr = None
    if containers:  # before load(): the kfp-gpu components must compile with the local image
        from kfp_gpu_rehearsal.devcluster import containers as ctr_mod

        ctr = ctr_mod.prepare()
    graph = load(pipeline_file, pipeline)
    spec: ProvisioningSpec | None = spec_of(graph)
    assert spec is not None  # load() returns provisioned pipelines only
    if ctr is not None:
        ctr.mount_checkpoint(spec.checkpoint_uri)
    arguments = typed_args(args, dict(graph.component_spec.inputs or {}), graph.name)
    world_scenario = scenario_mod.load(scenario)
    with contextlib.suppress(InvalidSpec):  # a bad run-time value: preflight fails the run with this message
        spec = resolved_spec(graph, arguments) or spec  # the runtime= fields given as --arg, for the cost table
    shown = ", ".join(f"{k}={v!r}" for k, v in arguments.items()) or "defaults"
    say(f"kfp-gpu run: pipeline {graph.name} from {pipeline_file} ({shown})")
    say("booting (or reusing) the local GKE: etcd, kube-apiserver, scheduler, controller-manager, KWOK, "
        "Training Operator...")
    extras = extras_for(spec)
    if extras:
        say(f"  with {', '.join(extras)} (the spec needs them: see kfp_gpu_rehearsal.demo.extras_for)")
    ctx = boot.up(extras=extras)
    os.environ["KUBECONFIG"] = str(ctx.kubeconfig)
    if "gcs" in extras:
        from kfp_gpu_rehearsal.devcluster import gcs_profile

        os.environ.update(gcs_profile.env())  # STORAGE_EMULATOR_HOST for the steps (kfp.local subprocesses)
    port = aws_standin_port(spec)
    if port is not None:  # the EKS target's endpoint is the AWS stand-in daemon (make cluster-up starts it too)
        from kfp_gpu_rehearsal.sim import daemon

        say(f"AWS (EKS/EC2/Auto Scaling) stand-in on {daemon.start_aws(port)}")
    sim = SimServer(world_scenario, ctx.kubeconfig)
    url = sim.start()
    world_file = served.claim_world(spec.target.cluster, url, sim.stop)  # where the row's controller finds it
    os.environ[rehearsal_seam.SIM_ENDPOINT_ENV] = url
    # the controller, the steps and this report put times and costs in the world's clock
    os.environ[rehearsal_seam.TIME_SCALE_ENV] = f"{TIME_SCALE:g}"
    say(f"the rehearsal world runs {TIME_SCALE:g}x faster than the real one: every time and cost below is in the "
        f"world's clock (one second here = {TIME_SCALE:g} real-world seconds)")
    root = tempfile.mkdtemp(prefix="kfp-gpu-run-")
    log_path = Path(root) / LOG_NAME
    say(f"GKE/Compute stand-in on {url}; node pools become KWOK GPU nodes")
    say(f"executor logs: {log_path}\n")
    ns = spec.target.namespace
    step_kc = controller.prepare_tenant(crds.api_client(ctx.kubeconfig), ns, Path(root),
                                        max_gpus_per_gang=max(64, spec.nodes * spec.gpus_per_node),
                                        max_gpus_per_namespace=max(128, 2 * spec.nodes * spec.gpus_per_node))
    ctl_pid, ctl_log = served.controller(ctx, ns, say)
    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=root, raise_on_error=True)
    t0, failure = time.time(), ""
    admin_kc = os.environ["KUBECONFIG"]
    os.environ.update({"KUBECONFIG": str(step_kc), OWNER_PID_ENV: str(os.getpid())})
    with open(log_path, "w", encoding="utf-8") as log:
        progress = Progress(log, out_, scale=TIME_SCALE)
        try:
            with contextlib.redirect_stdout(progress), warnings.catch_warnings():
                warnings.showwarning = _to(log)  # kfp.local's runner warnings: the log, not the terminal
                with ctr_mod.step_runner(ctr) if ctr is not None else contextlib.nullcontext():
                    graph(**arguments)
        except Exception as exc:  # noqa: BLE001 - kfp.local raises after the exit handler (teardown) ran
            failure = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        finally:
            os.environ["KUBECONFIG"] = admin_kc
            os.environ.pop(OWNER_PID_ENV, None)
            out = teardown_output(root)
            run_id = progress.run_id or run_of(out)
            left: dict[str, list[str]] = {"run id": ["unknown (no kfp-gpu step started)"]}
            try:  # while the controller and the stand-in still run: releases and deletions in flight finish
                admin = crds.api_client(ctx.kubeconfig)
                left_gang = release_leftover_gangs(admin, ns, run_id)
                if left_gang:
                    say(f"the exit handler did not release {left_gang}: the controller released it on deletion")
                if run_id:
                    left = leftovers(admin, ns, run_id, list(out.get("nodes_deleted") or []),  # type: ignore[call-overload]
                                     timeout_s=60.0 + 0.25 * spec.nodes, ledger_home=gang_api.CONTROLLER_NAMESPACE)
            finally:
                try:  # the world ends with the run, and its VMs with it (a scenario's pre-existing nodes too)
                    sim.drop_nodes()
                finally:
                    sim.stop()
                    served.release_world(world_file, url)
    took = time.time() - t0
    status = f"FAILED: {_ANSI.sub('', failure)}" if failure else "SUCCEEDED"
    say(f"\n=== pipeline {graph.name} {status} in {duration(took * TIME_SCALE)} (kfp.local, SubprocessRunner"
        f"{'; kfp-gpu steps in ' + ctr.expected_image + ', podman' if ctr else ''}) ===")
    for task, why in progress.step_errors.items():
        if failure and progress.finished.get(task) != "SUCCESS":
            say(f"{task}: {why}")
    tl = Timeline.from_json(str(out.get("timeline") or "")) if out.get("timeline") else Timeline()
    if tl.nodes:
        world_tl, _ = world(tl)
        say("\nProvisioning timeline (requested -> registered -> Ready -> released):")
        say(gantt(world_tl, width=100))
        say("\nCost-risk report:")
        say(cost_table(cost_report(spec, world_tl), width=100))
    else:
        say(f"no timeline in the teardown output (did the run fail? see {log_path})")
    errors = list(out.get("errors") or [])  # type: ignore[call-overload]
    released = list(out.get("nodes_released") or [])  # type: ignore[call-overload]
    say(f"\nteardown: released {len(released)} nodes, restored pools {out.get('pools_restored') or {}}, "
        f"deleted jobs {out.get('jobs') or []}; errors: {errors or 'none'}")
    what = "GpuGang, ledgers, balloons, node claims, PyTorchJobs/TrainJobs, leases, NodePools, deleted nodes"
    say(f"leak check (run {run_id or '?'}: {what}): " + ("nothing left" if not left else "LEFT BEHIND " + "; ".join(
        f"{k}: {len(v)} ({', '.join(v[:3])}{', ...' if len(v) > 3 else ''})" for k, v in sorted(left.items()))))
    say(f"controller (the dev cluster's, pid {ctl_pid}, still running): peak RSS {controller.peak_rss_mib(ctl_pid):.0f}"
        f" MiB since it started (log {ctl_log})")
    say(f"executor logs: {log_path}\nartifacts and HTML reports: {root}")
    if not keep:
        boot.down()
    return 0 if tl.nodes and not errors and not left and not failure else 1


def main(keep: bool = True) -> int:
    """``kfp-gpu demo``: :func:`run` on the example pipeline. Raises: see :func:`run`."""
    return run(EXAMPLE, keep=keep)
