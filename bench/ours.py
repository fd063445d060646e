"""Ours, as the product runs it: one kfp-gpu controller per bench process, the steps as thin GpuGang clients.

The privileged step functions run inside the controller (docs/architecture.md, "Two halves"). A pipeline step only
creates / patches its run's GpuGang with its namespace's ``kfp-gpu`` ServiceAccount token and waits for the
controller's answer (:func:`kfp_gpu.gang.client.request`); every "ours" side of the bench does exactly that.

:class:`Product` arranges it as ``kfp-gpu run`` and the integration tier do (tests/integration/controller_support.py):
:func:`kfp_gpu_rehearsal.devcluster.controller.prepare` makes the bench namespace a tenant (limits large enough for every
scenario: :data:`MAX_GPUS_PER_GANG`, :data:`MAX_GPUS_PER_NAMESPACE`) and mints the controller's and the step
identity's kubeconfigs; :class:`kfp_gpu_rehearsal.devcluster.controller.LocalController` runs ``kfp-gpu controller
--standalone`` for that namespace under the controller's token. Side processes (bench/peers.py) get the step
kubeconfig's path and call :func:`request` themselves.

The gang's own record (conditions, ``status.outputs``: the capacity JSON with the timeline, the Events the
controller posts with microsecond ``eventTime``) is read with the admin client, never by the step identity.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

MAX_GPUS_PER_GANG = 4096  # 512 nodes x 8: the largest burst N and the 4,096-GPU control-plane scenario
MAX_GPUS_PER_NAMESPACE = 65536  # never the limit: a released gang's GPUs are no longer counted, others may linger


def step_api(step_kubeconfig: str | Path) -> client.ApiClient:
    """An ApiClient with the tenant step identity's token only (what a component pod has)."""
    from kfp_gpu_rehearsal.devcluster import crds

    return crds.api_client(Path(step_kubeconfig))


def request(step: str, spec: Any, run_id: str, api: client.ApiClient, **kwargs: Any) -> Any:
    """One step through the run's GpuGang, exactly as a component does. Returns the StepResult (its output names
    the gang; the stage's real output stays in the gang's status). Raises: KfpGpuError."""
    from kfp_gpu.gang import client as gang_client

    return gang_client.request(step, spec, spec.to_json(), run_id, api, **kwargs)


def read_gang(admin: client.ApiClient, namespace: str, run_id: str) -> dict[str, Any] | None:
    """The run's GpuGang as the admin sees it (status included), or None."""
    from kfp_gpu.gang import api as gang

    try:
        return dict(client.CustomObjectsApi(admin).get_namespaced_custom_object(
            gang.GROUP, gang.VERSION, namespace, gang.PLURAL, gang.gang_name(run_id)))
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def output(obj: dict[str, Any] | None, step: str) -> str:
    """A stage's output JSON from the gang's ``status.outputs`` ("" if none): ``scale_up`` holds the capacity."""
    return str((((obj or {}).get("status") or {}).get("outputs") or {}).get(step) or "")


def _ts(text: str) -> float | None:
    try:
        return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except (AttributeError, ValueError):
        return None


def gang_events(admin: client.ApiClient, namespace: str, run_id: str) -> list[tuple[float, str, str]]:
    """The controller's Events on the run's gang as (eventTime, reason, message), oldest first (a profile only:
    each is posted by the controller's runner as it acts)."""
    from kfp_gpu.gang import api as gang

    sel = f"involvedObject.name={gang.gang_name(run_id)},involvedObject.kind={gang.KIND}"
    out = []
    for e in client.CoreV1Api(admin).list_namespaced_event(namespace, field_selector=sel).items:
        t = e.event_time.timestamp() if e.event_time is not None else _ts(str(e.last_timestamp or ""))
        if t is not None:
            out.append((t, str(e.reason), str(e.message)))
    return sorted(out)


def stage_profile(events: list[tuple[float, str, str]], asked: dict[str, float],
                  returned: dict[str, float]) -> dict[str, float]:
    """Where a stage's wall time went, from the client's clock and the controller's Events (same host):
    ``<step>_dispatch`` = the step's patch -> the controller started the work unit; ``<step>_work`` = unit started
    -> the controller recorded its outcome; ``<step>_answer`` = recorded -> the step's watch returned."""
    started = {"preflight": "PreflightStarted", "warm_pool": "WarmPoolStarted", "scale_up": "ScaleUpStarted",
               "train": "JobStarted", "teardown": "Releasing"}
    done = {"preflight": "Preflighted", "warm_pool": "WarmPoolHeld", "scale_up": "Provisioned",
            "train": "JobSucceeded", "teardown": "Released"}
    out: dict[str, float] = {}
    for step, t_ask in asked.items():
        t_start = next((t for t, r, _ in events if r == started.get(step) and t >= t_ask - 0.5), None)
        t_done = next((t for t, r, _ in events if r == done.get(step, "-") and t >= t_ask - 0.5), None)
        if t_start is not None:
            out[f"{step}_dispatch"] = round(t_start - t_ask, 4)
        if t_start is not None and t_done is not None:
            out[f"{step}_work"] = round(t_done - t_start, 4)
        if t_done is not None and step in returned:
            out[f"{step}_answer"] = round(returned[step] - t_done, 4)
    return out


class Product:
    """The bench namespace as a tenant, and the controller serving it (one per bench process)."""

    def __init__(self, admin: client.ApiClient, namespace: str, workdir: Path | None = None,
                 log: Any = print) -> None:
        self.admin, self.namespace, self.log = admin, namespace, log
        self.workdir = workdir or Path(tempfile.mkdtemp(prefix=f"kfp-gpu-bench-{namespace}-"))
        self.ctl_kubeconfig: Path | None = None
        self.step_kubeconfig: Path | None = None
        self.controller: Any = None

    @property
    def log_path(self) -> Path:
        return self.workdir / "controller.log"

    @property
    def work_log_dir(self) -> Path:
        """The controller's ``--log-dir``: one log per work unit (``<ns>.<gang>.<stage>.log``)."""
        return self.workdir / "controller-work"

    def start(self) -> Product:
        from kfp_gpu_rehearsal.devcluster import controller as local_controller

        t = time.time()
        self.ctl_kubeconfig, self.step_kubeconfig = local_controller.prepare(
            self.admin, self.namespace, self.workdir, max_gpus_per_gang=MAX_GPUS_PER_GANG,
            max_gpus_per_namespace=MAX_GPUS_PER_NAMESPACE)
        from bench.sides import karpenter_controller_env

        env = {**os.environ, **karpenter_controller_env()}  # as the platform admin configures the Deployment
        self.controller = local_controller.LocalController(self.ctl_kubeconfig, [self.namespace],
                                                           self.log_path, env=env).start()
        self.log(f"[bench] kfp-gpu controller pid {self.controller.pid} for namespace {self.namespace} "
                 f"(tenant ready in {time.time() - t:.1f}s; log {self.log_path}, work units {self.work_log_dir})")
        return self

    def describe(self) -> dict[str, Any]:
        return {"namespace": self.namespace, "log": str(self.log_path), "work_logs": str(self.work_log_dir),
                "max_gpus_per_gang": MAX_GPUS_PER_GANG, "max_gpus_per_namespace": MAX_GPUS_PER_NAMESPACE}

    def api(self) -> client.ApiClient:
        assert self.step_kubeconfig is not None, "start() first"
        return step_api(self.step_kubeconfig)

    def alive(self) -> bool:
        return self.controller is not None and self.controller.proc is not None and \
            self.controller.proc.poll() is None

    def release_all(self, timeout_s: float = 300.0) -> list[str]:
        """Delete every GpuGang still in the namespace (the controller releases each behind its finalizer) and wait
        for them to go. Returns the names that were left (nothing, normally)."""
        from kfp_gpu.gang import api as gang

        custom = client.CustomObjectsApi(self.admin)

        def gangs() -> list[dict[str, Any]]:
            items = custom.list_namespaced_custom_object(gang.GROUP, gang.VERSION, self.namespace, gang.PLURAL)
            return list(items.get("items") or [])

        left = gangs()
        for g in left:
            try:
                custom.delete_namespaced_custom_object(gang.GROUP, gang.VERSION, self.namespace, gang.PLURAL,
                                                       g["metadata"]["name"])
            except ApiException as exc:
                if exc.status != 404:
                    raise
        end = time.time() + timeout_s
        while left and time.time() < end and self.alive():
            time.sleep(0.5)
            left = gangs()
            # a release that failed (the controller retries it behind the finalizer) is not waited for
            if all((gang.condition(g, gang.RELEASED) or {}).get("status") == "False" for g in left):
                break
        return [g["metadata"]["name"] for g in left]

    def stop(self) -> list[str]:
        """Release what is left, stop the controller, undo the tenant. Returns the gangs that had to be forced
        (their finalizer removed by hand: the controller did not release them in time)."""
        from kfp_gpu import install
        from kfp_gpu.gang import api as gang

        forced: list[str] = []
        try:
            forced = self.release_all() if self.alive() else []
        finally:
            if self.controller is not None:
                self.controller.stop()
        custom = client.CustomObjectsApi(self.admin)
        for name in forced:  # the controller is gone: drop its finalizer so the namespace can be deleted
            try:
                custom.patch_namespaced_custom_object(gang.GROUP, gang.VERSION, self.namespace, gang.PLURAL, name,
                                                      {"metadata": {"finalizers": None}})
            except ApiException as exc:
                if exc.status != 404:
                    raise
        try:
            install.tenant_remove(self.admin, self.namespace, force=True)
        except Exception as exc:  # noqa: BLE001 - the namespace is deleted next anyway
            self.log(f"[bench] tenant remove {self.namespace}: {exc}"[:300])
        return forced


def capacity_of(admin: client.ApiClient, namespace: str, run_id: str) -> Any:
    """The Capacity the controller's scale-up recorded for the run (``status.outputs.scale_up``)."""
    from kfp_gpu.steps.capacity import Capacity

    text = output(read_gang(admin, namespace, run_id), "scale_up")
    if not text:
        raise RuntimeError(f"the gang of {run_id} has no scale_up output")
    return Capacity.from_json(text)


def job_output(admin: client.ApiClient, namespace: str, run_id: str, job: str) -> dict[str, Any]:
    """The train step's whole output (ledger, timeline...), as the controller recorded it in the gang's
    ``status.outputs['job:<name>']`` (the step itself returns only its scalar fields). Read as admin."""
    text = output(read_gang(admin, namespace, run_id), f"job:{job}")
    if not text:
        raise RuntimeError(f"the gang of {run_id} has no output for job {job}")
    return dict(json.loads(text))
