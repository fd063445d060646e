"""Submit a compiled pipeline to Vertex AI Pipelines (``google.cloud.aiplatform.PipelineJob``).

Vertex accepts only a *single-document* PipelineSpec: any ``kfp.kubernetes`` call makes the compiler
append a second (platform config) document, which Vertex rejects, so that is checked up front.
The pipeline root must be a ``gs://`` URI the run's service account can write. By default we do not
let the SDK create the artifacts bucket (it would need ``storage.buckets.create`` and, offline,
retries for ~120 s); pass ``ensure_bucket=True`` to keep the SDK behaviour.

Testing offline: ``api_endpoint="http://127.0.0.1:PORT"`` switches to the REST transport against a
stand-in; pass ``credentials=google.auth.credentials.AnonymousCredentials()``.
"""

from __future__ import annotations

import contextlib
import re
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from kfp_gpu.errors import InvalidSpec, KfpGpuError
from kfp_gpu.submit._google import VERTEX_IAM_FIX, classify_google
from kfp_gpu.submit.result import SubmitResult, check_params, load_package

_REGION_RE = re.compile(r"^[a-z]+-[a-z]+\d+$")
_BUCKET_LOCK = threading.Lock()


def check_single_document(package_path: str | Path) -> dict[str, Any]:
    """The PipelineSpec of a package Vertex can run.

    Raises:
        InvalidSpec: missing/invalid package, or more than one YAML document.
    """
    docs = load_package(package_path)
    if len(docs) > 1:
        raise InvalidSpec(
            "package_path", str(package_path),
            f"has {len(docs)} YAML documents; Vertex AI Pipelines accepts a single-document PipelineSpec "
            "(the extra document is kfp-kubernetes platform config)",
            remediation="compile the Vertex variant (target 'vertex': no kfp.kubernetes calls), "
                        "e.g. kfp-gpu compile --target vertex",
        )
    return docs[0]


@contextlib.contextmanager
def _no_bucket_autocreate(enabled: bool) -> Iterator[None]:
    """Skip PipelineJob.submit()'s GCS bucket get-or-create while the block runs (process-wide, locked)."""
    if not enabled:
        yield
        return
    from google.cloud.aiplatform.utils import gcs_utils as mod  # the module PipelineJob.submit() calls into

    name = "create_gcs_bucket_for_pipeline_artifacts_if_it_does_not_exist"
    with _BUCKET_LOCK:
        original = getattr(mod, name)
        setattr(mod, name, lambda **_: None)
        try:
            yield
        finally:
            setattr(mod, name, original)


def submit_vertex(
    package_path: str | Path,
    *,
    project: str,
    region: str,
    pipeline_root: str,
    params: Mapping[str, Any] | None = None,
    service_account: str | None = None,
    api_endpoint: str | None = None,
    credentials: Any = None,
    display_name: str | None = None,
    job_id: str | None = None,
    labels: Mapping[str, str] | None = None,
    enable_caching: bool | None = None,
    ensure_bucket: bool = False,
) -> SubmitResult:
    """Create a Vertex AI PipelineJob from a single-document pipeline package.

    Args:
        package_path: compiled single-document pipeline YAML (the Vertex variant).
        project, region: where the job runs (``region`` like ``us-central1``).
        pipeline_root: ``gs://bucket/path`` for artifacts; required.
        params: pipeline parameters.
        service_account: run-as service account email (needs iam.serviceAccountUser for the caller).
        api_endpoint: endpoint override; an ``http://`` URL selects the REST transport (stand-ins).
        credentials: google-auth credentials; None = Application Default Credentials.
        display_name, job_id, labels, enable_caching: passed to ``PipelineJob``.
        ensure_bucket: let the SDK get-or-create the pipeline_root bucket (off by default).

    Raises:
        InvalidSpec: missing pipeline_root / project / bad region, a multi-document package, unknown params.
        PermissionDenied: no credentials, or an IAM refusal (401/403).
        NotFound, RateLimited, TransientCloudError, CloudError: API failures, classified.
    """
    spec = check_single_document(package_path)
    if not pipeline_root:
        raise InvalidSpec("pipeline_root", pipeline_root, "is required for Vertex AI Pipelines",
                          remediation="pass pipeline_root='gs://<bucket>/pipeline-root' (a bucket the run can write)")
    if not pipeline_root.startswith("gs://"):
        raise InvalidSpec("pipeline_root", pipeline_root, "must be a gs:// URI",
                          remediation="use gs://<bucket>/<path>")
    if not project:
        raise InvalidSpec("project", project, "is required (the GCP project id)")
    if not _REGION_RE.match(region or ""):
        raise InvalidSpec("region", region, "must be a Vertex AI region such as 'us-central1'")
    args = dict(params or {})
    check_params(spec, args)

    from google.cloud import aiplatform
    from google.cloud.aiplatform import pipeline_jobs

    name = display_name or str(spec["pipelineInfo"].get("name", "pipeline"))
    try:
        init_kw: dict[str, Any] = {"project": project, "location": region}
        if credentials is not None:
            init_kw["credentials"] = credentials
        if api_endpoint:
            init_kw["api_endpoint"] = api_endpoint
            if api_endpoint.startswith("http://"):
                init_kw["api_transport"] = "rest"
        aiplatform.init(**init_kw)
        job = pipeline_jobs.PipelineJob(
            display_name=name, template_path=str(package_path), job_id=job_id, pipeline_root=pipeline_root,
            parameter_values=args, enable_caching=enable_caching, labels=dict(labels or {}) or None,
            project=project, location=region, credentials=credentials,
        )
        with _no_bucket_autocreate(not ensure_bucket):
            job.submit(service_account=service_account)
    except KfpGpuError:
        raise
    except Exception as exc:  # noqa: BLE001 - every SDK failure is classified, none escapes raw
        raise classify_google(exc, f"Vertex AI PipelineJob create in {project}/{region}", VERTEX_IAM_FIX) from None
    return SubmitResult(
        run_id=str(job.job_id), pipeline_id=name, url=job._dashboard_uri(), backend="vertex",
    )
