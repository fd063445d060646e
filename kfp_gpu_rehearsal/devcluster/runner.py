"""The one component runner of the dev cluster: start, stop, status and fingerprint of every process, from one table.

A **process** (:class:`Component`) is a binary with its argv, environment, ports and health probe; its pid, args
(the fingerprint) and log live in the state dir as ``<name>.{pid,args,log}``. A **unit** (:class:`Unit`) is what
``up --with NAME`` / ``down --only NAME`` select: one or more processes started in order and stopped in reverse,
with what has to happen around them (CRDs and config files before, webhooks after, webhooks removed before a stop).
The table of units is :data:`kfp_gpu_rehearsal.devcluster.table.UNITS` (etcd ... Training Operator, cluster-autoscaler,
JobSet + Trainer, Kueue, fake-gcs-server, Karpenter, the kfp-gpu controller); every profile module holds only what is particular to it.

Rules every unit gets from here, not from its own copy:

- ``start``: a process already running with the same fingerprint and healthy is re-used ("running"); one running
  with other flags, or unhealthy, is restarted; the ports are checked free before a start ("started").
- a unit not wanted is left running when it runs (another session may have started it); when it does not run, the
  state it leaves behind that would refuse others' objects (webhook configurations) is removed.
- ``stop``: what would point at a stopped process goes first (webhooks), then the processes in reverse order.
- ``status``: ``running pid=N healthy|UNHEALTHY`` per process, or ``stopped (profile off; <hint>)``.

Only processes recorded in our own pid files are signalled, after checking their command line
(:mod:`kfp_gpu_rehearsal.devcluster.procs`).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from . import procs
from .procs import BootError
from .versions import Versions


@dataclass
class Ctx:
    state: Path
    pki: Path
    bins: dict[str, Path]
    ports: dict[str, int]
    versions: Versions

    @property
    def kubeconfig(self) -> Path:
        return self.state / "kubeconfig"

    def unit_dir(self, unit: str) -> Path:
        """A unit's own files (config, certs) under the state dir."""
        return self.state / unit


@dataclass(frozen=True)
class Component:
    """One process: ``argv``/``env``/``healthy`` read the context the unit's ``context`` made (its binary is
    ``c.bins[name]``, its ports ``c.ports[k]`` for ``port_keys``)."""

    name: str
    port_keys: tuple[str, ...]
    argv: Callable[[Ctx], list[str]]
    healthy: Callable[[Ctx], bool]
    timeout: float = 60.0
    env: Callable[[Ctx], dict[str, str]] | None = None
    stop_timeout: float = 15.0
    detail: Callable[[Ctx], str] | None = None  # what the status line adds after the pid (e.g. a URL)
    before: Callable[[Ctx], None] | None = None  # runs before the process is ensured (e.g. CRDs it needs)
    after: Callable[[Ctx], str] | None = None  # runs once it is healthy; returns a note for the [up] line


def _same(c: Ctx) -> Ctx:
    return c


@dataclass(frozen=True)
class Unit:
    """One row of the table. ``context`` adds the unit's binaries and ports without side effects (status and stop
    use it); ``prepare`` also checks the binaries and installs what the processes need (CRDs, config files) and
    returns the context; ``after`` runs once every process is healthy; ``cleanup`` removes what would refuse
    others' objects once the processes are gone (webhook configurations) and returns the names removed."""

    name: str
    processes: tuple[Component, ...]
    off_hint: str = ""  # how to start it, for the status line of a stopped optional unit
    context: Callable[[Ctx], Ctx] = _same
    prepare: Callable[[Ctx], Ctx] | None = None
    after: Callable[[Ctx], str] | None = None
    cleanup: Callable[[Ctx], list[str]] | None = None
    optional: bool = True


def env_ports(table: Mapping[str, tuple[str, int]]) -> dict[str, int]:
    """Port name -> the port: the environment variable of each row when set, else its default."""
    return {k: int(os.environ.get(env, default)) for k, (env, default) in table.items()}


def extend(c: Ctx, bins: Mapping[str, Path], port_table: Mapping[str, tuple[str, int]]) -> Ctx:
    """``c`` with a unit's binaries and ports (:func:`env_ports` of ``port_table``), kept out of the core's
    state.json ports."""
    return replace(c, bins={**c.bins, **bins}, ports={**c.ports, **env_ports(port_table)})


def require_binaries(c: Ctx, names: tuple[str, ...], build: str) -> None:
    """Raises: BootError naming the missing binaries and the command ``build`` that makes them."""
    missing = [str(c.bins[n]) for n in names if not c.bins[n].exists()]
    if missing:
        raise BootError(f"{', '.join(missing)} missing: run {build}")


def ensure_running(unit: Unit, **up_args: Any) -> tuple[Ctx, dict[str, int]]:
    """Boot (or re-use) the dev cluster with ``unit`` running (``boot.up(**up_args)``); the context and the pids of
    its processes (what the test fixtures hand out).

    Raises: BootError naming the logs when a process of ``unit`` is not running after up; what ``boot.up`` raises.
    """
    from . import boot

    c = boot.up(**up_args)
    running = pids(c, unit)
    missing = [p.name for p in unit.processes if p.name not in running]
    if missing:
        raise BootError(f"{', '.join(missing)} not running after up; see "
                        + " and ".join(str(c.state / f"{n}.log") for n in missing))
    return c, running


def fingerprint(argv: list[str], env: dict[str, str] | None = None) -> str:
    """argv plus the content hash of any --config file (so editing stages.yaml restarts KWOK), plus the env.

    A config file counts by name and content, not by directory: two checkouts of the same commit (a CI
    clone beside the working tree) share one running cluster instead of restarting KWOK under each other.
    """
    lines = []
    for a in [*argv, *(f"# env {k}={v}" for k, v in sorted((env or {}).items()))]:
        if a.startswith("--config="):
            f = Path(a.split("=", 1)[1])
            digest = hashlib.sha256(f.read_bytes()).hexdigest() if f.exists() else "-"
            lines.append(f"--config={f.name} sha256 {digest}")
        else:
            lines.append(a)
    return "\n".join(lines)


def component_fingerprint(c: Ctx, comp: Component) -> str:
    return fingerprint(comp.argv(c), comp.env(c) if comp.env else {})


def recorded_fingerprint(c: Ctx, comp: Component) -> str | None:
    """The fingerprint the running process was started with (None when never started here)."""
    try:
        return (c.state / f"{comp.name}.args").read_text()
    except OSError:
        return None


def pid(c: Ctx, comp: Component) -> int | None:
    return procs.running_pid(c.state, comp.name, c.bins[comp.name])


def ensure(c: Ctx, comp: Component) -> str:
    """Start ``comp`` unless our instance is already running with the same fingerprint and healthy: "running" or
    "started". Raises: BootError (ports taken, not healthy within ``comp.timeout``, exited)."""
    binary, log = c.bins[comp.name], c.state / f"{comp.name}.log"
    argv = comp.argv(c)
    env = comp.env(c) if comp.env else {}
    fp = fingerprint(argv, env)
    args_file = c.state / f"{comp.name}.args"
    running = procs.running_pid(c.state, comp.name, binary)
    if running is not None and args_file.exists() and args_file.read_text() != fp:
        print(f"[up] {comp.name} (pid {running}) runs with other flags; restarting it", flush=True)
        procs.stop(c.state, comp.name, binary, comp.stop_timeout)
        running = None
    if running is not None:
        try:
            procs.wait_for(comp.name, lambda: comp.healthy(c), timeout=10.0)
            return "running"
        except BootError:
            print(f"[up] {comp.name} (pid {running}) is unhealthy; restarting it", flush=True)
            procs.stop(c.state, comp.name, binary, comp.stop_timeout)
    else:
        procs.pid_file(c.state, comp.name).unlink(missing_ok=True)
    procs.check_ports_free(comp.name, [c.ports[k] for k in comp.port_keys])
    new_pid = procs.start(c.state, comp.name, argv, env)
    args_file.write_text(fp)
    procs.wait_for(comp.name, lambda: comp.healthy(c), comp.timeout, log, alive=lambda: procs.is_alive(new_pid))
    return "started"


def pids(c: Ctx, unit: Unit) -> dict[str, int]:
    """The unit's processes that run (name -> pid)."""
    cx = unit.context(c)
    return {p.name: n for p in unit.processes if (n := pid(cx, p)) is not None}


def up(c: Ctx, unit: Unit, wanted: bool, status: dict[str, str], t0: float) -> None:
    """Start (or re-use) ``unit`` when ``wanted``; otherwise leave it running when it runs, else clean up what a
    stopped one left. Fills ``status`` (process name -> "started"/"running") and prints one [up] line per process.

    Raises: BootError, and whatever the unit's prepare/after raise (its own error types).
    """
    if wanted:
        cx = unit.prepare(c) if unit.prepare else unit.context(c)
        for comp in unit.processes:
            if comp.before:
                comp.before(cx)
            status[comp.name] = ensure(cx, comp)
            note = comp.after(cx) if comp.after else ""
            print(f"[up] {comp.name}: {status[comp.name]}{note} ({time.monotonic() - t0:.1f}s)", flush=True)
        if unit.after:
            note = unit.after(cx)
            if note:
                print(f"[up] {unit.name}: {note} ({time.monotonic() - t0:.1f}s)", flush=True)
    elif pids(c, unit):
        print(f"[up] {unit.name}: left running (started by an earlier up; `down --only {unit.name}` stops it)",
              flush=True)
    elif unit.cleanup and unit.cleanup(unit.context(c)):
        print(f"[up] {unit.name}: not running; removed its stale webhook configurations", flush=True)


def stop(c: Ctx, unit: Unit) -> bool:
    """Remove what would point at the stopped processes (``cleanup``), then stop them in reverse order. True if
    any was running. Raises: nothing for a cleanup the API server cannot answer (it may be gone already)."""
    cx = unit.context(c)
    if unit.cleanup:
        try:
            unit.cleanup(cx)
        except Exception as e:  # noqa: BLE001 - the API server may already be gone (down after a crash)
            print(f"[down] {unit.name}: could not remove its webhook configurations: {str(e)[:200]}", flush=True)
    return any([procs.stop(cx.state, p.name, cx.bins[p.name], p.stop_timeout) for p in reversed(unit.processes)])


def status(c: Ctx, unit: Unit) -> dict[str, str]:
    """``running pid=N healthy|UNHEALTHY`` per process; a stopped optional unit is one line under its own name,
    ``stopped (profile off; <hint>)``; a stopped core process is ``stopped``. Read-only."""
    cx = unit.context(c)
    running = pids(c, unit)
    if unit.optional and not running:
        return {unit.name: f"stopped (profile off; {unit.off_hint})"}
    out = {}
    for p in unit.processes:
        n = running.get(p.name)
        extra = f"{p.detail(cx)} " if p.detail else ""
        out[p.name] = "stopped" if n is None else f"running pid={n} {extra}" + ("healthy" if p.healthy(cx) else "UNHEALTHY")
    return out


@contextlib.contextmanager
def locked(state: Path) -> Iterator[None]:
    """Serialize concurrent up/down calls (several test sessions may boot at once)."""
    state.mkdir(parents=True, exist_ok=True)
    with (state / "lock").open("w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
