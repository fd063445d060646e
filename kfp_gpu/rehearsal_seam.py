"""The seam the product owns towards the local rehearsal (the stand-ins, the dev cluster): the only way core code
reaches it. Core code never imports the rehearsal's modules (tests/unit/test_layering.py); it knows only what is
written here:

- **paths**: the cache (``$KFP_GPU_CACHE``, default ``~/.cache/kfp-gpu``), the dev cluster's state dir and admin
  kubeconfig (``<cache>/cluster/kubeconfig``, which a ``local`` target uses when ``$KUBECONFIG`` is unset), the
  file where the GKE stand-in daemon records its URL (``<cache>/cluster/sim.url``), and the file where the stand-in
  of one world (a ``kfp-gpu run``'s, named by its ``target.cluster``) records its URL and the pid of the process it
  lives in (``<cache>/cluster/worlds/<cluster>.url``): the dev cluster's one controller finds each run's world there;
- **environment names**: ``KFP_GPU_SIM_ENDPOINT`` (the GKE stand-in's URL for a ``local`` target),
  ``KFP_GPU_WORLD_TIME_SCALE`` (real-world seconds per wall-clock second of the world the run happens in: the
  rehearsal sets it, a real cluster leaves it unset = 1);
- **the node-label scheme of the local target**: the stand-ins label every node they make with
  ``kfp-gpu.io/sim-cluster=<target.cluster>`` (several stand-ins share one control plane), besides GKE's own labels;
  a ``local`` target selects its nodes by it (:func:`node_selector`);
- **the commands**: ``kfp-gpu run``, ``kfp-gpu demo`` and ``kfp-gpu dev-cluster`` load the rehearsal by name
  (:func:`load`), and say in one line how to install it when it is missing.

No module-level imports beyond the standard library and :mod:`kfp_gpu.spec`/:mod:`kfp_gpu.errors`.
"""

from __future__ import annotations

import importlib
import os
import urllib.request
from pathlib import Path
from types import ModuleType

from kfp_gpu.errors import InvalidSpec, KfpGpuError
from kfp_gpu.spec import Target, TargetKind

CACHE_ENV = "KFP_GPU_CACHE"
SIM_ENDPOINT_ENV = "KFP_GPU_SIM_ENDPOINT"
TIME_SCALE_ENV = "KFP_GPU_WORLD_TIME_SCALE"
LOCAL_CLUSTER_LABEL = "kfp-gpu.io/sim-cluster"
SIM_URL_FILE = "sim.url"
WORLDS_DIR = "worlds"  # <cluster>.url: "URL PID" of the stand-in serving that world (a kfp-gpu run's)
SIM_PROBE = "/sim/v1/requests"  # the GKE stand-in answers here once it serves
PACKAGE = "kfp_gpu_rehearsal"  # the rehearsal's own distribution (kfp-gpu[rehearsal], kfp_gpu_rehearsal/pyproject.toml)
INSTALL_HINT = "pip install 'kfp-gpu[rehearsal]'"


def cache_dir() -> Path:
    """Root of the build/state cache (outside the repo)."""
    env = os.environ.get(CACHE_ENV)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "kfp-gpu"


def cluster_dir() -> Path:
    """The dev cluster's state dir: pid files, logs, PKI, the admin kubeconfig, the stand-ins' URL files."""
    return cache_dir() / "cluster"


def local_kubeconfig() -> Path:
    """The dev cluster's admin kubeconfig (it may not exist)."""
    return cluster_dir() / "kubeconfig"


def sim_url_file(cluster: str = "") -> Path:
    """Where a GKE stand-in records its URL: the daemon's (``cluster`` ""), or the one that serves the world of
    ``target.cluster`` == ``cluster`` for a ``kfp-gpu run``."""
    return cluster_dir() / WORLDS_DIR / f"{cluster}.url" if cluster else cluster_dir() / SIM_URL_FILE


def running_sim_url(cluster: str = "") -> str:
    """The URL in :func:`sim_url_file` (``cluster``), else "". A record naming the process the stand-in lives in (a
    run's world) counts while that process lives (a dead run's port may serve another world by now; a busy live one
    may answer slowly, and its world must not fall back to another); the daemon's record counts when it answers."""
    try:
        url, *pid = sim_url_file(cluster).read_text().split()
        if pid:
            return url if _pid_alive(int(pid[0])) else ""
        with urllib.request.urlopen(f"{url}{SIM_PROBE}", timeout=2):
            return url
    except (OSError, ValueError):
        return ""


def _pid_alive(pid: int) -> bool:
    """The one liveness check (a zombie is dead), imported here: its module imports kubernetes."""
    from kfp_gpu.cluster.owners import pid_alive

    return pid_alive(pid)


def node_selector(target: Target) -> dict[str, str]:
    """The labels that tell a ``local`` target's nodes from other stand-ins' on the same control plane; {} for a
    real cluster (its nodes need no such filter)."""
    return {LOCAL_CLUSTER_LABEL: target.cluster} if target.kind is TargetKind.LOCAL else {}


def world_time_scale() -> float:
    """Real-world seconds per wall-clock second of the world this process runs in: ``$KFP_GPU_WORLD_TIME_SCALE``
    (set by the rehearsal), else 1.0 (a real cluster). Raises: InvalidSpec naming the variable when it is not a
    positive number."""
    raw = os.environ.get(TIME_SCALE_ENV, "")
    if not raw:
        return 1.0
    try:
        scale = float(raw)
    except ValueError:
        scale = 0.0
    if scale <= 0:
        raise InvalidSpec(TIME_SCALE_ENV, raw, "must be a positive number of real-world seconds per second",
                          remediation=f"unset {TIME_SCALE_ENV} (a real cluster) or let `kfp-gpu run` set it")
    return scale


class RehearsalMissing(KfpGpuError):
    """The rehearsal world is not installed (the ``rehearsal`` extra)."""

    exit_code = 2


def load(module: str) -> ModuleType:
    """The rehearsal's ``module`` (e.g. ``"demo"``, ``"devcluster.cli"``).

    Raises: RehearsalMissing with the one-line install hint when the rehearsal is not installed.
    """
    name = f"{PACKAGE}.{module}"
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name and (name == exc.name or name.startswith(exc.name + ".")):
            raise RehearsalMissing(f"the local rehearsal is not installed ({name} is missing)",
                                   remediation=INSTALL_HINT) from None
        raise
