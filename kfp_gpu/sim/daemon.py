"""Run the stand-in as a background daemon for the local cluster (`make cluster-up` / `cluster-down`).

The URL goes to ``$KFP_GPU_CACHE/cluster/sim.url`` where ``kfp_gpu.providers.for_target`` finds it for
``local`` targets; the pid file lets ``stop`` kill exactly the process ``start`` created.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path


def state_dir() -> Path:
    return Path(os.environ.get("KFP_GPU_CACHE", Path.home() / ".cache" / "kfp-gpu")) / "cluster"


def url_file() -> Path:
    return state_dir() / "sim.url"


def running_url() -> str:
    """The daemon's URL when it answers, else ""."""
    try:
        url = url_file().read_text().strip()
        with urllib.request.urlopen(f"{url}/sim/v1/requests", timeout=2):
            return url
    except (OSError, ValueError):
        return ""


def start(port: int = 8787) -> str:
    """Start (or reuse) the daemon. Raises: RuntimeError when it does not come up."""
    url = running_url()
    if url:
        return url
    d = state_dir()
    d.mkdir(parents=True, exist_ok=True)
    url_file().unlink(missing_ok=True)
    log = open(d / "sim.log", "ab")  # noqa: SIM115 - handed to the child
    proc = subprocess.Popen(
        [sys.executable, "-m", "kfp_gpu.sim", "--port", str(port), "--kubeconfig", str(d / "kubeconfig"),
         "--url-file", str(url_file())], stdout=log, stderr=log, start_new_session=True)
    (d / "sim.pid").write_text(str(proc.pid))
    for _ in range(100):
        url = running_url()
        if url:
            return url
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    raise RuntimeError(f"the GKE stand-in did not start (port {port} in use?); see {d / 'sim.log'}")


def stop() -> None:
    pid_file = state_dir() / "sim.pid"
    if pid_file.exists():
        try:
            os.kill(int(pid_file.read_text()), signal.SIGTERM)
        except (ProcessLookupError, ValueError):
            pass
        pid_file.unlink(missing_ok=True)
    url_file().unlink(missing_ok=True)


if __name__ == "__main__":
    if sys.argv[1:] == ["stop"]:
        stop()
    else:
        print(f"GKE stand-in: {start()}")
