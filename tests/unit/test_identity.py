"""Which cluster the credentials reach (kfp_gpu.cluster.identity) and how kubeconfig problems are reported."""

from __future__ import annotations

import http.server
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from kfp_gpu.cluster import identity
from kfp_gpu.cluster.identity import ClusterIdentity, mismatch, parse_context_cluster
from kfp_gpu.cluster.kube import api_client
from kfp_gpu.errors import KubeconfigInvalid, NoKubeCredentials
from kfp_gpu.spec import Target, TargetKind

GKE = Target(kind=TargetKind.GKE, cluster="train-a", project="proj-1", region="us-central1")
EKS = Target(kind=TargetKind.EKS, cluster="train-e", region="us-east-1")
LOCAL = Target(kind=TargetKind.LOCAL, cluster="sim-7f3a")


@pytest.mark.parametrize(("name", "want"), [
    ("gke_proj-1_us-central1_train-a", ClusterIdentity("gke", "train-a", "proj-1", "us-central1")),
    ("gke_proj-1_us-central1-c_train-a", ClusterIdentity("gke", "train-a", "proj-1", "us-central1-c")),
    ("gke_example.com:proj_europe-west4_b", ClusterIdentity("gke", "b", "example.com:proj", "europe-west4")),
    ("arn:aws:eks:us-east-1:123456789012:cluster/train-e", ClusterIdentity("eks", "train-e", "123456789012", "us-east-1")),
    ("arn:aws-us-gov:eks:us-gov-west-1:123456789012:cluster/x", ClusterIdentity("eks", "x", "123456789012", "us-gov-west-1")),
    ("train-e.us-east-1.eksctl.io", ClusterIdentity("eks", "train-e", "", "us-east-1")),
])
def test_context_cluster_names_written_by_the_cloud_clis_are_parsed(name, want):
    got = parse_context_cluster(name)
    assert got is not None
    assert (got.kind, got.name, got.project, got.location) == (want.kind, want.name, want.project, want.location)


@pytest.mark.parametrize("name", ["kfp-gpu", "minikube", "kind-kind", "gke_only_two", "arn:aws:eks:us-east-1:12:cluster/x", ""])
def test_other_context_cluster_names_are_unknown(name):
    assert parse_context_cluster(name) is None


def test_local_target_accepts_the_dev_cluster_whatever_sim_cluster_it_names():
    dev = ClusterIdentity("local", identity.LOCAL_NAME, source="ConfigMap")
    assert mismatch(dev, LOCAL) == ""
    assert mismatch(dev, Target(kind=TargetKind.LOCAL, cluster="another-sim")) == ""
    why = mismatch(ClusterIdentity("gke", "prod", "p", "us-central1", "ctx"), LOCAL)
    assert "local" in why and "'prod'" in why


@pytest.mark.parametrize(("found", "fragment"), [
    (ClusterIdentity("gke", "train-b", "proj-1", "us-central1"), "'train-b'"),
    (ClusterIdentity("gke", "train-a", "proj-2", "us-central1"), "proj-2"),
    (ClusterIdentity("gke", "train-a", "proj-1", "europe-west4-a"), "europe-west4-a"),
    (ClusterIdentity("eks", "train-a", "1234", "us-central1"), "EKS"),
    (ClusterIdentity("local", "kfp-gpu-local"), "local kfp-gpu dev cluster"),
])
def test_gke_target_refuses_another_cluster_naming_both(found, fragment):
    why = mismatch(found, GKE)
    assert "'train-a'" in why and fragment in why


def test_gke_target_accepts_its_zonal_or_regional_cluster():
    assert mismatch(ClusterIdentity("gke", "train-a", "proj-1", "us-central1-f"), GKE) == ""
    assert mismatch(ClusterIdentity("gke", "train-a", "", ""), GKE) == ""
    assert mismatch(ClusterIdentity("eks", "train-e", "123456789012", "us-east-1"), EKS) == ""
    assert "us-west-2" in mismatch(ClusterIdentity("eks", "train-e", "", "us-west-2"), EKS)


class _Metadata(http.server.BaseHTTPRequestHandler):
    values = {"/computeMetadata/v1/instance/attributes/cluster-name": "train-a",
              "/computeMetadata/v1/instance/attributes/cluster-location": "us-central1",
              "/computeMetadata/v1/project/project-id": "proj-1"}
    flavor = "Google"
    seen: list[str] = []

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self.seen.append(self.headers.get("Metadata-Flavor", ""))
        body = self.values.get(self.path)
        self.send_response(200 if body else 404)
        self.send_header("Metadata-Flavor", self.flavor)
        self.end_headers()
        self.wfile.write((body or "").encode())

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def metadata_server(monkeypatch) -> Iterator[type[_Metadata]]:
    handler = type("H", (_Metadata,), {"seen": []})
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    monkeypatch.setenv("GCE_METADATA_HOST", f"127.0.0.1:{srv.server_address[1]}")
    yield handler
    srv.shutdown()
    srv.server_close()


def test_gke_metadata_server_names_the_pods_cluster(metadata_server):
    got = identity.from_gce_metadata()
    assert got is not None and (got.kind, got.name, got.project, got.location) == ("gke", "train-a", "proj-1", "us-central1")
    assert set(metadata_server.seen) == {"Google"}  # the header the metadata server requires
    assert mismatch(got, GKE) == ""
    assert "'train-b'" in mismatch(got, Target(kind=TargetKind.GKE, cluster="train-b", project="proj-1"))


def test_a_server_that_is_not_the_metadata_server_is_not_believed(metadata_server):
    metadata_server.flavor = "nope"
    assert identity.from_gce_metadata() is None


def test_no_metadata_server_answers_quickly_with_unknown(monkeypatch):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("GCE_METADATA_HOST", f"127.0.0.1:{port}")
    t0 = time.monotonic()
    assert identity.from_gce_metadata() is None
    assert time.monotonic() - t0 < 2 * identity.METADATA_TIMEOUT_S + 0.5


# ---- kubeconfig problems: one KfpGpuError naming the file and the fix --------------------------------------

@pytest.mark.parametrize(("content", "fragment"), [
    ("", "empty"),
    ("garbage: [\n", "line 2"),
    ("just a string\n", "not usable"),
    ("apiVersion: v1\nkind: Config\n", "not usable"),
])
def test_broken_kubeconfig_is_a_named_error(tmp_path, monkeypatch, content, fragment):
    kc = tmp_path / "kubeconfig"
    kc.write_text(content)
    monkeypatch.setenv("KUBECONFIG", str(kc))
    with pytest.raises(KubeconfigInvalid) as exc:
        api_client(None)
    text = str(exc.value)
    assert str(kc) in text and fragment in text and "(fix: " in text and "\n" not in text


def test_missing_kubeconfig_and_unknown_context_are_named(tmp_path, monkeypatch):
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "nope"))
    with pytest.raises(KubeconfigInvalid, match="nope.*does not exist"):
        api_client(None)
    kc = tmp_path / "kc"
    kc.write_text("apiVersion: v1\nkind: Config\ncurrent-context: a\nclusters: [{name: c, cluster: {server: "
                  "'https://127.0.0.1:1'}}]\nusers: [{name: u, user: {token: t}}]\ncontexts: [{name: a, context: "
                  "{cluster: c, user: u}}]\n")
    monkeypatch.setenv("KUBECONFIG", str(kc))
    target = Target(kind=TargetKind.GKE, cluster="x", kube_context="prod")
    with pytest.raises(KubeconfigInvalid, match="context 'prod'.*target.kube_context"):
        api_client(target)


def test_no_credentials_at_all_is_its_own_error(tmp_path, monkeypatch):
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(NoKubeCredentials, match=r"\.kube/config does not exist"):
        api_client(None)
