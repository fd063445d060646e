"""The kfp-gpu controller as a row of the dev cluster's table (kfp_gpu_rehearsal/devcluster/controller_profile.py),
run by the one runner in a private state dir against the shared API server: started, shown by status, re-used,
acting under its own ServiceAccount token on its own namespace only, refused to ``kfp-gpu run`` for that namespace,
stopped."""

from __future__ import annotations

import socket
import time
import uuid
from pathlib import Path

import pytest
import yaml
from kubernetes import client

from kfp_gpu import install
from kfp_gpu.errors import InvalidSpec, PermissionDenied
from kfp_gpu.gang import api as gang
from kfp_gpu.gang import client as gang_client
from kfp_gpu.spec import CapacityType, ProvisioningSpec, Target
from kfp_gpu_rehearsal.devcluster import controller_profile as row
from kfp_gpu_rehearsal.devcluster import crds, runner, table
from kfp_gpu_rehearsal.devcluster.client import Kube
from kfp_gpu_rehearsal.devcluster.controller import sa_kubeconfig
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
    ns = f"tr-{uuid.uuid4().hex[:8]}"
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

        # kfp-gpu run starts a controller of its own: it refuses the namespace this one serves, not another
        with pytest.raises(InvalidSpec, match="down --only controller"):
            row.refuse_served(c, ns)
        row.refuse_served(c, f"{ns}-other")
    finally:
        assert runner.stop(c, unit) or not status
        install.tenant_remove(kube.api, ns, force=True)
        client.CoreV1Api(kube.api).delete_namespace(ns, propagation_policy="Background")
    assert runner.pids(c, unit) == {}
    assert runner.status(c, unit) == {"controller": "stopped (profile off; up --with controller starts it)"}
