"""The kopf handlers and ``kfp-gpu controller``.

Per GpuGang: a daemon (a thread that lives as long as the object and this replica's lease on it) turning the gang's
:class:`~kfp_gpu.controller.runner.Runner`, and a deletion handler behind kopf's finalizer ``kfp-gpu.io/release``
that cancels the gang's work and runs the release to the end before the object may go. A daemon stopped because the
controller exits (upgrade, ``kill``) leaves the work to the next replica: its children are killed without
cleaning up (SIGKILL, as ``kill -9`` of the controller would), and the next controller re-attaches through the
steps' ledgers. kopf's own state lives in annotations (``kfp-gpu.io/``), never in ``status``, which is ours.
Two replicas: kopf peering (``--peering``) keeps one active; ``--standalone`` for a single local process. The
peering object is always the ClusterKopfPeering named by ``--peering``, also for a controller run with
``--namespace`` (kopf's cluster-wide peering for a namespaced operator): the controller's RBAC grants that object,
not KopfPeerings in the tenants' namespaces. A replica's peer record is its pod name and lives
:data:`PEERING_LIFETIME_S`: a standby takes over at most that long after the active replica is ``kill -9``-ed.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import socket
from pathlib import Path
from typing import Any

import kopf

from kfp_gpu.cluster import ledger
from kfp_gpu.controller import metrics
from kfp_gpu.controller.runner import Obj, Runner, post_event
from kfp_gpu.gang import api as gang
from kfp_gpu.ownership import RELEASE_FINALIZER

log = logging.getLogger(__name__)
# kopf re-announces a live replica 5-10 s before its record expires (kopf.PeeringSettings.lifetime, default 60 s);
# 15 s is Kubernetes' own leader-election lease (kube-controller-manager --leader-elect-lease-duration): a killed
# active replica is replaced within 15 s instead of kopf's 60
PEERING_LIFETIME_S = 15
TURN_S = 0.5  # at the latest: a watch event of the gang or a unit's end wakes its loop at once (Runner.wake)
_runners: dict[tuple[str, str], Runner] = {}
_state: dict[str, Any] = {}


def _api() -> Any:
    if "api" not in _state:
        from kfp_gpu.cluster.kube import api_client

        _state["api"] = api_client(check=False)
    return _state["api"]


def _runner(namespace: str, name: str) -> Runner:
    key = (namespace, name)
    if key not in _runners:
        _runners[key] = Runner(_api(), namespace, name, _event, Path(_state.get("log_dir") or "/tmp/kfp-gpu-controller"))
    return _runners[key]


def _event(obj: Obj, etype: str, reason: str, message: str) -> None:
    meta = obj.get("metadata") or {}
    log.info("%s/%s %s: %s", meta.get("namespace"), meta.get("name"), reason, message)
    post_event(_api(), obj, etype, reason, message)


def _identity() -> str:
    """This replica's name in the peering record: its pod (``POD_NAME``), else host and pid."""
    return os.environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}"


@kopf.on.startup()
def _configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    settings.persistence.finalizer = RELEASE_FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="kfp-gpu.io")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix="kfp-gpu.io")
    settings.posting.level = logging.INFO
    settings.execution.max_workers = int(os.environ.get("KFP_GPU_CONTROLLER_WORKERS", "256"))
    settings.watching.server_timeout = 300
    settings.peering.clusterwide = True  # the ClusterKopfPeering also when run with --namespace (module docstring)
    settings.peering.lifetime = PEERING_LIFETIME_S
    settings.peering.stealth = True  # no keep-alive line every few seconds; pauses and resumes are still logged
    # kopf freezes every peer of the highest priority when two share it: each replica gets its own (from its pod
    # name), so exactly one is active and the other takes over when the active one's peering record expires
    settings.peering.priority = 1 + int(hashlib.sha256(_identity().encode()).hexdigest()[:6], 16)


# cancellation_backoff: on the gang's deletion kopf sets ``stopped`` and looks again after the backoff (the loop sees
# it within TURN_S and exits); without one it cancels at once and looks again only after cancellation_timeout, which
# held each deleted gang's finalizer ~30 s in a long-lived controller (measured: teardown 2 s -> 32 s)
@kopf.daemon(gang.GROUP, gang.VERSION, gang.PLURAL, cancellation_backoff=2 * TURN_S + 0.5,  # type: ignore[arg-type]
             cancellation_timeout=30.0)
def gang_daemon(stopped: kopf.DaemonStopped, body: kopf.Body, namespace: str, name: str, **_: Any) -> None:
    runner = _runner(namespace, name)
    with runner.lock:  # a (re)started daemon reads the status afresh: while this replica was paused (peering), the
        runner.status = None  # other one wrote it, and this replica's copy from before the pause is stale
    while not stopped:
        obj: Obj = json.loads(json.dumps(dict(body)))
        if (obj.get("metadata") or {}).get("deletionTimestamp"):
            break
        runner.wake.clear()
        try:
            runner.turn(obj)
        except Exception as exc:  # noqa: BLE001 - one failed turn (API hiccup) is retried on the next
            log.warning("gang %s/%s: turn failed: %s", namespace, name, exc)
            stopped.wait(1.0)
        runner.wake.wait(TURN_S)
    deleting = stopped.reason is not None and kopf.DaemonStoppingReason.RESOURCE_DELETED in stopped.reason
    if not deleting:  # the controller exits: leave the work to the next one (as kill -9 would)
        with runner.lock:
            for w in runner.work.values():
                w.kill()
            runner.work.clear()


@kopf.on.event(gang.GROUP, gang.VERSION, gang.PLURAL)  # type: ignore[arg-type]
def gang_event(namespace: str, name: str, **_: Any) -> None:
    """Any change of a gang (a step raised its stage, asked for a job, beat): its loop turns now."""
    runner = _runners.get((namespace, name))
    if runner is not None:
        runner.wake.set()


@kopf.on.delete(gang.GROUP, gang.VERSION, gang.PLURAL)  # type: ignore[arg-type]
def gang_deleted(body: kopf.Body, namespace: str, name: str, **_: Any) -> None:
    obj: Obj = json.loads(json.dumps(dict(body)))
    runner = _runner(namespace, name)
    out = runner.release_now(obj, "the GpuGang is being deleted")
    if out is not None and not out.ok:
        raise kopf.TemporaryError(f"release failed: {(out.error or {}).get('message')}", delay=5)
    _runners.pop((namespace, name), None)
    metrics.forget(namespace, name)


def run(namespaces: list[str], *, standalone: bool, peering: str = "", metrics_port: int = 8080,
        log_dir: str = "", liveness: str = "") -> None:
    """Run the controller until SIGTERM/SIGINT. ``namespaces`` empty: every namespace (cluster-wide)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("kopf").setLevel(logging.WARNING)  # kopf's per-event lines; the gangs' decisions are ours
    # but a replica pausing for its peer, and resuming when the peer's record expired, is the operator's business
    logging.getLogger("kopf._core.engines.peering").setLevel(logging.INFO)
    _state["log_dir"] = log_dir or os.environ.get("KFP_GPU_CONTROLLER_LOGS", "/tmp/kfp-gpu-controller")
    # the step ledgers live in the controller's own namespace, out of tenants' reach (kfp_gpu/cluster/ledger.py);
    # set before the first work unit forks, so every unit inherits it
    os.environ.setdefault(ledger.HOME_ENV, os.environ.get("POD_NAMESPACE") or gang.CONTROLLER_NAMESPACE)
    _api()
    if metrics_port:
        metrics.serve(metrics_port)
    os.environ.setdefault("POD_ID", _identity())  # kopf's peer identity (kopf reads POD_ID): the pod's name
    kopf.run(standalone=standalone, peering_name=peering or None, namespaces=namespaces,
             clusterwide=not namespaces, liveness_endpoint=liveness or None)
