"""Run the stand-ins as background daemons for the local cluster (`make cluster-up` / `cluster-down`).

The GKE stand-in's URL goes to ``$KFP_GPU_CACHE/cluster/sim.url`` where the product finds it (:mod:`kfp_gpu.rehearsal_seam`)
for ``local`` targets; the AWS stand-in (kfp_gpu_rehearsal.sim.aws, EKS targets: ``endpoint=http://127.0.0.1:8788``) writes
``sim-aws.url``. The pid files let ``stop`` kill exactly the processes ``start`` created.
"""

from __future__ import annotations

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
    url = _answering(url_path, "/sim/v1/requests")
    if url:
        return url
    d.mkdir(parents=True, exist_ok=True)
    url_path.unlink(missing_ok=True)
    log = open(d / "sim-aws.log", "ab")  # noqa: SIM115 - handed to the child
    proc = subprocess.Popen(
        [sys.executable, "-m", "kfp_gpu_rehearsal.sim.aws", "--port", str(port), "--kubeconfig", str(d / "kubeconfig"),
         "--url-file", str(url_path)], stdout=log, stderr=log, start_new_session=True)
    (d / "sim-aws.pid").write_text(str(proc.pid))
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
    url = running_url()
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
    for _ in range(100):
        url = running_url()
        if url:
            return url
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    raise RuntimeError(f"the GKE stand-in did not start (port {port} in use?); see {d / 'sim.log'}")


def stop() -> None:
    for name in ("sim", "sim-aws"):
        pid_file = state_dir() / f"{name}.pid"
        if pid_file.exists():
            try:
                os.kill(int(pid_file.read_text()), signal.SIGTERM)
            except (ProcessLookupError, ValueError):
                pass
            pid_file.unlink(missing_ok=True)
        (state_dir() / f"{name}.url").unlink(missing_ok=True)


if __name__ == "__main__":
    if sys.argv[1:] == ["stop"]:
        stop()
    else:
        print(f"GKE stand-in: {start()}; AWS stand-in: {start_aws()}")
