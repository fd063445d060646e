"""One GpuGang's loop in the controller: observe the object, ask :func:`kfp_gpu.plan.gang.next_action`, act.

The runner is the only writer of the gang's ``status`` (merge patches of the status subresource). Work (a step
function) runs in a child process (:mod:`kfp_gpu.controller.work`); the runner starts it, reaps it, and records its
outcome as a condition, an output and an Event. Everything is re-derived from the object on every turn, so a
restarted controller picks up where the object says the gang is (level-triggered).
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import socket
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kfp_gpu import progress
from kfp_gpu.cluster import owned
from kfp_gpu.controller import metrics, owners
from kfp_gpu.controller.work import Outcome, Work, fenced
from kfp_gpu.gang import api as gang
from kfp_gpu.plan import policy
from kfp_gpu.plan.gang import DENIED, FAILED, Do, next_action, phase

log = logging.getLogger(__name__)
Obj = dict[str, Any]
EventFn = Callable[[Obj, str, str, str], None]  # (gang, type Normal|Warning, reason, message)
GANGS = f"/apis/{gang.API_VERSION}"
OWNER_CHECK_S = 1.0


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def set_condition(status: Obj, ctype: str, ok: bool, reason: str, message: str, generation: int = 0) -> bool:
    """Set one condition in ``status`` (lastTransitionTime moves only when the status flips); True if changed."""
    conds: list[Obj] = list(status.get("conditions") or [])
    new: Obj = {"type": ctype, "status": "True" if ok else "False", "reason": reason, "message": message[:4000],
           "observedGeneration": generation}
    for i, c in enumerate(conds):
        if c.get("type") == ctype:
            if all(c.get(k) == v for k, v in new.items()):
                return False
            new["lastTransitionTime"] = c.get("lastTransitionTime") if c.get("status") == new["status"] else _now()
            conds[i] = new
            break
    else:
        new["lastTransitionTime"] = _now()
        conds.append(new)
    status["conditions"] = conds
    return True


def post_event(api: client.ApiClient, obj: Obj, etype: str, reason: str, message: str) -> None:
    """An Event on the gang (``kubectl describe gpugang`` shows them); a failed post never stops the work."""
    meta = obj.get("metadata") or {}
    now = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    body = {"metadata": {"generateName": f"{meta.get('name')}.", "namespace": meta.get("namespace")},
            "involvedObject": {"apiVersion": gang.API_VERSION, "kind": gang.KIND, "name": meta.get("name"),
                               "namespace": meta.get("namespace"), "uid": meta.get("uid")},
            "type": etype, "reason": reason[:128], "message": message[:1024], "firstTimestamp": now[:19] + "Z",
            "lastTimestamp": now[:19] + "Z", "eventTime": now, "count": 1, "action": reason[:128],
            "reportingComponent": "kfp-gpu-controller", "reportingInstance": socket.gethostname()[:128],
            "source": {"component": "kfp-gpu-controller"}}
    try:
        owned.request(api, "POST", f"/api/v1/namespaces/{meta.get('namespace')}/events", body=body)
    except Exception as exc:  # noqa: BLE001
        log.debug("event %s not posted: %s", reason, exc)


class Runner:
    """The loop state of one gang: its running work and the status it last wrote."""

    def __init__(self, api: client.ApiClient, namespace: str, name: str, event: EventFn, log_dir: Path) -> None:
        self.api, self.namespace, self.name = api, namespace, name
        self.event = event
        self.log_dir = log_dir
        self.work: dict[str, Work] = {}
        self.wake = threading.Event()  # set on a watch event of the gang and when a unit ends: turn now
        self.status: Obj | None = None
        self.lock = threading.RLock()
        self._owner_checked = 0.0
        self._owner_gone = ""

    # ---------------------------------------------------------------- I/O helpers
    def path(self, sub: str = "") -> str:
        return f"{GANGS}/namespaces/{self.namespace}/{gang.PLURAL}/{self.name}{sub}"

    def read(self) -> Obj | None:
        try:
            return owned.request(self.api, "GET", self.path())
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def flush(self, obj: Obj) -> None:
        """Write the in-memory status (phase and ready count derived here, the one place)."""
        assert self.status is not None
        if fenced():  # this replica stopped acting (or was frozen past its renew deadline): the next leader writes
            return
        st = self.status
        st["phase"] = phase({**obj, "status": st}, set(self.work))
        st["ready"] = f"{len(st.get('gangNodes') or [])}/{int((obj.get('spec') or {}).get('nodes') or 0)}"
        st["observedGeneration"] = int((obj.get("metadata") or {}).get("generation") or 0)
        try:
            owned.request(self.api, "PATCH", self.path("/status"), body={"status": st},
                          content_type=owned.MERGE_PATCH)
        except ApiException as exc:
            if exc.status != 404:
                raise
        metrics.observe_gang(self.namespace, self.name, st, obj)

    # ---------------------------------------------------------------- the loop
    def turn(self, obj: Obj) -> None:
        """One pass: reap finished work, then do what the decision table says. Never blocks for long."""
        if fenced():  # this replica stopped acting (kfp_gpu.controller.work.fenced)
            return
        with self.lock:
            if self.status is None:
                self.status = json.loads(json.dumps(obj.get("status") or {}))
                self.status.pop("phase", None)
            changed = self._reap(obj)
            changed = self._progress(obj) or changed
            if "release" in self.work:
                if changed:
                    self.flush(obj)
                return
            act = next_action({**obj, "status": self.status}, set(self.work), self._check_owner(obj), time.time())
            if act.do is Do.ADMIT:
                self._admit(obj)
                changed = True
            elif act.do is Do.RUN_STAGE:
                self._start_stage(obj, act.what)
                changed = True
            elif act.do is Do.RUN_JOB:
                self._start_job(obj, act.what)
                changed = True
            elif act.do is Do.RELEASED:
                gen = int((obj.get("metadata") or {}).get("generation") or 0)
                set_condition(self.status, gang.RELEASED, True, "NothingToRelease", act.reason, gen)
                self.event(obj, "Normal", "Released", act.reason)
                changed = True
            elif act.do is Do.CANCEL:
                for w in self.work.values():
                    w.cancel()
            elif act.do is Do.RELEASE:
                if self._owner_gone and not (obj.get("metadata") or {}).get("deletionTimestamp"):  # gone: delete
                    self.event(obj, "Normal", "OwnerGone", f"releasing: {act.reason}")
                    self._delete(obj)
                    return
                self._start_release(obj, act.reason)
                changed = True
            if changed:
                self.flush(obj)

    def stop(self, timeout_s: float = 60.0) -> None:
        """Cancel every running unit (SIGTERM: each cleans up what it started) and wait for them."""
        with self.lock:
            for w in self.work.values():
                w.cancel()
            for w in list(self.work.values()):
                w.wait(timeout_s)
            self.work.clear()

    def release_now(self, obj: Obj, reason: str, timeout_s: float = 900.0) -> Outcome | None:
        """The finalizer's release: cancel the work, run teardown to the end, record Released."""
        self.stop()
        with self.lock:
            if self.status is None:
                self.status = json.loads(json.dumps(obj.get("status") or {}))
            if gang.is_true({"status": self.status}, gang.RELEASED):
                return None
            if not gang.is_true({"status": self.status}, gang.POLICY_ADMITTED):
                set_condition(self.status, gang.RELEASED, True, "NothingToRelease", f"{reason}; never admitted")
                self.flush(obj)
                return None
            self._start_release(obj, reason)
            out = self.work["release"].wait(timeout_s)
            self._reap(obj)
            self.flush(obj)
            return out

    # ---------------------------------------------------------------- actions
    def _check_owner(self, obj: Obj) -> str:
        now = time.monotonic()
        if now - self._owner_checked >= OWNER_CHECK_S:
            self._owner_checked = now
            try:
                self._owner_gone = owners.gone(self.api, obj)
            except Exception as exc:  # noqa: BLE001 - an owner check that fails says nothing: keep the gang
                log.warning("gang %s/%s: owner check failed: %s", self.namespace, self.name, exc)
                self._owner_gone = ""
        return self._owner_gone

    def _delete(self, obj: Obj) -> None:
        try:
            owned.request(self.api, "DELETE", self.path())
        except ApiException as exc:
            if exc.status != 404:
                raise

    def _admit(self, obj: Obj) -> None:
        assert self.status is not None
        spec = obj.get("spec") or {}
        verdict = self._verdict(spec)
        gen = int((obj.get("metadata") or {}).get("generation") or 0)
        set_condition(self.status, gang.POLICY_ADMITTED, verdict.admitted,
                      "Admitted" if verdict.admitted else DENIED, verdict.message, gen)
        if verdict.admitted:
            if verdict.max_run_seconds:
                self.status["runDeadline"] = time.time() + verdict.max_run_seconds
            self.event(obj, "Normal", "PolicyAdmitted", verdict.message)
            return
        err = {"type": "PermissionDenied", "message": verdict.message,
               "remediation": "ask the platform admin to change the GpuPolicy, or ask for less",
               "scope": "provider", "transient": False,
               "fields": {"policy": verdict.policy, "rule": verdict.rule}}
        self.status["error"] = err
        for stage in gang.STAGES:
            set_condition(self.status, stage, False, DENIED, verdict.message, gen)
        self.event(obj, "Warning", "PolicyDenied", verdict.message)

    def _verdict(self, spec: Obj) -> policy.Verdict:
        want = gang.mirrors(spec.get("provisioning") or {})
        for key, value in sorted(want.items()):
            if spec.get(key) != value:
                return policy.Verdict(False, "", "mirror", f"GpuGang {self.namespace}/{self.name}: spec.{key}="
                                      f"{spec.get(key)!r} disagrees with spec.provisioning ({value!r}); create "
                                      "the gang with kfp_gpu.gang.api.body, which writes both")
        policies = owned.request(self.api, "GET", f"{GANGS}/{gang.POLICY_PLURAL}").get("items") or []
        ns = owned.request(self.api, "GET", f"/api/v1/namespaces/{self.namespace}")
        in_use = 0
        for g in owned.request(self.api, "GET", f"{GANGS}/namespaces/{self.namespace}/{gang.PLURAL}").get(
                "items") or []:
            if owned.meta(g).get("name") == self.name or gang.is_true(g, gang.RELEASED):
                continue
            if gang.is_true(g, gang.POLICY_ADMITTED):
                gs = g.get("spec") or {}
                in_use += int(gs.get("nodes") or 0) * int(gs.get("gpusPerNode") or 0)
        return policy.evaluate(policies, self.namespace, owned.labels(ns), spec, in_use)

    def _start_stage(self, obj: Obj, stage: str) -> None:
        assert self.status is not None
        step = gang.STEP_OF_STAGE[stage]
        i = gang.STAGES.index(stage)
        upstream = "" if i == 0 else str((self.status.get("outputs") or {}).get(
            gang.STEP_OF_STAGE[gang.STAGES[i - 1]], ""))
        self.work[stage] = self._spawn(obj, stage, step, upstream)
        self.event(obj, "Normal", f"{step.title().replace('_', '')}Started", f"{stage}: {step} started")

    def _start_job(self, obj: Obj, name: str) -> None:
        assert self.status is not None
        req = ((obj.get("spec") or {}).get("jobs") or {}).get(name) or {}
        capacity = str((self.status.get("outputs") or {}).get("scale_up", ""))
        self.work[f"job:{name}"] = self._spawn(
            obj, f"job:{name}", "train", capacity, job_json=json.dumps(req.get("job") or {}),
            dataset_uri=str(req.get("datasetUri") or ""), queue_timeout_s=float(req.get("queueTimeoutS") or 3600.0))
        jobs = dict(self.status.get("jobs") or {})
        jobs[name] = {"state": gang.JOB_RUNNING}
        self.status["jobs"] = jobs
        self.event(obj, "Normal", "JobStarted", f"training job {name} started on the gang")

    def _start_release(self, obj: Obj, reason: str) -> None:
        self.work["release"] = self._spawn(obj, "release", "teardown", "")
        self.event(obj, "Normal", "Releasing", f"releasing the gang: {reason}")

    def _spawn(self, obj: Obj, key: str, step: str, upstream: str, **kwargs: Any) -> Work:
        spec = obj.get("spec") or {}
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log_path = self.log_dir / f"{self.namespace}.{self.name}.{key.replace(':', '-')}.log"
        return Work(key, step, json.dumps(spec.get("provisioning") or {}), str(spec.get("runId") or ""),
                    upstream, log_path, on_exit=self.wake.set, **kwargs)

    def _reap(self, obj: Obj) -> bool:
        assert self.status is not None
        changed = False
        gen = int((obj.get("metadata") or {}).get("generation") or 0)
        for key, w in list(self.work.items()):
            out = w.poll()
            if out is None or fenced():  # fenced: a unit killed by the fence did not fail, it was stopped
                continue
            del self.work[key]
            changed = True
            self._record(obj, key, w.step, out, gen)
        return changed

    def _progress(self, obj: Obj) -> bool:
        """Turn a running job unit's progress report (:mod:`kfp_gpu.progress`) into the ``Degraded`` condition and an
        Event: True while a preemption or eviction has taken part of the gang, False once it is whole again."""
        assert self.status is not None
        changed = False
        gen = int((obj.get("metadata") or {}).get("generation") or 0)
        for key, w in self.work.items():
            rep = w.progress() if key.startswith("job:") else None
            if rep is None:
                continue
            bad = rep.get("state") == progress.DEGRADED
            reason, message = str(rep.get("reason") or ""), str(rep.get("message") or "")
            if set_condition(self.status, gang.DEGRADED, bad, reason, message, gen):
                changed = True
                self.event(obj, "Warning" if bad else "Normal", reason, message)
        return changed

    def _record(self, obj: Obj, key: str, step: str, out: Outcome, gen: int) -> None:
        assert self.status is not None
        st = self.status
        if out.ok:
            st.setdefault("outputs", {})[step if not key.startswith("job:") else key] = out.output_json
            st.setdefault("results", {})[key] = {"markdown": out.markdown[:20000], "metrics": out.metrics or {}}
        if key == "release":
            set_condition(st, gang.RELEASED, out.ok, "Released" if out.ok else FAILED,
                          "everything released" if out.ok else str((out.error or {}).get("message", "")), gen)
            self._note_teardown(out)
            self.event(obj, "Normal" if out.ok else "Warning", "Released" if out.ok else "ReleaseFailed",
                       "released" if out.ok else str((out.error or {}).get("message", "")))
            return
        if key.startswith("job:"):
            name = key[4:]
            jobs = dict(st.get("jobs") or {})
            jobs[name] = {"state": gang.JOB_SUCCEEDED if out.ok else gang.JOB_FAILED,
                          **({"error": out.error} if out.error else {})}
            st["jobs"] = jobs
            if gang.is_true({"status": st}, gang.DEGRADED):  # the job ended: nothing is recovering any more
                set_condition(st, gang.DEGRADED, False, "JobEnded", f"job {name} ended", gen)
            self.event(obj, "Normal" if out.ok else "Warning", f"Job{jobs[name]['state']}", f"job {name}: "
                       + ("succeeded" if out.ok else str((out.error or {}).get("message", ""))))
            metrics.count_preemptions(out.metrics or {})
            return
        if out.ok:
            set_condition(st, key, True, "Done", f"{step} done", gen)
            st.pop("error", None)
            if key == gang.PROVISIONED:
                self._note_capacity(obj, out.output_json)
            self.event(obj, "Normal", key, f"{step} done")
        else:
            cancelled = (out.error or {}).get("type") == "Cancelled"
            st["error"] = out.error
            set_condition(st, key, False, "Cancelled" if cancelled else FAILED,
                          str((out.error or {}).get("message", "")), gen)
            self.event(obj, "Warning", f"{key}Failed", str((out.error or {}).get("message", "")))

    def _note_capacity(self, obj: Obj, capacity_json: str) -> None:
        assert self.status is not None
        try:
            cap = json.loads(capacity_json or "{}")
        except ValueError:
            return
        placements = cap.get("placements") or []
        self.status["gangNodes"] = [n for p in placements for n in p.get("nodes") or []]
        self.status["zone"] = ",".join(sorted({str(p.get("zone")) for p in placements if p.get("zone")}))
        self.status["backend"] = str((cap.get("extra") or {}).get("provisioner") or "node-pool")
        created = owned.meta(obj).get("creationTimestamp")
        if created:
            t0 = dt.datetime.fromisoformat(str(created).replace("Z", "+00:00")).timestamp()
            metrics.observe_ready_latency(time.time() - t0)

    def _note_teardown(self, out: Outcome) -> None:
        assert self.status is not None
        try:
            data: Mapping[str, Any] = json.loads(out.output_json or "{}")
        except ValueError:
            return
        if data.get("timeline"):
            self.status["timeline"] = data["timeline"]
        if data.get("cost"):
            self.status["cost"] = data["cost"]
            metrics.add_idle_minutes(data["cost"])
        self.status["gangNodes"] = []
