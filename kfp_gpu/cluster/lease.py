"""Who owns a run, and the janitor's lock.

:func:`detect_identity` names the live owner of the step that creates a run's GpuGang: the step pod (``namespace/name``
and uid, from the downward-API variables KFP sets: ``KFP_POD_NAME``, ``KFP_POD_UID``), its Argo Workflow (the pod's
``workflows.argoproj.io/workflow`` label), or ``local:<host>:<pid>`` outside a pod. The gang records it in
``spec.owner``, and the controller releases the gang once that owner is gone (:mod:`kfp_gpu.controller.owners`):
no heartbeat, no lease to wait out.

Runs of versions before the controller held per-step ``coordination.k8s.io/v1`` Leases; the janitor
(:mod:`kfp_gpu.steps.janitor`) still reads those (:func:`lease_record`) and deletes them with their run
(:func:`delete_run_leases`). :class:`JanitorLock` keeps two janitors from sweeping at once.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kfp_gpu.cluster import owned
from kfp_gpu.errors import NotFound
from kfp_gpu.ownership import LABEL_MANAGED, label_safe
from kfp_gpu.plan.lease import LOCAL_OWNER, POD_OWNER, WORKFLOW_OWNER, LeaseRecord, OwnerRef, lock_free

log = logging.getLogger(__name__)

ARGO_WORKFLOW_LABEL = "workflows.argoproj.io/workflow"  # Argo labels every workflow pod with its workflow
SA_NAMESPACE_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
A_POD, A_POD_UID, A_WORKFLOW, A_LOCAL = ("kfp-gpu.io/owner-pod", "kfp-gpu.io/owner-pod-uid",
                                         "kfp-gpu.io/owner-workflow", "kfp-gpu.io/owner-local")
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
            if exc.status == 404 and not cur:  # POST to a namespace that does not exist
                raise NotFound(f"namespace {self.namespace!r} does not exist (the janitor lock {self.where} lives there)",
                               remediation="pass --lock-namespace NS (or --namespace NS) of an existing namespace: "
                               "kubectl get namespaces") from None
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

