from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest
import yaml

from kfp_gpu.errors import InvalidSpec, NotFound, PermissionDenied, TransientCloudError
from kfp_gpu.submit.kfp_backend import classify_http, submit_kfp
from tests.submit.standins import FakeKfp


def test_first_submit_uploads_pipeline_and_creates_run(kfp_server: FakeKfp, package: Path) -> None:
    res = submit_kfp(package, kfp_server.http.url, pipeline_name="tiny", experiment="gpu-runs",
                     params={"msg": "hello"})
    http = kfp_server.http
    (up,) = http.calls("POST", "/apis/v2beta1/pipelines/upload")
    assert up.query["name"] == ["tiny"]
    assert up.headers["content-type"].startswith("multipart/form-data")
    fname, content = up.multipart()["uploadfile"]
    assert fname and yaml.safe_load(content)["pipelineInfo"]["name"] == "tiny-pipeline"
    assert http.calls("POST", "/apis/v2beta1/experiments")[0].json()["display_name"] == "gpu-runs"
    (run_req,) = http.calls("POST", "/apis/v2beta1/runs")
    body = run_req.json()
    assert body["pipeline_version_reference"] == {"pipeline_id": "pipe-1", "pipeline_version_id": "ver-1"}
    assert body["runtime_config"]["parameters"] == {"msg": "hello"}
    assert body["experiment_id"] == "exp-1"
    assert "pipeline_spec" not in body or body["pipeline_spec"] is None
    assert res.run_id == "run-1" and res.pipeline_id == "pipe-1" and res.version_id == "ver-1"
    assert res.url == f"{http.url}/#/runs/details/run-1"


def test_existing_name_uploads_new_version_and_reuses_experiment(kfp_server: FakeKfp, package: Path) -> None:
    submit_kfp(package, kfp_server.http.url, pipeline_name="tiny", experiment="e")
    res = submit_kfp(package, kfp_server.http.url, pipeline_name="tiny", experiment="e", version_name="v2")
    http = kfp_server.http
    assert len(http.calls("POST", "/apis/v2beta1/pipelines/upload")) == 2  # upload + upload_version prefix
    (upv,) = http.calls("POST", "/apis/v2beta1/pipelines/upload_version")
    assert upv.query["pipelineid"] == ["pipe-1"] and upv.query["name"] == ["v2"]
    assert "uploadfile" in upv.multipart()
    assert len(http.calls("POST", "/apis/v2beta1/experiments")) == 1  # second run found it by name
    assert res.version_id == "ver-2" and res.pipeline_id == "pipe-1" and res.run_id == "run-2"
    assert kfp_server.runs[1]["pipeline_version_reference"]["pipeline_version_id"] == "ver-2"


def test_no_experiment_means_server_default(kfp_server: FakeKfp, package: Path) -> None:
    submit_kfp(package, kfp_server.http.url, pipeline_name="tiny")
    assert kfp_server.http.calls("POST", "/apis/v2beta1/experiments") == []
    assert not kfp_server.runs[0].get("experiment_id")


def test_token_is_sent_and_bad_token_is_permission_denied(kfp_server_with_token: FakeKfp, package: Path) -> None:
    url = kfp_server_with_token.http.url
    res = submit_kfp(package, url, pipeline_name="tiny", token="s3cret-token-value")
    assert res.run_id == "run-1"
    assert all(r.headers.get("authorization") == "Bearer s3cret-token-value"
               for r in kfp_server_with_token.http.requests)
    t = time.monotonic()
    with pytest.raises(PermissionDenied) as ei:
        submit_kfp(package, url, pipeline_name="tiny", token="wrong")
    assert time.monotonic() - t < 5
    assert "HTTP 401" in ei.value.message and "token" in ei.value.remediation
    assert "\n" not in ei.value.message


def test_connection_refused_is_one_line_not_found(package: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t = time.monotonic()
    with pytest.raises(NotFound) as ei:
        submit_kfp(package, f"http://127.0.0.1:{port}", pipeline_name="tiny")
    assert time.monotonic() - t < 5
    assert "no KFP API reachable" in ei.value.message and "port-forward" in ei.value.remediation


def test_wrong_path_is_not_found(kfp_server: FakeKfp, package: Path) -> None:
    with pytest.raises(NotFound, match="HTTP 404"):
        submit_kfp(package, kfp_server.http.url + "/pipeline", pipeline_name="tiny")


def test_input_validation(kfp_server: FakeKfp, package: Path, tmp_path: Path) -> None:
    with pytest.raises(InvalidSpec) as ei:
        submit_kfp(tmp_path / "missing.yaml", kfp_server.http.url, pipeline_name="x")
    assert ei.value.field == "package_path"
    bad = tmp_path / "bad.yaml"
    bad.write_text("just: a map\n")
    with pytest.raises(InvalidSpec, match="not a compiled KFP pipeline"):
        submit_kfp(bad, kfp_server.http.url, pipeline_name="x")
    with pytest.raises(InvalidSpec) as ei:
        submit_kfp(package, kfp_server.http.url, pipeline_name=" ")
    assert ei.value.field == "pipeline_name"
    with pytest.raises(InvalidSpec) as ei:
        submit_kfp(package, "localhost:8080", pipeline_name="x")
    assert ei.value.field == "host"
    with pytest.raises(InvalidSpec) as ei:
        submit_kfp(package, kfp_server.http.url, pipeline_name="x", params={"o": object()})
    assert ei.value.field == "params"
    assert kfp_server.http.requests == []


def test_classify_http() -> None:
    assert isinstance(classify_http(403, "h", "x"), PermissionDenied)
    assert isinstance(classify_http(503, "h", "x"), TransientCloudError)
    assert classify_http(503, "h", "x").transient
