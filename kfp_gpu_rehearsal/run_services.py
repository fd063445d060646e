"""What a ``kfp-gpu run`` (:mod:`kfp_gpu_rehearsal.demo`) uses from the dev cluster besides its own stand-in: the one
controller of the dev cluster's table (its ``controller`` row, started through the runner when it does not run), and
the record of the run's world (its GKE stand-in's URL, by ``target.cluster``) where that controller finds it.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from pathlib import Path

from kfp_gpu import rehearsal_seam
from kfp_gpu.errors import InvalidSpec, KfpGpuError
from kfp_gpu_rehearsal.devcluster.runner import Ctx


def controller(ctx: Ctx, namespace: str, say: Callable[[str], None]) -> tuple[int, Path]:
    """The dev cluster's controller row, serving ``namespace`` (:func:`kfp_gpu_rehearsal.devcluster.controller_profile.serve`):
    its pid and log. Raises: KfpGpuError (one line naming its log and the fix) when it cannot run."""
    from kfp_gpu.gang import api as gang_api
    from kfp_gpu_rehearsal.devcluster import controller_profile
    from kfp_gpu_rehearsal.devcluster.procs import BootError

    log = ctx.state / f"{controller_profile.NAME}.log"
    try:
        pid, how = controller_profile.serve(ctx, namespace)
    except BootError as e:
        raise KfpGpuError(f"the dev cluster's controller cannot serve namespace {namespace}: {e}",
                          remediation=f"see {log}; python -m kfp_gpu_rehearsal.devcluster up --with controller") from None
    say(f"kfp-gpu controller: the dev cluster's ({'re-used' if how == 'running' else how}, pid {pid}; "
        f"`kfp-gpu dev-cluster status` shows it), ServiceAccount {gang_api.CONTROLLER_NAMESPACE}/"
        f"{gang_api.CONTROLLER_SA}; steps run as {namespace}/{gang_api.STEP_SA} (log {log})")
    return pid, log


def claim_world(cluster: str, url: str, stop: Callable[[], None]) -> Path:
    """Record ``url`` as the stand-in of the world ``cluster`` (:func:`kfp_gpu.rehearsal_seam.sim_url_file`), where
    the dev cluster's controller finds it. Raises: InvalidSpec naming target.cluster when another live run's stand-in
    serves that world (two stand-ins would both drive its nodes); ``stop`` is called first."""
    f = rehearsal_seam.sim_url_file(cluster)
    other = rehearsal_seam.running_sim_url(cluster)
    if other and other != url:
        stop()
        raise InvalidSpec("target.cluster", cluster, f"is the world of another running kfp-gpu run (its stand-in "
                          f"answers at {other}, recorded in {f})",
                          remediation="wait for that run to finish, or give this one another target.cluster "
                          "(and a --scenario naming it)")
    f.parent.mkdir(parents=True, exist_ok=True)
    for old in f.parent.glob("*.url"):  # the records of killed runs (their process is gone)
        if old != f and not rehearsal_seam.running_sim_url(old.stem):
            old.unlink(missing_ok=True)  # (a record counts while its process lives, answering or not)
    f.write_text(f"{url} {os.getpid()}\n")
    return f


def release_world(f: Path, url: str) -> None:
    """Remove the record of our stand-in (not one a later run wrote). Raises: nothing."""
    with contextlib.suppress(OSError):
        if f.read_text().split()[:1] == [url]:
            f.unlink()
