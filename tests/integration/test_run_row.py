"""`kfp-gpu run` uses the dev cluster's controller row (kfp_gpu_rehearsal/devcluster/controller_profile.py), not a
controller of its own: two runs in two namespaces at once are both worked by the row's one process, and a run
killed mid-way is released by it (its owner, the run's process, is gone: kfp_gpu/controller/owners.py).

The runs are the tiny pipeline (tests/integration/pipelines/tiny_pipeline.py), each with its own stand-in world
(scenario cluster) and namespace; each is killed once the row's controller has worked its first stage, so the test
does not wait for a whole pipeline (tests/integration/test_run_cli.py runs one to the end, also through the row).
Killed before scale-up on purpose: a run's GKE stand-in lives in the run's process, so what a killed run's scale-up
made in its world cannot be released by anyone once the world is gone (the controller's release then fails against
the world's missing cluster and retries); a gang whose run died before that is released at once.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from kubernetes import client

from kfp_gpu import install, rehearsal_seam
from kfp_gpu_rehearsal.devcluster import boot, controller_profile
from kfp_gpu_rehearsal.devcluster.client import Kube
from tests.waiting import wait_until

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
PIPELINE = "tests/integration/pipelines/tiny_pipeline.py"
ROW_LOG = rehearsal_seam.cluster_dir() / f"{controller_profile.NAME}.log"


def _row() -> tuple[int, list[str]]:
    """The row's pid and namespaces, as `kfp-gpu dev-cluster status` shows them ((0, []) when it does not run)."""
    line = boot.status().get(controller_profile.NAME, "")
    m = re.match(r"running pid=(\d+) namespaces=(\S*) healthy", line)
    return (int(m.group(1)), m.group(2).split(",")) if m else (0, [])


def _is_controller(pid: int) -> bool:
    try:
        return "kfp_gpu.cli\0controller" in Path(f"/proc/{pid}/cmdline").read_text()
    except OSError:
        return False


def _gangs(kube: Kube, ns: str) -> list[str]:
    return install.gang_names(kube.api, ns)


@contextlib.contextmanager
def _run(kube: Kube, tmp: Path, ns: str, log: list[str]) -> Iterator[subprocess.Popen[str]]:
    """`kfp-gpu run` of the tiny pipeline in ``ns`` with a world of its own, in its own process group (killed with
    its steps on the way out)."""
    cluster = f"row{uuid.uuid4().hex[:6]}"
    core = client.CoreV1Api(kube.api)
    scenario = yaml.safe_load((ROOT / "kfp_gpu_rehearsal/sim/scenarios/default.yaml").read_text())
    scenario["cluster"] = cluster
    (tmp / f"{ns}.yaml").write_text(yaml.safe_dump(scenario))
    env = {**os.environ, "KUBECONFIG": str(kube.kubeconfig), "TINY_CLUSTER": cluster, "TINY_NAMESPACE": ns}
    env.pop(rehearsal_seam.SIM_ENDPOINT_ENV, None)
    out = (tmp / f"{ns}.out").open("w")
    proc = subprocess.Popen([sys.executable, "-m", "kfp_gpu.cli", "run", PIPELINE, "--scenario",  # noqa: S603
                             str(tmp / f"{ns}.yaml")], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        yield proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        out.close()
        log.append((tmp / f"{ns}.out").read_text())
        # the Nodes a killed run's world made outlive its stand-in (the world's cloud died with the run)
        for node in core.list_node(label_selector=f"{rehearsal_seam.LOCAL_CLUSTER_LABEL}={cluster}").items:
            with contextlib.suppress(client.ApiException):
                core.delete_node(node.metadata.name)


def _delete_namespace(kube: Kube, ns: str) -> None:
    try:
        kube.core.delete_namespace(ns, propagation_policy="Background")
    except client.ApiException as e:
        if e.status != 404:
            raise


def _worked(ns: str, event: str) -> list[str]:
    """The row's log lines for ``ns``'s gangs with ``event`` (Preflighted, OwnerGone, Released...)."""
    try:
        text = ROW_LOG.read_text(errors="replace")
    except OSError:
        return []
    return re.findall(rf" INFO {re.escape(ns)}/(\S+) {event}: ", text)


def test_two_runs_at_once_are_served_by_the_row_and_killed_runs_are_released_by_it(kube: Kube, namespace: str,
                                                                                   tmp_path: Path) -> None:
    logs: list[str] = []
    other = f"{namespace[:50]}-b"
    kube.core.create_namespace({"metadata": {"name": other, "labels": {"kfp-gpu.io/test": "true"}}})
    with contextlib.ExitStack() as stack:
        stack.callback(_delete_namespace, kube, other)
        runs = {ns: stack.enter_context(_run(kube, tmp_path, ns, logs)) for ns in (namespace, other)}
        # each run's first stage is worked by the row's controller (its log) while both runs live; each run is
        # killed -9 (with its steps) right then, before its scale-up makes anything in its world (see the docstring)
        killed: set[str] = set()

        def kill_preflighted() -> bool:
            for ns, proc in runs.items():
                if ns not in killed and _worked(ns, "Preflighted"):
                    alive = [n for n, p in runs.items() if n not in killed and p.poll() is None]
                    assert len(alive) == len(runs) - len(killed), "a run ended by itself before both were served"
                    os.killpg(proc.pid, signal.SIGKILL)
                    killed.add(ns)
            return killed == set(runs)

        wait_until("the row's controller preflighting both runs' gangs", kill_preflighted, timeout=120, every=0.1)
        pid, served = _row()
        assert pid and _is_controller(pid) and {namespace, other} <= set(served), (pid, served)
        # the row releases both gangs (their owner is gone), in the same process: no restart, no controller of a run's
        for ns in runs:
            wait_until(f"{ns}'s gang released and gone", lambda ns=ns: not _gangs(kube, ns), timeout=60)
            assert _worked(ns, "OwnerGone") and _worked(ns, "Released"), ns
        assert _row() == (pid, served)

    for out in logs:  # each run said which controller it used: the row's, never one it started for itself
        said = re.findall(r"^kfp-gpu controller: the dev cluster's \((started|re-used), pid (\d+);", out, re.M)
        assert len(said) == 1, out[-3000:]
        assert "Traceback" not in out, out[-3000:]
