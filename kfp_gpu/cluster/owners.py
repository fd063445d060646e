"""Is a recorded run owner (a step pod, an Argo Workflow, a local process) still alive? Used by the janitor and by
the controller's owner-gone release. Verdicts are :class:`~kfp_gpu.plan.lease.OwnerState`; the rules are the pure
functions of :mod:`kfp_gpu.plan.lease`."""

from __future__ import annotations

import json
import logging
import os
import socket

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kfp_gpu.cluster import owned
from kfp_gpu.plan.lease import (
    LOCAL_OWNER,
    POD_OWNER,
    OwnerRef,
    OwnerState,
    local_state,
    pod_state,
    workflow_state,
)

log = logging.getLogger(__name__)
ARGO = "/apis/argoproj.io/v1alpha1"


class Owners:
    """Is a recorded owner alive? Cached per instance (a janitor pass); an API error other than 404 is UNKNOWN."""

    def __init__(self, api: client.ApiClient) -> None:
        self.api = api
        self._cache: dict[OwnerRef, OwnerState] = {}
        self._argo: bool | None = None

    def state(self, owner: OwnerRef) -> OwnerState:
        if owner not in self._cache:
            self._cache[owner] = self._check(owner)
        return self._cache[owner]

    def _check(self, owner: OwnerRef) -> OwnerState:
        if owner.kind == LOCAL_OWNER:
            return local_state(owner.ref, socket.gethostname(), pid_alive)
        ns, _, name = owner.ref.partition("/")
        try:
            if owner.kind == POD_OWNER:
                pod = owned.request(self.api, "GET", f"/api/v1/namespaces/{ns}/pods/{name}")
                return pod_state(True, (pod.get("status") or {}).get("phase"),
                                 str(owned.meta(pod).get("uid", "")), owner.uid)
            if not self._argo_served():
                return OwnerState.GONE  # no Workflow CRD: nothing can be running there
            wf = owned.request(self.api, "GET", f"{ARGO}/namespaces/{ns}/workflows/{name}")
            st = wf.get("status") or {}
            return workflow_state(True, st.get("phase"), st.get("finishedAt"),
                                  owned.labels(wf).get("workflows.argoproj.io/completed"))
        except ApiException as exc:
            if exc.status == 404 and _names(exc, name):
                return OwnerState.GONE  # the object is gone (not: the resource was not served at that moment)
            log.warning("janitor: cannot check owner %s: %s %s", owner, exc.status, exc.reason)
            return OwnerState.UNKNOWN

    def _argo_served(self) -> bool:
        if self._argo is None:
            try:
                res = owned.request(self.api, "GET", ARGO).get("resources") or []
                self._argo = any(r.get("name") == "workflows" for r in res)
            except ApiException as exc:
                if exc.status != 404:
                    raise
                self._argo = False
        return self._argo


def _names(exc: ApiException, name: str) -> bool:
    """Whether a 404 says that object ``name`` does not exist (its Status names it)."""
    try:
        return bool((json.loads(exc.body or "{}").get("details") or {}).get("name") == name)
    except (ValueError, AttributeError):
        return False


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` runs on this host (a zombie, killed but not yet reaped, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True
