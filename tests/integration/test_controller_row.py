"""The kfp-gpu controller as a row of the dev cluster's table (kfp_gpu_rehearsal/devcluster/controller_profile.py),
run by the one runner in a private state dir against the shared API server: started, shown by status, re-used,
acting under its own ServiceAccount token on its own namespace only, serving a ``kfp-gpu run``'s namespace besides
(one restart, then re-used), stopped."""

from __future__ import annotations

import contextlib
import socket
import time
import uuid
from pathlib import Path

import pytest
import yaml
from kubernetes import client

from kfp_gpu import install
from kfp_gpu.errors import PermissionDenied
from kfp_gpu.gang import api as gang
from kfp_gpu.gang import client as gang_client
from kfp_gpu.spec import CapacityType, ProvisioningSpec, Target
from kfp_gpu_rehearsal.devcluster import controller_profile as row
from kfp_gpu_rehearsal.devcluster import crds, runner, table
from kfp_gpu_rehearsal.devcluster.client import Kube
from kfp_gpu_rehearsal.devcluster.controller import sa_kubeconfig
from kfp_gpu_rehearsal.devcluster.procs import BootError
from kfp_gpu_rehearsal.devcluster.runner import Ctx
from kfp_gpu_rehearsal.devcluster.versions import Versions
from tests.waiting import wait_until

pytestmark = pytest.mark.integration


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_controller_row_runs_through_the_runner_under_its_service_account(
        kube: Kube, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ns, other = f"tr-{uuid.uuid4().hex[:8]}", f"tr-{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv(row.NAMESPACES_ENV, ns)
    monkeypatch.setenv("KFP_GPU_CONTROLLER_METRICS_PORT", str(_free_port()))
    state = tmp_path / "state"
    state.mkdir()
    (state / "kubeconfig").symlink_to(kube.kubeconfig)  # the shared API server; our own pid files and logs
    c = Ctx(state=state, pki=state / "pki", bins={}, ports={}, versions=Versions.load())
    unit = table.get("controller")
    assert runner.status(c, unit) == {"controller": "stopped (profile off; up --with controller starts it)"}
    status: dict[str, str] = {}
    try:
        runner.up(c, unit, True, status, time.monotonic())
        assert status == {row.NAME: "started"}
        pid = runner.pids(c, unit)[row.NAME]
        line = runner.status(c, unit)[row.NAME]
        assert line == f"running pid={pid} namespaces={ns} healthy", line
        # its only Kubernetes credential is the controller's ServiceAccount token (no admin client certificate)
        env = dict(e.split("=", 1) for e in Path(f"/proc/{pid}/environ").read_text().split("\0") if "=" in e)
        assert env["KUBECONFIG"] == str(row.kubeconfig(c))
        user = yaml.safe_load(row.kubeconfig(c).read_text())["users"][0]
        assert user["name"] == gang.CONTROLLER_SA and set(user["user"]) == {"token"}
        runner.up(c, unit, True, status, time.monotonic())  # same fingerprint, healthy: re-used
        assert status == {row.NAME: "running"} and runner.pids(c, unit)[row.NAME] == pid

        # it acts on its namespace: a gang beyond the tenant's policy, asked as the tenant's step identity, is refused
        step_api = crds.api_client(sa_kubeconfig(kube.api, ns, gang.STEP_SA, tmp_path / "step-kubeconfig"))
        spec = ProvisioningSpec("a100-80gb", 64, capacity=CapacityType.SPOT, zones=("us-central1-a",),
                                target=Target(kind="local", cluster="none", region="us-central1",
                                              endpoint="http://127.0.0.1:9", namespace=ns))
        run_id = f"run-{uuid.uuid4().hex[:8]}"
        try:
            with pytest.raises(PermissionDenied, match="maxGpusPerGang"):
                gang_client.request("preflight", spec, spec.to_json(), run_id, step_api)
            gang_client.request("teardown", spec, spec.to_json(), run_id, step_api)
            wait_until("the gang released and gone", lambda: not install.gang_names(kube.api, ns), timeout=30)
        finally:
            step_api.close()

        # kfp-gpu run asks the row to serve its namespace: a tenant is added (one restart), then re-used; a
        # namespace that is not a tenant is refused naming the fix
        with pytest.raises(BootError, match=f"namespace {other} is not a tenant: run kfp-gpu tenant add {other}"):
            row.serve(c, other)
        assert runner.pids(c, unit)[row.NAME] == pid
        install.tenant_add(kube.api, other)
        served_pid, how = row.serve(c, other)
        assert how == "started" and served_pid != pid and row.serving(c, other) == served_pid
        assert row.serving(c, ns) == served_pid
        assert row.serve(c, other) == (served_pid, "running")
        assert runner.status(c, unit)[row.NAME] == f"running pid={served_pid} namespaces={ns},{other} healthy"
    finally:
        assert runner.stop(c, unit) or not status
        for n in (ns, other):
            install.tenant_remove(kube.api, n, force=True)
            with contextlib.suppress(client.ApiException):  # ``other`` exists only once tenant_add ran
                client.CoreV1Api(kube.api).delete_namespace(n, propagation_policy="Background")
    assert runner.pids(c, unit) == {}
    assert runner.status(c, unit) == {"controller": "stopped (profile off; up --with controller starts it)"}
