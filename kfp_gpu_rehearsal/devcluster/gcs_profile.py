"""The GCS profile of the dev cluster: the real ``fake-gcs-server`` emulator (built by :mod:`kfp_gpu_rehearsal.devcluster.gcs`)
serving the GCS JSON API for gs:// checkpoints.

``python -m kfp_gpu_rehearsal.devcluster up --with gcs`` (``up --gcs``, ``make cluster-up GCS=1``) runs it as a managed process
of the dev cluster: pid, args and log in the state dir (``fake-gcs-server.{pid,args,log}``), shown by ``status``,
stopped by ``down`` (``down --only gcs``), re-used by a later ``up`` while healthy. A plain ``up`` leaves a running
emulator alone.

How it runs: ``-scheme http`` on ``127.0.0.1:<port>``, the in-memory backend (objects last as long as the process;
tests make a fresh bucket each), ``-public-host``/``-external-url`` set to that address so resumable-upload URLs
point back at it. The port is ``$KFP_GPU_GCS_PORT`` when set, else a free port chosen at the first start and kept in
``fake-gcs-server.json`` with the URL (:func:`url` reads it: that file is how tools find the emulator).

Point google-cloud-storage at it with ``STORAGE_EMULATOR_HOST=<url>`` (:func:`env`); kfp-gpu's gs:// backend then
uses anonymous credentials (:func:`kfp_gpu.checkpoint.backends.gcs_client`). The emulator checks no IAM: a
permission-denied path cannot be shown against it (missing buckets and objects behave like GCS: 404).
"""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import replace
from pathlib import Path

from . import gcs, procs, runner
from .runner import Component, Ctx
from .versions import cluster_dir

NAME = gcs.NAME  # component name: fake-gcs-server.{pid,args,log,json} in the state dir
PORT_KEY = "gcs"
PORT_ENV = "KFP_GPU_GCS_PORT"
EMULATOR_ENV = "STORAGE_EMULATOR_HOST"


def record_file(state: Path) -> Path:
    """Where the emulator's URL and port are recorded (``{"url": ..., "port": ...}``)."""
    return state / f"{NAME}.json"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def port(state: Path) -> int:
    """``$KFP_GPU_GCS_PORT``, else the recorded port (while our emulator runs on it, or it is free), else a free one
    (recorded by :func:`up`)."""
    if os.environ.get(PORT_ENV):
        return int(os.environ[PORT_ENV])
    try:
        recorded = int(json.loads(record_file(state).read_text())["port"])
    except (OSError, ValueError, KeyError, TypeError):
        return _free_port()
    if procs.running_pid(state, NAME, gcs.binary()) is not None or not procs.port_in_use(recorded):
        return recorded
    return _free_port()


def base_url(p: int) -> str:
    return f"http://127.0.0.1:{p}"


def _argv(c: Ctx) -> list[str]:
    u = base_url(c.ports[PORT_KEY])
    return [str(c.bins[NAME]), "-scheme", "http", "-host", "127.0.0.1", "-port", str(c.ports[PORT_KEY]),
            "-backend", "memory", "-public-host", u.removeprefix("http://"), "-external-url", u,
            "-log-level", "warn"]


def _healthy(c: Ctx) -> bool:
    return procs.http_ok(base_url(c.ports[PORT_KEY]) + "/_internal/healthcheck")


COMPONENT = Component(NAME, (PORT_KEY,), _argv, _healthy, timeout=30.0, stop_timeout=10.0,
                      detail=lambda c: base_url(c.ports[PORT_KEY]),
                      after=lambda c: _record(c))


def context(c: Ctx) -> Ctx:
    """``c`` with the emulator's binary and port (kept out of the core components' state.json ports).

    Raises: gcs.GcsEmulatorError (no version pinned).
    """
    return replace(c, bins={**c.bins, NAME: gcs.binary()}, ports={**c.ports, PORT_KEY: port(c.state)})


def prepare(c: Ctx) -> Ctx:
    """:func:`context`, after checking the binary. Raises: procs.BootError (missing), gcs.GcsEmulatorError."""
    cx = context(c)
    runner.require_binaries(cx, (NAME,), "`make cluster-build GCS=1` (python -m kfp_gpu_rehearsal.devcluster build --with gcs)")
    return cx


def _record(c: Ctx) -> str:
    """Record the URL (how tools find the emulator); the note of its [up] line."""
    u = base_url(c.ports[PORT_KEY])
    record_file(c.state).write_text(json.dumps({"url": u, "port": c.ports[PORT_KEY]}) + "\n")
    return f" on {u} ({EMULATOR_ENV}={u})"


UNIT = runner.Unit("gcs", (COMPONENT,), off_hint="up --gcs starts it", context=context, prepare=prepare)


def running_pid(c: Ctx) -> int | None:
    return runner.pids(c, UNIT).get(NAME)


def url(state: Path | None = None) -> str | None:
    """The URL of the running emulator (recorded by :func:`up`), or None when it is not running."""
    st = state or cluster_dir()
    try:
        u = str(json.loads(record_file(st).read_text())["url"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return u if procs.running_pid(st, NAME, gcs.binary()) is not None else None


def env(state: Path | None = None) -> dict[str, str]:
    """``{"STORAGE_EMULATOR_HOST": url}`` while the emulator runs (for trainer processes, pods, tests), else ``{}``."""
    u = url(state)
    return {EMULATOR_ENV: u} if u else {}


def ensure_up() -> str:
    """Start (or re-use) the emulator alone, as ``up --with gcs`` would (the control plane is not needed for it);
    returns its URL.

    Raises: procs.BootError (binary missing, not healthy), gcs.GcsEmulatorError (no version pinned).
    """
    from . import boot

    c = boot._ctx()
    with runner.locked(c.state):
        runner.up(c, UNIT, True, {}, time.monotonic())
    u = url(c.state)
    if u is None:
        raise procs.BootError(f"{NAME} is not running after up; see {c.state / (NAME + '.log')}")
    return u
