"""The kopf handlers and ``kfp-gpu controller``.

Per GpuGang: a daemon (a thread that lives as long as the object) turning the gang's
:class:`~kfp_gpu.controller.runner.Runner`, and a deletion handler behind kopf's finalizer ``kfp-gpu.io/release``
that cancels the gang's work and runs the release to the end before the object may go. A daemon stopped because the
controller exits (upgrade, ``kill``) leaves the work to the next replica: its children are killed without
cleaning up (SIGKILL, as ``kill -9`` of the controller would), and the next controller re-attaches through the
steps' ledgers. kopf's own state lives in annotations (``kfp-gpu.io/``), never in ``status``, which is ours.

Two replicas: a ``coordination.k8s.io/v1`` Lease elects the leader (:mod:`kfp_gpu.controller.election`, client-go
semantics), and kopf runs **only in the leader**, started once the Lease is held, as controller-runtime starts its
manager's controllers only after winning the election. A standby runs no handler, no daemon and no work unit; it
only polls the Lease. kopf peering is gone: it is not a lock (https://docs.kopf.dev/en/stable/peering/: an operator
pauses when it *notices* a peer of higher priority, so both act until it does: under a second at a start on the dev
cluster), and with kopf in the leader alone there is nothing left for it to pause. A leader that loses the Lease (another holder, or no renewal within the renew deadline) kills
every work unit and exits (:func:`_lost`, controller-runtime's "leader election lost"); its pod restarts as a new
candidate. ``renew deadline < lease duration`` makes it stop before any other replica may acquire. A clean exit
(SIGTERM) stops the work, then releases the Lease so the standby takes over at its next round. ``--standalone`` (a
single local process: ``kfp-gpu run``, the tests) holds no Lease and starts at once.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
from pathlib import Path
from typing import Any

import kopf

from kfp_gpu.cluster import ledger
from kfp_gpu.controller import election, metrics, work
from kfp_gpu.controller.runner import Obj, Runner, post_event
from kfp_gpu.gang import api as gang
from kfp_gpu.ownership import RELEASE_FINALIZER
from kfp_gpu.plan.election import DEFAULT, Timings

log = logging.getLogger(__name__)
SHUTDOWN_GRACE_S = 2.0  # SIGTERM: how long kopf may take to stop before the Lease is released and the process exits
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


def _kill_all_work() -> None:
    """Fence this replica (no unit starts, no outcome is recorded, no status is written: :data:`work.FENCE`), then
    SIGKILL every work unit of every gang and the forkserver they are forked from (a unit it is forking right now
    dies with it: ``PR_SET_PDEATHSIG``). No cleanup: the next leader re-attaches through the steps' ledgers."""
    work.FENCE.set()
    for _ in range(3):  # the dicts may change under us (a daemon's turn): copy, and go round again
        try:
            units = [w for r in list(_runners.values()) for w in list(r.work.values())]
            break
        except RuntimeError:
            continue
    else:
        units = []
    for w in units:
        if w.proc.exitcode is None:
            w.proc.kill()
    from multiprocessing import forkserver

    pid = getattr(getattr(forkserver, "_forkserver", None), "_forkserver_pid", None)
    if isinstance(pid, int):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    for w in units:
        w.proc.join(5)


def _lost(reason: str) -> None:
    """Leadership is lost: stop all work before the Lease can expire for the other replica, then exit (1)."""
    _kill_all_work()
    log.error("leader election lost (%s): every work unit stopped; exiting", reason)
    logging.shutdown()
    os._exit(1)


@kopf.on.startup()
def _configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    settings.persistence.finalizer = RELEASE_FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="kfp-gpu.io")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix="kfp-gpu.io")
    settings.posting.level = logging.INFO
    settings.execution.max_workers = int(os.environ.get("KFP_GPU_CONTROLLER_WORKERS", "256"))
    settings.watching.server_timeout = 300


# cancellation_backoff: on the gang's deletion kopf sets ``stopped`` and looks again after the backoff (the loop sees
# it within TURN_S and exits); without one it cancels at once and looks again only after cancellation_timeout, which
# held each deleted gang's finalizer ~30 s in a long-lived controller (measured: teardown 2 s -> 32 s)
@kopf.daemon(gang.GROUP, gang.VERSION, gang.PLURAL, cancellation_backoff=2 * TURN_S + 0.5,  # type: ignore[arg-type]
             cancellation_timeout=30.0)
def gang_daemon(stopped: kopf.DaemonStopped, body: kopf.Body, namespace: str, name: str, **_: Any) -> None:
    runner = _runner(namespace, name)
    with runner.lock:  # a (re)started daemon reads the status afresh
        runner.status = None
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


def run(namespaces: list[str], *, standalone: bool, lease: str = election.LEASE_NAME, lease_namespace: str = "",
        timings: Timings = DEFAULT, metrics_port: int = 8080, log_dir: str = "", liveness: str = "") -> None:
    """Run the controller until SIGTERM/SIGINT. ``namespaces`` empty: every namespace (cluster-wide). Unless
    ``standalone``, first win the Lease ``lease_namespace/lease`` (module docstring).
    Raises: KfpGpuError (bad timings; the Lease refused)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("kopf").setLevel(logging.WARNING)  # kopf's per-event lines; the gangs' decisions are ours
    logging.getLogger("kopf._core.reactor.running").setLevel(logging.ERROR)  # "OS signals are ignored": ours
    _state["log_dir"] = log_dir or os.environ.get("KFP_GPU_CONTROLLER_LOGS", "/tmp/kfp-gpu-controller")
    home = os.environ.get("POD_NAMESPACE") or gang.CONTROLLER_NAMESPACE
    # the step ledgers live in the controller's own namespace, out of tenants' reach (kfp_gpu/cluster/ledger.py);
    # set before the first work unit forks, so every unit inherits it
    os.environ.setdefault(ledger.HOME_ENV, home)
    elector = None if standalone else election.LeaderElector(_api(), lease_namespace or home, lease, timings=timings,
                                                             on_renew=work.hold_until)
    # SIGTERM/SIGINT are this thread's at every moment (a standby waiting, a leader starting kopf, kopf running):
    # kopf runs in a thread of its own with this flag as its stop (https://docs.kopf.dev/en/stable/embedding/),
    # so a stop that lands while kopf starts up cannot leave it retrying its first requests for a minute
    stopping = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stopping.set())
    if metrics_port:
        metrics.serve(metrics_port)
    if elector is not None:
        if not elector.acquire(stopping):
            return
        elector.keep(_lost)
    failed: list[BaseException] = []

    def operate() -> None:
        try:
            kopf.run(standalone=True, namespaces=namespaces, clusterwide=not namespaces,
                     liveness_endpoint=liveness or None, stop_flag=stopping)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the main thread
            failed.append(exc)

    operator = threading.Thread(target=operate, name="kopf", daemon=True)
    operator.start()
    try:
        while not stopping.wait(0.2) and operator.is_alive():
            pass
    finally:
        _kill_all_work()  # fenced and killed: nothing acts from here, whatever kopf still does
        operator.join(SHUTDOWN_GRACE_S)  # kopf stops its daemons and watches
        if elector is not None:
            elector.release()
    if operator.is_alive():  # kopf did not stop in time: its executor threads would keep the process up
        log.warning("kopf did not stop within %ss; exiting", SHUTDOWN_GRACE_S)
        logging.shutdown()
        os._exit(0)
    if failed:
        raise failed[0]
