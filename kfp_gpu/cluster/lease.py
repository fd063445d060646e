"""Ownership leases, renewed while the step that holds capacity is alive; and the janitor's lock.

Every step that holds capacity runs a :class:`Heartbeat`. Each beat (every ``min(ttl/4, 300)`` s):

* creates or updates a ``coordination.k8s.io/v1`` Lease named after (run, step), carrying the ownership labels,
  ``holderIdentity``, ``leaseDurationSeconds`` = ttl, ``renewTime``, and annotations naming the live owner:
  the step pod (``namespace/name`` and uid, from the downward-API variables KFP sets: ``KFP_POD_NAME``,
  ``KFP_POD_UID``), its Argo Workflow (the pod's ``workflows.argoproj.io/workflow`` label), or
  ``local:<host>:<pid>`` outside a pod;
* raises the ``kfp-gpu.io/lease-expires`` label of every object of the run that carries one (ledgers, balloon
  pods, claimed Nodes, PyTorchJobs) to now + ttl, with a merge patch of that label only, never lowering it.

A failed beat is logged and retried on the next one; it never fails the step. ``stop()`` releases the Lease
(empty holderIdentity): the run is then protected by its expiry alone until the next step takes over.
The janitor (:mod:`kfp_gpu.steps.janitor`) reads these Leases and decides with :mod:`kfp_gpu.plan.lease`.
"""

from __future__ import annotations

import datetime as dt
import functools
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kfp_gpu import fanout
from kfp_gpu.cluster import owned
from kfp_gpu.plan.lease import LOCAL_OWNER, POD_OWNER, WORKFLOW_OWNER, LeaseRecord, OwnerRef, lock_free
from kfp_gpu.providers.base import LABEL_MANAGED, Owner, label_safe

log = logging.getLogger(__name__)

ARGO_WORKFLOW_LABEL = "workflows.argoproj.io/workflow"  # Argo labels every workflow pod with its workflow
SA_NAMESPACE_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
A_POD, A_POD_UID, A_WORKFLOW, A_LOCAL = ("kfp-gpu.io/owner-pod", "kfp-gpu.io/owner-pod-uid",
                                         "kfp-gpu.io/owner-workflow", "kfp-gpu.io/owner-local")
A_RUN_ID, A_RELEASED = "kfp-gpu.io/run-id-raw", "kfp-gpu.io/released-at"
LOCK_NAME = "kfp-gpu-janitor"


def lease_name(run_id: str, step: str) -> str:
    return f"kfp-gpu-lease-{label_safe(run_id)[:40]}-{label_safe(step)}".lower().replace("_", "-").replace(".", "-")


def _ts(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, dt.datetime):
        return value.timestamp()
    return dt.datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()


def _micro(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass(frozen=True)
class OwnerIdentity:
    """Who renews a lease: ``holder`` (Lease holderIdentity) and the owner the janitor checks for life."""

    holder: str
    pod: str = ""  # "namespace/name"
    pod_uid: str = ""
    workflow: str = ""  # "namespace/name"
    local: str = ""  # "local:<host>:<pid>"

    def annotations(self) -> dict[str, str]:
        return {k: v for k, v in ((A_POD, self.pod), (A_POD_UID, self.pod_uid), (A_WORKFLOW, self.workflow),
                                  (A_LOCAL, self.local)) if v}

    def __str__(self) -> str:
        return self.pod and f"pod {self.pod}" or self.local or self.holder


def owner_refs(annotations: Mapping[str, str]) -> tuple[OwnerRef, ...]:
    """The owners a Lease's annotations record (see :class:`OwnerIdentity`)."""
    out = []
    if annotations.get(A_POD):
        out.append(OwnerRef(POD_OWNER, annotations[A_POD], annotations.get(A_POD_UID, "")))
    if annotations.get(A_WORKFLOW):
        out.append(OwnerRef(WORKFLOW_OWNER, annotations[A_WORKFLOW]))
    if annotations.get(A_LOCAL):
        out.append(OwnerRef(LOCAL_OWNER, annotations[A_LOCAL]))
    return tuple(out)


def detect_identity(api: client.ApiClient, fallback_namespace: str,
                    env: Mapping[str, str] | None = None) -> OwnerIdentity:
    """This process as a lease owner.

    In a pod (``$KFP_POD_NAME`` / ``$POD_NAME``, or a service-account token mounted): the pod
    ``namespace/name`` (namespace from ``$KFP_POD_NAMESPACE`` / ``$POD_NAMESPACE``, the mounted service
    account's namespace, else ``fallback_namespace``), its uid, and the Argo Workflow named by its
    ``workflows.argoproj.io/workflow`` label (read from the API; a failed read is logged and skipped).
    Elsewhere ``local:<hostname>:<pid>``. Raises: nothing.
    """
    env = os.environ if env is None else env
    pid, host = os.getpid(), socket.gethostname()
    pod = env.get("KFP_POD_NAME") or env.get("POD_NAME") or ""
    if not pod and not os.path.exists(SA_NAMESPACE_FILE):
        return OwnerIdentity(holder=f"{host}/{pid}", local=f"{LOCAL_OWNER}:{host}:{pid}")
    pod = pod or env.get("HOSTNAME") or host
    ns = own_namespace(fallback_namespace, env)
    uid, workflow = env.get("KFP_POD_UID", ""), ""
    try:
        me = owned.request(api, "GET", f"/api/v1/namespaces/{ns}/pods/{pod}")
        uid = uid or str(owned.meta(me).get("uid", ""))
        wf = owned.labels(me).get(ARGO_WORKFLOW_LABEL, "")
        workflow = f"{ns}/{wf}" if wf else ""
    except Exception as exc:  # no read access, or no API: the pod name alone still identifies the owner
        log.warning("lease owner: cannot read my pod %s/%s (%s); recording the pod name only", ns, pod, exc)
    return OwnerIdentity(holder=f"{pod}/{pid}", pod=f"{ns}/{pod}", pod_uid=uid, workflow=workflow)


def own_namespace(fallback: str, env: Mapping[str, str] | None = None) -> str:
    """The namespace this process runs in: ``$KFP_POD_NAMESPACE`` / ``$POD_NAMESPACE``, the mounted service
    account's namespace, else ``fallback``."""
    env = os.environ if env is None else env
    return env.get("KFP_POD_NAMESPACE") or env.get("POD_NAMESPACE") or _read_text(SA_NAMESPACE_FILE) or fallback


def _read_text(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read().strip()
    except OSError:
        return ""


class Heartbeat:
    """Renews the run's ownership leases while the step that holds capacity is alive.

    ``Heartbeat(api, namespace, run_id, step, ttl_s)`` keeps the Lease ``kfp-gpu-lease-<run>-<step>`` in
    ``namespace`` held and every lease-labelled object of ``run_id`` (in ``namespace``, and claimed Nodes)
    unexpired for ``ttl_s`` past the latest beat. ``interval_s`` defaults to ``min(ttl_s / 4, 300)``.
    ``start()`` renews the Lease synchronously, then the labels and the later beats on a daemon thread;
    ``stop()`` (or leaving the ``with`` block) ends the beats and releases the Lease. ``owner`` is the
    :class:`Owner` to write objects with: its ``lease_expires`` is the latest renewed expiry, so a write never
    shortens what the heartbeat extended.

    Renewal failures are logged (``last_error``, ``failures``) and retried on the next beat; they never
    raise into the step.

    Raises:
        ValueError: ``ttl_s`` not positive, or ``interval_s`` not in (0, ttl_s).
    """

    def __init__(self, api: client.ApiClient, namespace: str, run_id: str, step: str, ttl_s: float,
                 *, interval_s: float | None = None, identity: OwnerIdentity | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        if not ttl_s > 0:
            raise ValueError(f"Heartbeat ttl_s must be > 0, got {ttl_s}")
        interval = min(ttl_s / 4, 300.0) if interval_s is None else float(interval_s)
        if not 0 < interval < ttl_s:
            raise ValueError(f"Heartbeat interval_s must be in (0, ttl_s={ttl_s}), got {interval}")
        self.api, self.namespace, self.run_id, self.step = api, namespace, run_id, step
        self.ttl_s, self.interval_s, self.identity, self._clock = float(ttl_s), interval, identity, clock
        self._expires = clock() + self.ttl_s
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._released = False
        self.renewals = 0
        self.failures = 0
        self.last_error = ""

    @property
    def name(self) -> str:
        return lease_name(self.run_id, self.step)

    @property
    def owner(self) -> Owner:
        """``Owner.for_step(run_id, step, ttl)`` with the current (latest renewed) lease expiry."""
        with self._lock:
            return Owner(self.run_id, self.step, self._expires)

    def start(self) -> Heartbeat:
        """The Lease now (synchronously: the step counts as live once this returns); the run's labels at once
        on the daemon thread (a large warm pool is hundreds of writes the step need not wait for: each label
        still holds the expiry its writer gave it), then a whole beat every ``interval_s`` there."""
        if self.identity is None:
            self.identity = detect_identity(self.api, self.namespace)
        expires = self._clock() + self.ttl_s
        lease_ok = self._renew_lease(expires)
        self._thread = threading.Thread(target=self._run, args=(expires, lease_ok), daemon=True,
                                        name=f"kfp-gpu-heartbeat-{self.step}")
        self._thread.start()
        return self

    def stop(self) -> None:
        """End the beats and release the Lease (holder cleared; expiry kept). Idempotent; never raises."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)  # a renewal in flight is bounded by the request timeout; do not hold a
            # terminating pod for it: a late renewal only re-records this (dying) pod as holder
        if self._released:
            return
        self._released = True
        try:
            self._write_lease(release=True)
        except Exception as exc:  # the janitor still sees the expiry; nothing to undo
            log.warning("heartbeat %s: could not release lease: %s", self.name, exc)

    def __enter__(self) -> Heartbeat:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def _run(self, first_expires: float, lease_ok: bool) -> None:
        if self._renew_labels(first_expires) and lease_ok:
            self.renewals += 1
        while not self._stop.wait(self.interval_s):
            self.renew()

    def renew(self) -> bool:
        """One beat: the Lease, then the labels. True when both succeeded. Raises: nothing."""
        expires = self._clock() + self.ttl_s
        ok = self._renew_lease(expires)
        ok = self._renew_labels(expires) and ok
        if ok:
            self.renewals += 1
        return ok

    def _renew_lease(self, expires: float) -> bool:
        try:
            self._write_lease(renew_at=expires - self.ttl_s)
            with self._lock:
                self._expires = max(self._expires, expires)
            return True
        except Exception as exc:
            return self._failed("lease", exc)

    def _renew_labels(self, expires: float) -> bool:
        try:
            self._raise_labels(expires)
            return True
        except Exception as exc:
            return self._failed("labels", exc)

    def _failed(self, what: str, exc: Exception) -> bool:
        self.failures += 1
        reason = f"{exc.status} {exc.reason}" if isinstance(exc, ApiException) else str(exc)
        self.last_error = f"{what}: {reason}"
        log.warning("heartbeat %s: renewing %s failed (%s); retrying in %.0fs", self.name, what, reason,
                    self.interval_s)
        return False

    def _raise_labels(self, expires: float) -> None:
        """Every object of the run, its lease label raised: one conditional patch each, concurrently (a warm
        pool of N nodes and N balloons is 2N writes; one after another they held the step's start for seconds)."""
        ann = {owned.NAMESPACE_ANNOTATION: f"{self.namespace}/{label_safe(self.run_id)}"}

        def of_kind(kind: owned.Kind) -> list[tuple[owned.Kind, owned.Obj]]:
            return list(owned.run_objects(self.api, self.namespace, self.run_id, (kind,)))

        listed = fanout.run_all([functools.partial(of_kind, kind) for kind in owned.LABELLED])  # lists at once
        fanout.run_all([functools.partial(owned.raise_lease_label, self.api, kind, obj, expires,
                                          annotations=ann if kind is owned.NODE else None)
                        for objs in listed for kind, obj in objs])

    def _write_lease(self, *, renew_at: float | None = None, release: bool = False) -> None:
        ident = self.identity or OwnerIdentity(holder="")
        path = owned.LEASE.path(self.namespace, self.name)
        for _ in range(4):
            try:
                cur: dict[str, Any] | None = owned.request(self.api, "GET", path)
            except ApiException as exc:
                if exc.status != 404:
                    raise
                cur = None
            if release and (cur is None or (cur.get("spec") or {}).get("holderIdentity") != ident.holder):
                return  # never started, or another holder (a retried pod) has taken it over: not ours to release
            body = self._lease_body(cur, ident, renew_at, release)
            try:
                if cur is None:
                    owned.request(self.api, "POST", owned.LEASE.path(self.namespace), body=body)
                else:
                    owned.request(self.api, "PUT", path, body=body)
                return
            except ApiException as exc:
                if exc.status != 409:  # conflict: someone wrote in between, read again
                    raise
        raise RuntimeError(f"lease {self.namespace}/{self.name}: conflict on every attempt")

    def _lease_body(self, cur: dict[str, Any] | None, ident: OwnerIdentity, renew_at: float | None,
                    release: bool) -> dict[str, Any]:
        spec = dict((cur or {}).get("spec") or {})
        meta: dict[str, Any] = owned.meta(cur) if cur else {"name": self.name, "namespace": self.namespace}
        ann: dict[str, Any] = {k: v for k, v in dict(meta.get("annotations") or {}).items() if k not in (A_POD, A_POD_UID,
                                                                                       A_WORKFLOW, A_LOCAL)}
        lbl = dict(meta.get("labels") or {})
        if release:
            spec["holderIdentity"] = None
            ann[A_RELEASED] = str(int(self._clock()))
            ann.update(ident.annotations())  # kept for the record; an unheld Lease is not checked for life
        else:
            now = self._clock() if renew_at is None else renew_at
            if spec.get("holderIdentity") != ident.holder:
                spec["acquireTime"] = _micro(now)
                spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + (1 if cur else 0)
            spec.update(holderIdentity=ident.holder, leaseDurationSeconds=max(1, round(self.ttl_s)),
                        renewTime=_micro(now))
            ann.pop(A_RELEASED, None)
            ann.update({A_RUN_ID: self.run_id, **ident.annotations()})
            lbl.update(Owner(self.run_id, self.step, now + self.ttl_s).labels())
            lbl[owned.RUN_LEASE_LABEL] = "true"
        meta.update(labels=lbl, annotations=ann)
        return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta, "spec": spec}


def lease_record(obj: dict[str, Any]) -> LeaseRecord:
    """A run Lease (API JSON) as the janitor's decision reads it."""
    spec = obj.get("spec") or {}
    dur = spec.get("leaseDurationSeconds")
    return LeaseRecord(name=str(owned.meta(obj).get("name", "")), holder=str(spec.get("holderIdentity") or ""),
                       renew_time=_ts(spec.get("renewTime")), duration_s=float(dur) if dur is not None else None,
                       owners=owner_refs(owned.meta(obj).get("annotations") or {}))


class JanitorLock:
    """The janitor's mutual exclusion: a Lease ``kfp-gpu-janitor`` in ``namespace``.

    ``acquire()`` takes it only when it is free (no holder) or expired (renewTime + duration passed), with a
    create / resourceVersion-conditional update, so of two janitors exactly one wins; the loser reads
    ``held_by``. ``renew()`` extends it between releases; ``release()`` clears the holder.
    """

    def __init__(self, api: client.ApiClient, namespace: str, holder: str = "", duration_s: int = 600,
                 clock: Callable[[], float] = time.time) -> None:
        self.api, self.namespace, self.duration_s, self._clock = api, namespace, int(duration_s), clock
        self.holder = holder or f"{socket.gethostname()}/{os.getpid()}/{uuid.uuid4().hex[:6]}"
        self.held_by = ""
        self.held_until: float | None = None

    @property
    def where(self) -> str:
        return f"lease {self.namespace}/{LOCK_NAME}"

    def acquire(self) -> bool:
        """True when this janitor now holds the lock. Raises: ApiException (other than 404/409)."""
        return self._write(take=True)

    def renew(self) -> bool:
        """Extend the lock; False when another janitor took it over. Raises: ApiException."""
        return self._write(take=False)

    def release(self) -> None:
        """Clear the holder if it is still us. Failures are logged (the lock then expires). Raises: nothing."""
        try:
            cur = owned.request(self.api, "GET", owned.LEASE.path(self.namespace, LOCK_NAME))
            if (cur.get("spec") or {}).get("holderIdentity") == self.holder:
                cur["spec"]["holderIdentity"] = None
                owned.request(self.api, "PUT", owned.LEASE.path(self.namespace, LOCK_NAME), body=cur)
        except ApiException as exc:
            log.warning("janitor lock %s: release failed (%s %s); it expires in %ss", self.where, exc.status,
                        exc.reason, self.duration_s)

    def _write(self, *, take: bool) -> bool:
        now = self._clock()
        path = owned.LEASE.path(self.namespace, LOCK_NAME)
        try:
            cur = owned.request(self.api, "GET", path)
        except ApiException as exc:
            if exc.status != 404:
                raise
            cur = {}
        spec = dict(cur.get("spec") or {})
        holder = str(spec.get("holderIdentity") or "")
        renewed, dur = _ts(spec.get("renewTime")), spec.get("leaseDurationSeconds")
        mine = holder == self.holder
        if not (mine or (take and lock_free(holder, renewed, float(dur) if dur is not None else None,
                                            self.holder, now))):
            self.held_by, self.held_until = holder, (renewed or 0) + float(dur or 0)
            return False
        if not mine:
            spec.update(acquireTime=_micro(now), leaseTransitions=int(spec.get("leaseTransitions") or 0) + bool(cur))
        spec.update(holderIdentity=self.holder, leaseDurationSeconds=self.duration_s, renewTime=_micro(now))
        meta = owned.meta(cur) if cur else {"name": LOCK_NAME, "labels": {LABEL_MANAGED: "true"}}
        body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta, "spec": spec}
        try:
            if cur:
                owned.request(self.api, "PUT", path, body=body)
            else:
                owned.request(self.api, "POST", owned.LEASE.path(self.namespace), body=body)
        except ApiException as exc:
            if exc.status != 409:
                raise
            try:
                again = owned.request(self.api, "GET", path).get("spec") or {}
            except ApiException:
                again = {}
            self.held_by = str(again.get("holderIdentity") or "another janitor")
            self.held_until = (_ts(again.get("renewTime")) or 0) + float(again.get("leaseDurationSeconds") or 0)
            return False
        self.held_by, self.held_until = self.holder, now + self.duration_s
        return True


def delete_run_leases(api: client.ApiClient, namespace: str | None, run_id: str) -> list[str]:
    """Delete the run Leases of ``run_id`` (in every namespace when None). Raises: ApiException."""
    gone = []
    for obj in owned.list_objects(api, owned.LEASE, namespace, owned.run_selector(owned.LEASE, run_id)):
        if owned.delete(api, owned.LEASE, obj):
            gone.append(owned.ident(owned.LEASE, obj))
    return gone

