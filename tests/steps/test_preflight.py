"""Preflight with FakeProvider and a tiny in-process Kubernetes API (real kubernetes ApiClient over HTTP)."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from kfp_gpu.errors import PermissionDenied, QuotaExceeded
from kfp_gpu.plan.preflight import PreflightResult
from kfp_gpu.plan.quota import Verdict
from kfp_gpu.providers.fake import FakeProvider
from kfp_gpu.spec import ProvisioningSpec, Target, TargetKind
from kfp_gpu.steps.preflight import check, check_checkpoint_uri, request_increase, run_preflight

GKE = Target(kind=TargetKind.GKE, region="us-central1", namespace="team-a")


def spec(**kw: Any) -> ProvisioningSpec:
    return ProvisioningSpec(**{"accelerator": "a100-80gb", "nodes": 2, "target": GKE, **kw})


def fake(limit: float = 64, global_limit: float = 256) -> FakeProvider:
    fp = FakeProvider(regions={"us-central1", "us-west1", "europe-west4"})
    fp.add_pool("gpu", "us-central1-a", max_size=4)
    fp.add_pool("gpu", "us-central1-b", max_size=4)
    fp.add_pool("gpu", "us-west1-a", max_size=4)
    fp.set_quota("NVIDIA_A100_80GB_GPUS", "us-central1", limit, 0)
    fp.set_quota("NVIDIA_A100_80GB_GPUS", "us-west1", 128, 0)
    fp.set_quota("GPUS_ALL_REGIONS", "global", global_limit, 0)
    return fp


def test_fits_ranked_and_report() -> None:
    res = run_preflight(spec(), fake(), regions=["us-west1"])
    assert res.ok and res.verdict is Verdict.FITS
    assert [p.label for p in res.fitting] == ["us-west1-a", "us-central1-a", "us-central1-b"]  # most headroom first
    md = res.to_markdown()
    assert "NVIDIA_A100_80GB_GPUS" in md and "GPUS_ALL_REGIONS" in md and "2 days" in md
    assert check(res) is res


def test_short_reports_amount_and_check_raises_with_lead_time() -> None:
    res = run_preflight(spec(nodes=3), fake(limit=16, global_limit=16))
    assert res.verdict is Verdict.SHORT and not res.ok
    (short,) = [c for c in res.shortfalls() if c.metric == "NVIDIA_A100_80GB_GPUS"]
    assert short.short_by == 8.0
    with pytest.raises(QuotaExceeded) as ei:
        check(res)
    assert "short by 8 gpus" in ei.value.message
    assert "lead time 2 days" in ei.value.remediation and "kfp-gpu quota request" in ei.value.remediation
    assert "What to do" in res.to_markdown()


def test_unreadable_quota_is_unknown_never_ok() -> None:
    fp = fake()
    fp.fail("quota", PermissionDenied("403 on regions.get", remediation="grant compute.regions.get"), times=-1)
    res = run_preflight(spec(), fp)
    assert res.verdict is Verdict.UNKNOWN and not res.ok
    assert any("403 on regions.get" in u for u in res.unknowns)
    check(res)  # unknown alone does not fail...
    with pytest.raises(QuotaExceeded, match="could not verify"):
        check(res, strict=True)  # ...unless strict
    assert "Could not verify" in res.to_markdown()


def test_unknown_quota_row_and_unlisted_pools() -> None:
    fp = fake()
    fp.set_quota("NVIDIA_A100_80GB_GPUS", "us-central1", None, None, status="unknown", reason="metric not listed")
    fp.fail("pools", RuntimeError("pools down"), times=-1)
    res = run_preflight(spec(), fp)
    assert res.verdict is Verdict.UNKNOWN
    assert "metric not listed" in res.to_markdown()


def test_missing_region_is_short_not_unknown() -> None:
    res = run_preflight(spec(), fake(), regions=["mars-1"])
    mars = [p for p in res.placements if p.region == "mars-1"]
    assert mars and all(p.verdict is Verdict.SHORT for p in mars)


def test_reads_run_concurrently() -> None:
    # 3 regions x (quota + pools) = 6 provider calls; a 6-party barrier only opens if all are in flight.
    barrier = threading.Barrier(6, timeout=10)
    fp = fake()
    fp.on_call = lambda method: barrier.wait() and None
    res = run_preflight(spec(), fp, regions=["us-west1", "europe-west4"])
    assert not barrier.broken and res.fitting


def test_json_round_trip() -> None:
    fp = fake(limit=8)
    fp.set_quota("GPUS_ALL_REGIONS", "global", None, None, status="unknown", reason="x")
    res = run_preflight(spec(checkpoint_uri="s3://bucket/ckpt"), fp, regions=["us-west1"])
    back = PreflightResult.from_json(res.to_json())
    assert back.to_dict() == res.to_dict() and back.to_markdown() == res.to_markdown()


def test_checkpoint_uri(tmp_path: Path) -> None:
    assert check_checkpoint_uri(str(tmp_path / "ckpt")).verdict is Verdict.FITS
    assert check_checkpoint_uri("s3://b/p").verdict is Verdict.UNKNOWN
    assert check_checkpoint_uri("gs://b/p", lambda uri: None).verdict is Verdict.FITS

    def deny(uri: str) -> None:
        raise PermissionError("403")

    assert check_checkpoint_uri("gs://b/p", deny).verdict is Verdict.SHORT
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    if os.geteuid() != 0:  # root ignores permission bits
        assert check_checkpoint_uri(f"file://{ro}/x").verdict is Verdict.SHORT
    (tmp_path / "file").write_text("not a dir")
    res = run_preflight(spec(checkpoint_uri=str(tmp_path / "file" / "ckpt")), fake())
    assert res.verdict is Verdict.SHORT and "checkpoint-uri" in res.error().message


def test_request_increase_derives_metric_and_value() -> None:
    fp = fake(limit=8)
    rid = request_increase(spec(), fp, "", "us-central1", 0, "")
    (call,) = fp.mutations("request_quota_increase")
    assert call.target == "NVIDIA_A100_80GB_GPUS@us-central1" and call.args["value"] == 24.0
    assert rid == call.args["id"] and "a100-80gb" in call.args["justification"]
    assert request_increase(spec(), fp, "NVIDIA_A100_80GB_GPUS", "us-central1", 24, "x") == rid


# ---- Kubernetes side: a minimal API server ---------------------------------------------------
class KubeState:
    def __init__(self) -> None:
        self.routes: dict[str, tuple[int, Any]] = {}

    def set(self, path: str, body: Any, status: int = 200) -> None:
        self.routes[path] = (status, body)


def node(name: str, gpus: int, ready: bool = True, label: str = "nvidia-a100-80gb") -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"cloud.google.com/gke-accelerator": label}},
            "spec": {}, "status": {"allocatable": {"nvidia.com/gpu": str(gpus)},
                                   "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


@pytest.fixture
def fake_kube() -> Iterator[tuple[Any, KubeState]]:
    from kubernetes import client

    state = KubeState()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            status, body = state.routes.get(self.path.split("?")[0], (404, {"kind": "Status", "code": 404}))
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    cfg = client.Configuration()
    cfg.host = f"http://127.0.0.1:{server.server_address[1]}"
    api = client.ApiClient(cfg)
    state.set("/api/v1/nodes", {"items": [node("n1", 8), node("n2", 8, ready=False), node("n3", 8, label="nvidia-l4")]})
    state.set("/api/v1/namespaces/team-a/resourcequotas", {"items": []})
    yield api, state
    server.shutdown()
    api.close()


def cluster_check(res: PreflightResult, name: str) -> Any:
    return next(c for c in res.cluster_checks if c.name == name)


def test_cluster_checks_fit(fake_kube: tuple[Any, KubeState]) -> None:
    api, _ = fake_kube
    res = run_preflight(spec(), fake(), api)
    assert res.ok
    cap = cluster_check(res, "gpu-capacity")
    assert cap.free == 1 + 8  # one Ready matching node + 2 pools x 4 headroom
    assert "not installed" in cluster_check(res, "kueue").detail


def test_namespace_resource_quota_short(fake_kube: tuple[Any, KubeState]) -> None:
    api, state = fake_kube
    state.set("/api/v1/namespaces/team-a/resourcequotas", {"items": [{
        "metadata": {"name": "gpus"}, "spec": {"hard": {"requests.nvidia.com/gpu": "16"}},
        "status": {"hard": {"requests.nvidia.com/gpu": "16"}, "used": {"requests.nvidia.com/gpu": "8"}}}]})
    res = run_preflight(spec(), fake(), api)
    rq = cluster_check(res, "namespace-quota")
    assert (rq.verdict, rq.free, rq.needed) == (Verdict.SHORT, 8.0, 16.0)
    with pytest.raises(QuotaExceeded, match="namespace-quota"):
        check(res)


def test_kueue_cluster_queue(fake_kube: tuple[Any, KubeState]) -> None:
    api, state = fake_kube
    state.set("/apis/kueue.x-k8s.io/v1beta2/namespaces/team-a/localqueues",
              {"items": [{"metadata": {"name": "lq"}, "spec": {"clusterQueue": "gpu-cq"}}]})
    state.set("/apis/kueue.x-k8s.io/v1beta2/resourceflavors", {"items": [
        {"metadata": {"name": "a100"}, "spec": {"nodeLabels": {"cloud.google.com/gke-accelerator": "nvidia-a100-80gb"}}},
        {"metadata": {"name": "l4"}, "spec": {"nodeLabels": {"cloud.google.com/gke-accelerator": "nvidia-l4"}}}]})
    state.set("/apis/kueue.x-k8s.io/v1beta2/clusterqueues/gpu-cq", {
        "spec": {"resourceGroups": [{"coveredResources": ["nvidia.com/gpu"], "flavors": [
            {"name": "l4", "resources": [{"name": "nvidia.com/gpu", "nominalQuota": "64"}]},
            {"name": "a100", "resources": [{"name": "nvidia.com/gpu", "nominalQuota": "24"}]}]}]},
        "status": {"flavorsReservation": [{"name": "a100", "resources": [{"name": "nvidia.com/gpu", "total": "16"}]}]},
    })
    res = run_preflight(spec(), fake(), api)
    kq = cluster_check(res, "kueue")
    assert (kq.verdict, kq.free) == (Verdict.SHORT, 8.0) and "gpu-cq" in kq.detail and "l4 is nvidia-l4" in kq.detail
    wrong = cluster_check(run_preflight(spec(target=Target(kind=TargetKind.GKE, namespace="team-a", queue="x")),
                                        fake(), api), "kueue")
    assert wrong.verdict is Verdict.SHORT and "no LocalQueue x in namespace team-a; have: lq" in wrong.detail


def test_forbidden_cluster_reads_are_unknown(fake_kube: tuple[Any, KubeState]) -> None:
    api, state = fake_kube
    state.set("/api/v1/namespaces/team-a/resourcequotas", {"kind": "Status", "code": 403}, status=403)
    res = run_preflight(spec(), fake(), api)
    rq = cluster_check(res, "namespace-quota")
    assert rq.verdict is Verdict.UNKNOWN and "RBAC" in rq.remediation and not res.ok
