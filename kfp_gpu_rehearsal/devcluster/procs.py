"""Process bookkeeping for the dev cluster: pid files, ports, health probes.

Only processes recorded in our own pid files are ever signalled, and only after
checking that ``/proc/<pid>/cmdline`` still starts with the binary we launched
(so a recycled pid is never killed).
"""

from __future__ import annotations

import os
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path


class BootError(RuntimeError):
    pass


def pid_file(state: Path, name: str) -> Path:
    return state / f"{name}.pid"


def _cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def running_pid(state: Path, name: str, binary: Path) -> int | None:
    """The pid of our ``name`` process if it is alive and still runs ``binary``."""
    pf = pid_file(state, name)
    try:
        pid = int(pf.read_text().strip())
    except (OSError, ValueError):
        return None
    argv = _cmdline(pid)
    # the same file under another name counts: a venv's python and python3 are one interpreter, and the console
    # script that started a process (its shebang names python3) need not be the interpreter that stops it
    if not argv or (argv[0] != str(binary) and os.path.realpath(argv[0]) != os.path.realpath(binary)):
        return None
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    if stat.rsplit(")", 1)[-1].split()[0] == "Z":  # zombie
        return None
    return pid


def start(state: Path, name: str, argv: Sequence[str], env: dict[str, str] | None = None) -> int:
    log = state / f"{name}.log"
    with log.open("ab") as fh:
        fh.write(f"\n==== {time.strftime('%Y-%m-%dT%H:%M:%S')} starting: {' '.join(argv)}\n".encode())
        fh.flush()
        proc = subprocess.Popen(
            list(argv),
            stdout=fh,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env={**os.environ, "NO_PROXY": _no_proxy(), "no_proxy": _no_proxy(), **(env or {})},
            cwd=state,
        )
    pid_file(state, name).write_text(f"{proc.pid}\n")
    return proc.pid


def _no_proxy() -> str:
    extra = os.environ.get("NO_PROXY") or os.environ.get("no_proxy") or ""
    return ",".join(x for x in ("127.0.0.1", "localhost", extra) if x)


def stop(state: Path, name: str, binary: Path, timeout: float = 15.0) -> bool:
    """Stop our ``name`` process (SIGTERM, then SIGKILL). True if one was running."""
    pid = running_pid(state, name, binary)
    pid_file(state, name).unlink(missing_ok=True)
    if pid is None:
        return False
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not is_alive(pid):
            return True
        time.sleep(0.1)
    os.kill(pid, signal.SIGKILL)
    while is_alive(pid) and time.monotonic() < deadline + 5:
        time.sleep(0.1)
    return True


def is_alive(pid: int) -> bool:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


def check_ports_free(name: str, ports: Sequence[int], grace: float = 5.0) -> None:
    deadline = time.monotonic() + grace  # a just-stopped process may take a moment to release them
    busy = [p for p in ports if port_in_use(p)]
    while busy and time.monotonic() < deadline:
        time.sleep(0.2)
        busy = [p for p in ports if port_in_use(p)]
    if busy:
        raise BootError(
            f"{name}: port(s) {busy} on 127.0.0.1 already in use by a process this cluster did not start "
            f"(another program, or a dev cluster with another KFP_GPU_CACHE). Free them or override via the "
            f"KFP_GPU_*_PORT environment variables (see docs/local-cluster.md)."
        )


def http_ok(url: str, ctx: ssl.SSLContext | None = None, timeout: float = 2.0) -> bool:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=ctx))
    try:
        with opener.open(url, timeout=timeout) as r:
            return bool(200 <= r.status < 300)
    except (urllib.error.URLError, OSError, ssl.SSLError):
        return False


def insecure_ctx() -> ssl.SSLContext:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


def client_ctx(pki: Path) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    ctx.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
    return ctx


def wait_for(what: str, check: Callable[[], bool], timeout: float, log: Path | None = None,
             alive: Callable[[], bool] | None = None) -> None:
    deadline = time.monotonic() + timeout
    delay = 0.05
    while time.monotonic() < deadline:
        if check():
            return
        if alive is not None and not alive():
            raise BootError(f"{what}: process exited during startup; see {log}\n{tail(log)}")
        time.sleep(delay)
        delay = min(delay * 1.5, 0.5)
    raise BootError(f"{what}: not healthy after {timeout:.0f}s; see {log}\n{tail(log)}")


def tail(log: Path | None, n: int = 15) -> str:
    if log is None or not log.exists():
        return ""
    lines = log.read_text(errors="replace").splitlines()[-n:]
    return "\n".join("    " + ln[:300] for ln in lines)
