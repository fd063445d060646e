"""The step side of the GpuGang API: what the five components do, with a namespaced Role and nothing else.

Each step writes its intent into the run's GpuGang and waits, on a watch, for the controller's answer:

- preflight creates the gang (recording the pipeline's owner) and raises ``spec.stage`` to Preflighted;
- warm_pool and scale_up raise it to WarmPoolHeld and Provisioned;
- train adds its job to ``spec.jobs`` and waits for the job's state;
- teardown sets ``spec.release``, waits for Released, reads the release report, and deletes the gang.

A step returns a small reference to the gang (never node lists), so outputs stay small at any gang size; the
stage's real output stays in the gang's status for the controller. A stage that failed in the controller fails
the step with the same error (:meth:`~kfp_gpu.errors.KfpGpuError.from_dict`), one line, no traceback.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import socket
import threading
import time
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kfp_gpu import ownership
from kfp_gpu.cluster import lease, owned
from kfp_gpu.cluster.listwatch import ERROR, Event, Watcher
from kfp_gpu.errors import Cancelled, KfpGpuError, ProvisioningTimeout
from kfp_gpu.gang import api as gang
from kfp_gpu.plan.lease import LOCAL_OWNER
from kfp_gpu.spec import DEFAULT_LEASE_TTL_S, ProvisioningSpec
from kfp_gpu.steps.result import StepResult

log = logging.getLogger(__name__)
OWNER_PID_ENV = "KFP_GPU_OWNER_PID"  # kfp-gpu run: the rehearsal process that owns the run (not the step's pid)
WAIT_S = 7 * 86400.0
GONE_S = 120.0  # a released gang's finalizer comes off in well under a second


def owner_of(api: client.ApiClient, namespace: str) -> dict[str, str]:
    """Who runs this pipeline, for ``spec.owner`` (see :mod:`kfp_gpu.controller.owners`). Without an Argo Workflow
    or a ``kfp-gpu run`` process (a Vertex AI pipeline, steps run from another host) the controller cannot observe
    the owner: ``heartbeat: "true"``, and the steps beat on the gang while they run (:meth:`GangClient.wait`)."""
    pid = os.environ.get(OWNER_PID_ENV, "")
    if pid.isdigit():
        return {"local": f"{LOCAL_OWNER}:{socket.gethostname()}:{pid}"}
    ident = lease.detect_identity(api, namespace)
    out = {k: v for k, v in (("pod", ident.pod), ("podUid", ident.pod_uid), ("workflow", ident.workflow),
                             ("local", ident.local)) if v}
    if not ident.workflow:
        out["heartbeat"] = "true"
    return out


def beat_interval(obj: dict[str, Any]) -> float | None:
    """Seconds between two heartbeats for a gang whose owner beats (``spec.owner.heartbeat``), else None:
    a quarter of the spec's ``lease_ttl_s``, at most a minute."""
    spec = obj.get("spec") or {}
    if str((spec.get("owner") or {}).get("heartbeat") or "") != "true":
        return None
    ttl = float((spec.get("provisioning") or {}).get("lease_ttl_s") or DEFAULT_LEASE_TTL_S)
    return max(0.5, min(ttl / 4.0, 60.0))


class GangClient:
    """The run's GpuGang, as its namespace's step identity sees it."""

    def __init__(self, api: client.ApiClient, namespace: str, run_id: str) -> None:
        self.api, self.namespace, self.run_id = api, namespace, run_id
        self.name = gang.gang_name(run_id)
        self.path = f"/apis/{gang.API_VERSION}/namespaces/{namespace}/{gang.PLURAL}/{self.name}"
        self.beat_every_s: float | None = None  # set from the gang (ensure/get): the owner beats while a step waits

    def get(self) -> dict[str, Any] | None:
        try:
            obj = owned.request(self.api, "GET", self.path)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        self.beat_every_s = beat_interval(obj)
        return obj

    def beat(self) -> None:
        """Tell the controller this run's owner lives (``kfp-gpu.io/heartbeat``); a failed beat is logged, the next
        one retries."""
        try:
            owned.request(self.api, "PATCH", self.path, body={"metadata": {"annotations": {
                ownership.HEARTBEAT_ANNOTATION: str(int(time.time()))}}}, content_type=owned.MERGE_PATCH)
        except ApiException as exc:
            if exc.status != 404:  # 404: the gang is gone (released and deleted): nothing left to keep alive
                log.warning("GpuGang %s/%s: heartbeat not written: %s", self.namespace, self.name, exc)
        except Exception as exc:  # noqa: BLE001 - advisory: the lease_ttl_s margin covers a few lost beats
            log.warning("GpuGang %s/%s: heartbeat not written: %s", self.namespace, self.name, exc)

    def ensure(self, spec_json: str) -> dict[str, Any]:
        """The gang, created (with this pipeline as its owner) when it does not exist yet."""
        cur = self.get()
        if cur is not None:
            return cur
        body = gang.body(self.run_id, self.namespace, spec_json, owner_of(self.api, self.namespace))
        try:
            made: dict[str, Any] = owned.request(self.api, "POST", self.path.rsplit("/", 1)[0], body=body)
            self.beat_every_s = beat_interval(made)
            return made
        except ApiException as exc:
            if exc.status != 409:
                raise
        got = self.get()
        assert got is not None
        return got

    def patch(self, spec: dict[str, Any]) -> None:
        owned.request(self.api, "PATCH", self.path, body={"spec": spec}, content_type=owned.MERGE_PATCH)

    def delete(self) -> None:
        try:
            owned.request(self.api, "DELETE", self.path)
        except ApiException as exc:
            if exc.status != 404:
                raise

    def wait(self, done: Any, timeout_s: float = WAIT_S) -> dict[str, Any] | None:
        """Watch the gang until ``done(obj)`` is truthy (returns obj) or it is deleted (returns None).
        Raises: ProvisioningTimeout after ``timeout_s``; Cancelled on SIGTERM (raised in the main thread)."""
        events: queue.Queue[Event] = queue.Queue()
        w = Watcher(f"gpugang-{self.name}", client.CustomObjectsApi(self.api).list_namespaced_custom_object,
                    events.put, gang.GROUP, gang.VERSION, self.namespace, gang.PLURAL,
                    field_selector=f"metadata.name={self.name}").start()
        deadline = time.monotonic() + timeout_s
        seen = False
        stop = threading.Event()
        if self.beat_every_s:  # an owner the controller cannot observe: beat while this step runs
            every = self.beat_every_s

            def beats() -> None:
                while not stop.is_set():
                    self.beat()
                    stop.wait(every)

            threading.Thread(target=beats, daemon=True, name=f"kfp-gpu-heartbeat-{self.name}").start()
        try:
            while time.monotonic() < deadline:
                try:
                    ev = events.get(timeout=0.5)
                except queue.Empty:
                    if w.synced.is_set() and not seen and events.empty():
                        return None  # the list found no such gang: it is gone already
                    continue
                seen = True
                if ev.type == ERROR:
                    raise ev.obj["error"]
                if ev.type == "DELETED":
                    return None
                if done(ev.obj):
                    return ev.obj
        finally:
            stop.set()
            w.stop()
        raise ProvisioningTimeout(f"GpuGang {self.namespace}/{self.name} did not answer within {timeout_s:.0f}s",
                                  remediation="check the controller: kubectl -n kfp-gpu-system logs "
                                  "deploy/kfp-gpu-controller; kubectl describe gpugang")


def _failure(obj: dict[str, Any], fallback: str) -> KfpGpuError:
    err = (obj.get("status") or {}).get("error")
    return KfpGpuError.from_dict(err) if err else KfpGpuError(fallback)


def _result(obj: dict[str, Any], key: str, output: str) -> StepResult:
    res = ((obj.get("status") or {}).get("results") or {}).get(key) or {}
    return StepResult(output, {k: float(v) for k, v in (res.get("metrics") or {}).items()},
                      str(res.get("markdown") or ""))


def summary(output_json: str, ref: dict[str, Any]) -> str:
    """The train step's output: the scalar fields of the train result (status, final step and loss, GPU-hours,
    preemptions...) and the gang's name. Lists and maps (the timeline, the ledger, node names) stay in the gang's
    status, so the output that a downstream step gets on its command line stays small at any gang size."""
    try:
        data = json.loads(output_json or "{}")
    except ValueError:
        data = {}
    small = {k: v for k, v in (data if isinstance(data, dict) else {}).items()
             if v is None or isinstance(v, (bool, int, float)) or (isinstance(v, str) and len(v) <= 256)}
    return json.dumps({**small, **ref}, sort_keys=True)


def run_stage(c: GangClient, step: str, spec_json: str) -> StepResult:
    """preflight, warm_pool, scale_up: raise the gang's stage and wait for its condition."""
    stage = gang.STAGE_OF_STEP[step]
    obj = c.ensure(spec_json)
    if gang.stage_index(str((obj.get("spec") or {}).get("stage") or "")) < gang.stage_index(stage):
        c.patch({"stage": stage})

    def done(o: dict[str, Any]) -> bool:
        cond = gang.condition(o, stage)
        return bool(cond and (cond.get("status") == "True" or cond.get("reason") not in (None, "Cancelled"))) \
            or gang.is_true(o, gang.RELEASED)

    got = c.wait(done)
    if got is None or gang.is_true(got, gang.RELEASED):
        raise Cancelled(f"GpuGang {c.namespace}/{c.name} was released before {stage}",
                        remediation="the run was torn down (teardown, deletion, or its owner ended)")
    if not gang.is_true(got, stage):
        raise _failure(got, f"{step} failed in the controller")
    ref: dict[str, Any] = {"gang": c.name, "namespace": c.namespace, "stage": stage}
    try:  # the backend choice travels with the reference: the preflight's output says which and why
        chosen = json.loads(str(((got.get("status") or {}).get("outputs") or {}).get(step) or "{}")).get("provisioner")
    except (ValueError, AttributeError):
        chosen = None
    if isinstance(chosen, dict) and len(json.dumps(chosen)) <= 1024:
        ref["provisioner"] = chosen
    return _result(got, stage, json.dumps(ref, sort_keys=True))


def run_job(c: GangClient, spec_json: str, job_json: str, dataset_uri: str, queue_timeout_s: float) -> StepResult:
    """train: ask the controller to run the job on the gang; wait for it to end."""
    job = json.loads(job_json)
    name = str(job.get("name") or "train")
    c.ensure(spec_json)
    c.patch({"jobs": {name: {"job": job, "datasetUri": dataset_uri, "queueTimeoutS": queue_timeout_s}}})

    def done(o: dict[str, Any]) -> bool:
        state = (((o.get("status") or {}).get("jobs") or {}).get(name) or {}).get("state")
        return state in gang.JOB_DONE or gang.is_true(o, gang.RELEASED) or \
            any((gang.condition(o, s) or {}).get("reason") == "PolicyDenied" for s in gang.STAGES)

    got = c.wait(done)
    if got is None:
        raise Cancelled(f"GpuGang {c.namespace}/{c.name} was deleted while job {name} ran")
    entry = ((got.get("status") or {}).get("jobs") or {}).get(name) or {}
    if entry.get("state") == gang.JOB_SUCCEEDED:
        out = str(((got.get("status") or {}).get("outputs") or {}).get(f"job:{name}", ""))
        return _result(got, f"job:{name}", summary(out, {"gang": c.name, "job": name}))
    if entry.get("error"):
        raise KfpGpuError.from_dict(entry["error"])
    raise _failure(got, f"job {name} did not run: the gang was released")


def release(c: GangClient) -> StepResult:
    """teardown: release everything the gang holds, return the release report, delete the gang."""
    obj = c.get()
    if obj is None:
        return StepResult(json.dumps({"noop": True, "gang": c.name}), {}, f"GpuGang {c.name}: nothing to release")
    c.patch({"release": True})
    got = c.wait(lambda o: gang.condition(o, gang.RELEASED) is not None)
    if got is None:  # deleted meanwhile: the finalizer released it
        return StepResult(json.dumps({"noop": False, "gang": c.name}), {}, f"GpuGang {c.name}: released on deletion")
    if not gang.is_true(got, gang.RELEASED):
        raise _failure(got, "release failed in the controller")
    out = str(((got.get("status") or {}).get("outputs") or {}).get("teardown", "")) or "{}"
    c.delete()
    c.wait(lambda o: False, timeout_s=GONE_S)  # the finalizer is the controller's: done once the object is gone
    return _result(got, "release", out)


def request(step: str, spec: ProvisioningSpec, spec_json: str, run_id: str, api: client.ApiClient,
            **kwargs: Any) -> StepResult:
    """One step through the gang. Raises: KfpGpuError (the controller's, or PermissionDenied/ProvisioningTimeout)."""
    c = GangClient(api, spec.target.namespace, run_id)
    if step == "teardown":
        return release(c)
    if step == "train":
        return run_job(c, spec_json, str(kwargs["job_json"]), str(kwargs.get("dataset_uri") or ""),
                       float(kwargs.get("queue_timeout_s") or 3600.0))
    return run_stage(c, step, spec_json)
