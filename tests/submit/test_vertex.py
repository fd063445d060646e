from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from google.auth.credentials import AnonymousCredentials

from kfp_gpu.errors import CloudError, InvalidSpec, PermissionDenied
from kfp_gpu.submit.vertex import submit_vertex
from tests.submit.standins import Req, StandIn

JOBS = "/v1/projects/proj-1/locations/us-central1/pipelineJobs"


class FakeVertex:
    def __init__(self) -> None:
        self.http = StandIn()
        self.fail: tuple[int, str] | None = None
        self.http.route("POST", JOBS, self._create)

    def _create(self, req: Req) -> tuple[int, Any]:
        if self.fail:
            code, status = self.fail
            return code, {"error": {"code": code, "message": f"simulated {status}", "status": status}}
        job_id = req.query["pipelineJobId"][0]
        return 200, {**req.json(), "name": f"projects/proj-1/locations/us-central1/pipelineJobs/{job_id}",
                     "state": "PIPELINE_STATE_PENDING"}


@pytest.fixture
def vertex() -> Iterator[FakeVertex]:
    fake = FakeVertex()
    fake.http.start()
    yield fake
    fake.http.stop()


def _submit(fake: FakeVertex, package: Path, **kw: Any) -> Any:
    args: dict[str, Any] = dict(project="proj-1", region="us-central1", pipeline_root="gs://bucket/root",
                                api_endpoint=fake.http.url, credentials=AnonymousCredentials())
    args.update(kw)
    return submit_vertex(package, **args)


def test_creates_pipeline_job_with_spec_params_and_service_account(vertex: FakeVertex, package: Path) -> None:
    t = time.monotonic()
    res = _submit(vertex, package, params={"msg": "hello"}, service_account="runner@proj-1.iam.gserviceaccount.com",
                  job_id="tiny-run-1", labels={"team": "ml"})
    assert time.monotonic() - t < 10, "bucket auto-create must be skipped"
    (req,) = vertex.http.calls("POST", JOBS)
    assert req.query["pipelineJobId"] == ["tiny-run-1"]
    body = req.json()
    assert body["pipelineSpec"]["pipelineInfo"]["name"] == "tiny-pipeline"
    assert "root" in body["pipelineSpec"] and "deploymentSpec" in body["pipelineSpec"]
    assert body["runtimeConfig"] == {"gcsOutputDirectory": "gs://bucket/root", "parameterValues": {"msg": "hello"}}
    assert body["serviceAccount"] == "runner@proj-1.iam.gserviceaccount.com"
    assert body["labels"]["team"] == "ml"
    assert res.run_id == "tiny-run-1" and res.backend == "vertex" and res.pipeline_id == "tiny-pipeline"
    assert "console.cloud.google.com/vertex-ai/locations/us-central1/pipelines/runs/tiny-run-1" in res.url


def test_generated_job_id(vertex: FakeVertex, package: Path) -> None:
    res = _submit(vertex, package)
    (req,) = vertex.http.calls("POST", JOBS)
    assert req.query["pipelineJobId"] == [res.run_id] and res.run_id.startswith("tiny-pipeline-")


def test_two_document_yaml_is_rejected_before_any_call(vertex: FakeVertex, two_doc_package: Path) -> None:
    with pytest.raises(InvalidSpec, match="single-document") as ei:
        _submit(vertex, two_doc_package)
    assert ei.value.field == "package_path" and "vertex" in ei.value.remediation
    assert vertex.http.requests == []


@pytest.mark.parametrize("kw,field", [
    ({"pipeline_root": ""}, "pipeline_root"),
    ({"pipeline_root": "/local/dir"}, "pipeline_root"),
    ({"project": ""}, "project"),
    ({"region": "us-central1-a"}, "region"),
    ({"params": {"nope": 1}}, "params.nope"),
])
def test_invalid_inputs_name_the_field(vertex: FakeVertex, package: Path, kw: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidSpec) as ei:
        _submit(vertex, package, **kw)
    assert ei.value.field == field
    assert vertex.http.requests == []


def test_api_errors_are_classified(vertex: FakeVertex, package: Path) -> None:
    vertex.fail = (403, "PERMISSION_DENIED")
    with pytest.raises(PermissionDenied) as ei:
        _submit(vertex, package)
    assert "simulated PERMISSION_DENIED" in ei.value.message and "aiplatform.user" in ei.value.remediation
    vertex.fail = (400, "INVALID_ARGUMENT")
    with pytest.raises(CloudError, match="simulated INVALID_ARGUMENT"):
        _submit(vertex, package)


def test_no_google_cloud_import_at_import_time() -> None:
    code = (
        "import sys, kfp_gpu, kfp_gpu.submit, kfp_gpu.submit.vertex, kfp_gpu.submit.kfp_backend, "
        "kfp_gpu.submit.gke_access, kfp_gpu.quota_plan, kfp_gpu.report\n"
        "bad = [m for m in sys.modules if m.startswith('google.cloud.')]  # the bare namespace comes from a .pth\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
