"""A bad environment is one line naming the thing and the fix, never a traceback, and a step refuses to work on
another cluster than the one its spec names.

The CLI runs for real in a subprocess. "Another cluster" is a second, real kube-apiserver (own etcd prefix, no
CRDs, no Training Operator, no dev-cluster record) started beside the shared local control plane.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import os
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from kfp_gpu.cluster import identity, pytorchjob
from kfp_gpu.cluster.kube import api_client
from kfp_gpu.errors import CrdMissing, WrongCluster
from kfp_gpu.job import JobTemplate
from kfp_gpu.spec import ProvisioningSpec, Target, TargetKind
from kfp_gpu.steps.capacity import Capacity, Placement
from kfp_gpu_rehearsal.devcluster import boot, procs
from kfp_gpu_rehearsal.devcluster.client import Kube
from tests.waiting import wait_until

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "pipelines" / "llm_finetune.py"
GKE_TRAIN_A = Target(kind=TargetKind.GKE, cluster="train-a", project="proj-1", region="us-central1")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _kubeconfig(path: Path, server: str, cluster_name: str) -> Path:
    pki = boot._ctx().pki
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "ctx",
        "clusters": [{"name": cluster_name, "cluster": {"server": server, "certificate-authority": str(pki / "ca.crt")}}],
        "users": [{"name": "admin", "user": {"client-certificate": str(pki / "admin.crt"),
                                             "client-key": str(pki / "admin.key")}}],
        "contexts": [{"name": "ctx", "context": {"cluster": cluster_name, "user": "admin"}}],
    }))
    return path


def _run(argv: list[str], kubeconfig: Path | str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("KUBERNETES_SERVICE_HOST", "KFP_GPU_SIM_ENDPOINT")}
    env["KUBECONFIG"] = str(kubeconfig)
    return subprocess.run(argv, capture_output=True, text=True, cwd=cwd, env=env, timeout=120)


def _cli(*args: str, kubeconfig: Path | str) -> subprocess.CompletedProcess[str]:
    return _run([sys.executable, "-m", "kfp_gpu.cli", *args], kubeconfig)


def _step(step: str, spec: ProvisioningSpec, kubeconfig: Path | str) -> subprocess.CompletedProcess[str]:
    code = ("import sys; from kfp_gpu.steps.entry import run_component\n"
            f"run_component({step!r}, sys.argv[1], 'env-test-run', '')\n")
    return _run([sys.executable, "-c", code, spec.to_json()], kubeconfig)


def _one_line(r: subprocess.CompletedProcess[str], *fragments: str) -> str:
    """The single human line on stderr (a step adds its machine-readable JSON line after it)."""
    assert r.returncode != 0, r.stdout + r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip() and not ln.startswith('{"error"')]
    assert len(lines) == 1, r.stderr
    for f in fragments:
        assert f in lines[0], lines[0]
    assert "(fix: " in lines[0], lines[0]
    return lines[0]


# ---- broken kubeconfig / dead API server ------------------------------------------------------------------

@pytest.fixture
def broken_kubeconfigs(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    """name -> (KUBECONFIG, what the error must name)."""
    empty = tmp_path / "empty"
    empty.write_text("")
    garbage = tmp_path / "garbage"
    garbage.write_text("clusters: [ {name: x\n\x00\x01 not yaml at all: ][\n")
    port = _free_port()  # nothing listens there
    closed = _kubeconfig(tmp_path / "closed", f"https://127.0.0.1:{port}", "kfp-gpu")
    return {"empty": (empty, str(empty)), "garbage": (garbage, str(garbage)),
            "closed port": (closed, f"https://127.0.0.1:{port}"),
            "missing": (tmp_path / "nope", str(tmp_path / "nope"))}


@pytest.mark.parametrize("case", ["empty", "garbage", "closed port", "missing"])
def test_cli_preflight_and_gc_fail_in_one_line_on_a_broken_kubeconfig(broken_kubeconfigs, case):
    kc, names = broken_kubeconfigs[case]
    line = _one_line(_cli("preflight", str(EXAMPLE), kubeconfig=kc), names)
    assert ("unreachable" if case == "closed port" else "kubeconfig") in line
    _one_line(_cli("gc", "--dry-run", kubeconfig=kc), names)


@pytest.mark.parametrize("case", ["empty", "closed port"])
def test_a_step_fails_in_one_line_on_a_broken_kubeconfig(broken_kubeconfigs, case):
    kc, names = broken_kubeconfigs[case]
    spec = ProvisioningSpec("h100-80gb", 2, target=Target(cluster=f"sim-{uuid.uuid4().hex[:6]}"))
    r = _step("teardown", spec, kc)
    line = _one_line(r, names)
    assert line.startswith("kfp-gpu teardown failed: ")
    err = json.loads(next(ln for ln in r.stderr.splitlines() if ln.startswith('{"error"')))["error"]
    assert err["type"] == ("ClusterUnreachable" if case == "closed port" else "KubeconfigInvalid")


# ---- the cluster the spec names ---------------------------------------------------------------------------

def test_local_target_accepts_any_simulated_cluster_on_the_dev_control_plane(kube: Kube, monkeypatch):
    monkeypatch.setenv("KUBECONFIG", str(kube.kubeconfig))
    warnings: list[str] = []
    for name in (f"sim-{uuid.uuid4().hex[:6]}", "kfp-gpu-local"):
        api = api_client(Target(cluster=name))
        found = identity.verify(api, Target(cluster=name), warn=warnings.append)
        assert found is not None and found.kind == "local"
    assert warnings == []


def test_a_gke_step_refuses_to_run_on_the_dev_cluster(kube: Kube, tmp_path: Path):
    spec = ProvisioningSpec("h100-80gb", 2, target=GKE_TRAIN_A)
    line = _one_line(_step("teardown", spec, kube.kubeconfig), "'train-a'", "local kfp-gpu dev cluster",
                     "gcloud container clusters get-credentials train-a")
    assert "wrong cluster" in line
    pipeline = tmp_path / "gke_pipeline.py"
    pipeline.write_text(EXAMPLE.read_text().replace('kind="local"', 'kind="gke"').replace(
        'cluster="kfp-gpu-local"', 'cluster="train-a"').replace('project="local-project"', 'project="proj-1"'))
    _one_line(_cli("preflight", str(pipeline), kubeconfig=kube.kubeconfig), "'train-a'", "local kfp-gpu dev cluster")


@dataclasses.dataclass(frozen=True)
class Bare:
    server: str
    tmp: Path

    def kubeconfig(self, cluster_name: str) -> Path:
        return _kubeconfig(self.tmp / f"kc-{uuid.uuid4().hex[:6]}", self.server, cluster_name)


@pytest.fixture(scope="module")
def bare_apiserver(kube: Kube, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bare]:
    """Another cluster: a second real kube-apiserver with its own etcd prefix and nothing installed."""
    c = boot._ctx()
    port = _free_port()
    ctx = dataclasses.replace(c, ports={**c.ports, "apiserver": port})
    prefix = f"/kfp-gpu-test-bare-{uuid.uuid4().hex[:8]}"
    tmp = tmp_path_factory.mktemp("bare")
    with (tmp / "apiserver.log").open("w") as log:
        proc = subprocess.Popen([*boot._apiserver(ctx), f"--etcd-prefix={prefix}"], stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_until("the second kube-apiserver to be ready",
                   lambda: proc.poll() is not None or procs.http_ok(f"https://127.0.0.1:{port}/readyz",
                                                                     procs.client_ctx(c.pki)), timeout=120, every=0.5)
        assert proc.poll() is None, (tmp / "apiserver.log").read_text()[-2000:]
        yield Bare(f"https://127.0.0.1:{port}", tmp)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        _etcd_delete_prefix(c.ports["etcd"], prefix)


def _etcd_delete_prefix(port: int, prefix: str) -> None:
    import urllib.request

    end = prefix[:-1] + chr(ord(prefix[-1]) + 1)
    body = json.dumps({"key": base64.b64encode(prefix.encode()).decode(),
                       "range_end": base64.b64encode(end.encode()).decode()}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v3/kv/deleterange", data=body, method="POST")
    urllib.request.urlopen(req, timeout=10).read()


def test_credentials_that_reach_another_gke_cluster_are_refused(bare_apiserver: Bare, monkeypatch):
    monkeypatch.setenv("KUBECONFIG", str(bare_apiserver.kubeconfig("gke_proj-1_us-central1_prod-b")))
    with pytest.raises(WrongCluster) as exc:
        api_client(GKE_TRAIN_A)
    assert "'train-a'" in str(exc.value) and "'prod-b'" in str(exc.value) and "\n" not in str(exc.value)
    monkeypatch.setenv("KUBECONFIG", str(bare_apiserver.kubeconfig("gke_proj-1_us-central1-b_train-a")))
    api_client(GKE_TRAIN_A)  # its own cluster (zonal, in the target's region)
    with pytest.raises(WrongCluster, match="target.kind is local.*GKE cluster 'train-a'"):  # never a local target
        api_client(Target(cluster="sim-x"))


def test_unknown_cluster_identity_proceeds_with_one_warning(bare_apiserver: Bare, monkeypatch, capsys):
    monkeypatch.setenv("KUBECONFIG", str(bare_apiserver.kubeconfig("my-cluster")))
    api_client(GKE_TRAIN_A)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "warning" in err and "'train-a'" in err and "my-cluster" in err
    # a local target needs the dev control plane itself: a cluster without its record is refused
    with pytest.raises(WrongCluster, match="'my-cluster'.*not the local kfp-gpu dev cluster"):
        api_client(Target(cluster="sim-x"))


def test_missing_pytorchjob_crd_is_named_with_the_install_command(bare_apiserver: Bare, monkeypatch):
    kc = bare_apiserver.kubeconfig("bare")
    monkeypatch.setenv("KUBECONFIG", str(kc))
    api = api_client(None)
    assert not pytorchjob.served(api) and not pytorchjob.served(api, "kubeflow.org", "v1", "pytorchjobs")
    cap = Capacity("r1", (Placement("p", "us-central1-a", ("n1",)),), 8, "nvidia-h100-80gb", spot=False)
    body = pytorchjob.manifest("j1", capacity=cap, template=JobTemplate(), labels={}, nodes=1, checkpoint_uri="",
                               resume_step=0, run_id="r1")
    with pytest.raises(CrdMissing) as exc:
        pytorchjob.create_or_get(api, "default", body)
    assert "pytorchjobs.kubeflow.org" in str(exc.value) and "Training Operator" in str(exc.value)
    # the CLI's preflight says the same up front, once the cluster is otherwise a kfp-gpu dev cluster
    identity.record_local(api, bare_apiserver.server)
    _one_line(_cli("preflight", str(EXAMPLE), kubeconfig=kc), "pytorchjobs.kubeflow.org", "Training Operator")


def test_the_dev_cluster_serves_pytorchjobs(kube: Kube):
    assert pytorchjob.served(kube.api)
