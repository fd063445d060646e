"""Run the stand-ins as background daemons for the local cluster (`make cluster-up` / `cluster-down`).

The GKE stand-in's URL goes to ``$KFP_GPU_CACHE/cluster/sim.url`` where the product finds it (:mod:`kfp_gpu.rehearsal_seam`)
for ``local`` targets; the AWS stand-in (kfp_gpu_rehearsal.sim.aws, EKS targets: ``endpoint=http://127.0.0.1:8788``) writes
``sim-aws.url``. The pid files let ``stop`` kill exactly the processes ``start`` created.

A daemon that answers is re-used only when it runs this tree's code: ``<name>.code`` records the digest of the
code it was started from (every ``kfp_gpu_rehearsal`` and ``kfp_gpu`` module), and a daemon started from other
code is stopped and started again. Without it, a world fixed in the tree kept being served by the old process
(the dev cluster outlives checkouts and CI clones on one machine).
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from kfp_gpu import rehearsal_seam


def state_dir() -> Path:
    return rehearsal_seam.cluster_dir()


def url_file() -> Path:
    return rehearsal_seam.sim_url_file()


def running_url() -> str:
    """The daemon's URL when it answers, else "" (the seam's probe: the product finds it the same way)."""
    return rehearsal_seam.running_sim_url()


AWS_PORT = 8788


def code_digest() -> str:
    """sha256 (16 hex) over the code a daemon runs: every ``kfp_gpu_rehearsal`` and ``kfp_gpu`` module, by path."""
    import kfp_gpu
    import kfp_gpu_rehearsal

    h = hashlib.sha256()
    for pkg in (kfp_gpu_rehearsal, kfp_gpu):
        root = Path(str(pkg.__file__)).parent
        for f in sorted(root.rglob("*.py")):
            h.update(f"{pkg.__name__}/{f.relative_to(root)}".encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:16]


def _current(name: str, url: str) -> str:
    """``url`` when the daemon ``name`` answers there and runs this code; a stale one is stopped ("")."""
    if not url:
        return ""
    code = state_dir() / f"{name}.code"
    if code.exists() and code.read_text().strip() == code_digest():
        return url
    print(f"{name}: the running stand-in was started from other code; restarting it", file=sys.stderr, flush=True)
    _stop_one(name)
    return ""


def _answering(url_path: Path, probe: str) -> str:
    try:
        url = url_path.read_text().strip()
        with urllib.request.urlopen(f"{url}{probe}", timeout=2):
            return url
    except (OSError, ValueError):
        return ""


def start_aws(port: int = AWS_PORT) -> str:
    """Start (or reuse) the AWS stand-in daemon. Raises: RuntimeError when it does not come up."""
    d = state_dir()
    url_path = d / "sim-aws.url"
    url = _current("sim-aws", _answering(url_path, "/sim/v1/requests"))
    if url:
        return url
    d.mkdir(parents=True, exist_ok=True)
    url_path.unlink(missing_ok=True)
    log = open(d / "sim-aws.log", "ab")  # noqa: SIM115 - handed to the child
    proc = subprocess.Popen(
        [sys.executable, "-m", "kfp_gpu_rehearsal.sim.aws", "--port", str(port), "--kubeconfig", str(d / "kubeconfig"),
         "--url-file", str(url_path)], stdout=log, stderr=log, start_new_session=True)
    (d / "sim-aws.pid").write_text(str(proc.pid))
    (d / "sim-aws.code").write_text(code_digest())
    for _ in range(100):
        url = _answering(url_path, "/sim/v1/requests")
        if url:
            return url
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    raise RuntimeError(f"the AWS stand-in did not start (port {port} in use?); see {d / 'sim-aws.log'}")


def start(port: int = 8787) -> str:
    """Start (or reuse) the GKE stand-in daemon and the AWS one. Raises: RuntimeError when one does not come up."""
    start_aws()
    url = _current("sim", running_url())
    if url:
        return url
    d = state_dir()
    d.mkdir(parents=True, exist_ok=True)
    url_file().unlink(missing_ok=True)
    log = open(d / "sim.log", "ab")  # noqa: SIM115 - handed to the child
    proc = subprocess.Popen(
        [sys.executable, "-m", "kfp_gpu_rehearsal.sim", "--port", str(port), "--kubeconfig", str(d / "kubeconfig"),
         "--url-file", str(url_file())], stdout=log, stderr=log, start_new_session=True)
    (d / "sim.pid").write_text(str(proc.pid))
    (d / "sim.code").write_text(code_digest())
    for _ in range(100):
        url = running_url()
        if url:
            return url
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    raise RuntimeError(f"the GKE stand-in did not start (port {port} in use?); see {d / 'sim.log'}")


def _stop_one(name: str, wait_s: float = 10.0) -> None:
    """SIGTERM the daemon ``name`` started, and wait (up to ``wait_s``) until it is gone, so its port is free."""
    pid_file = state_dir() / f"{name}.pid"
    if pid_file.exists():
        try:
            pid = int(pid_file.read_text())
            os.kill(pid, signal.SIGTERM)
            for _ in range(int(wait_s * 10)):
                os.kill(pid, 0)
                time.sleep(0.1)
        except (ProcessLookupError, ValueError):
            pass
        pid_file.unlink(missing_ok=True)
    for suffix in ("url", "code"):
        (state_dir() / f"{name}.{suffix}").unlink(missing_ok=True)


def stop() -> None:
    for name in ("sim", "sim-aws"):
        _stop_one(name)


if __name__ == "__main__":
    if sys.argv[1:] == ["stop"]:
        stop()
    else:
        print(f"GKE stand-in: {start()}; AWS stand-in: {start_aws()}")
