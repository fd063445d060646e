"""Submit a compiled pipeline package to a Kubeflow Pipelines API server (v2beta1 API).

Flow (every call goes through ``kfp.Client``): probe ``GET /apis/v2beta1/healthz`` once (fast, clear
errors for a wrong host or token) -> find the pipeline by name -> upload it
(``POST /apis/v2beta1/pipelines/upload``) or, when the name exists, a new version
(``POST /apis/v2beta1/pipelines/upload_version``) -> get or create the experiment -> create the run
(``POST /apis/v2beta1/runs``) pinned to that exact pipeline version.

Every failure is one :class:`~kfp_gpu.errors.KfpGpuError` with a remediation, never a traceback from
the generated client.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import hashlib
import io
import json
import urllib.error
import urllib.request
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from kfp_gpu.errors import (
    CloudError,
    InvalidSpec,
    KfpGpuError,
    NotFound,
    PermissionDenied,
    RateLimited,
    TransientCloudError,
)
from kfp_gpu.submit.result import SubmitResult, check_params, load_package

_PORT_FORWARD = "kubectl port-forward -n kubeflow svc/ml-pipeline-ui 8080:80, then host http://localhost:8080 (kfp-gpu submit --kfp-host)"


def _token_fix(host: str) -> str:
    return (
        f"pass a valid bearer token for {host} (e.g. `gcloud auth print-access-token` for an IAP/GKE "
        "endpoint, or a Kubernetes service-account token for an Istio-fronted Kubeflow)"
    )


def classify_http(status: int, host: str, what: str, detail: str = "") -> KfpGpuError:
    """Map an HTTP status from the KFP API to a KfpGpuError with a fix (returned, not raised). Raises: nothing."""
    tail = f": {detail[:200]}" if detail else ""
    if status in (401, 403):
        return PermissionDenied(
            f"KFP API at {host} refused {what} (HTTP {status}){tail}", remediation=_token_fix(host),
            host=host, status=status,
        )
    if status == 404:
        return NotFound(
            f"KFP API at {host} has no endpoint for {what} (HTTP 404)",
            remediation=f"point the host at the KFP v2 API root (no /pipeline suffix), or {_PORT_FORWARD}",
            host=host, status=status,
        )
    if status == 429:
        return RateLimited(f"KFP API at {host} throttled {what} (HTTP 429)", remediation="retry later",
                           host=host, status=status)
    if status >= 500:
        return TransientCloudError(
            f"KFP API at {host} failed {what} (HTTP {status}){tail}",
            remediation="retry; if it persists check the ml-pipeline deployment logs", host=host, status=status,
        )
    return CloudError(f"KFP API at {host} rejected {what} (HTTP {status}){tail}",
                      remediation="check the pipeline package and parameters", host=host, status=status)


def _unreachable(host: str, reason: object) -> NotFound:
    return NotFound(
        f"no KFP API reachable at {host} ({reason})",
        remediation=f"check the host (scheme, port); for a local cluster: {_PORT_FORWARD}",
        host=host,
    )


def probe(host: str, token: str | None = None, timeout: float = 10.0) -> None:
    """One ``GET /apis/v2beta1/healthz`` so a wrong host or token fails in seconds.

    Raises: NotFound (unreachable / not a KFP API), PermissionDenied (401/403), TransientCloudError.
    """
    req = urllib.request.Request(host.rstrip("/") + "/apis/v2beta1/healthz")
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 - user-given KFP host
            resp.read()
    except urllib.error.HTTPError as exc:
        raise classify_http(exc.code, host, "the health check") from None
    except OSError as exc:  # URLError, ConnectionError, TimeoutError
        reason = getattr(exc, "reason", exc)
        if isinstance(reason, TimeoutError):
            raise TransientCloudError(f"KFP API at {host} did not answer within {timeout:g}s",
                                      remediation="check the host and network path; retry", host=host) from None
        raise _unreachable(host, reason) from None


@contextlib.contextmanager
def _translated(host: str, what: str) -> Iterator[None]:
    """Turn kfp_server_api / urllib3 exceptions raised inside the block into KfpGpuErrors."""
    from kfp_server_api.exceptions import ApiException
    from urllib3.exceptions import HTTPError as Urllib3Error

    try:
        yield
    except KfpGpuError:
        raise
    except ApiException as exc:
        raise classify_http(int(exc.status or 0), host, what, str(exc.body or exc.reason or "")) from None
    except Urllib3Error as exc:
        raise _unreachable(host, exc.__class__.__name__) from None
    except ValueError as exc:  # kfp.Client: duplicate names, bad display names
        raise InvalidSpec("pipeline_name", what, str(exc)) from None


def default_version_name(package_path: str | Path, now: _dt.datetime | None = None) -> str:
    """``v<UTC timestamp>-<sha256[:8] of the package>``: unique per upload, traceable to the bytes.

    Raises: OSError when the package cannot be read.
    """
    digest = hashlib.sha256(Path(package_path).read_bytes()).hexdigest()[:8]
    stamp = (now or _dt.datetime.now(_dt.timezone.utc)).strftime("%Y%m%d-%H%M%S")
    return f"v{stamp}-{digest}"


def submit_kfp(
    package_path: str | Path,
    host: str,
    *,
    pipeline_name: str,
    experiment: str | None = None,
    params: Mapping[str, Any] | None = None,
    token: str | None = None,
    version_name: str | None = None,
    run_name: str | None = None,
    namespace: str | None = None,
    service_account: str | None = None,
) -> SubmitResult:
    """Upload ``package_path`` (or a new version of ``pipeline_name``) and start a run.

    Args:
        package_path: compiled pipeline YAML.
        host: KFP API root, e.g. ``http://localhost:8080``.
        pipeline_name: display name; an existing pipeline gets a new version instead.
        experiment: experiment display name (created if missing); None = the server's default.
        params: pipeline parameters.
        token: bearer token, sent as ``Authorization: Bearer``.
        version_name: version display name; default :func:`default_version_name`.
        run_name: run display name; default ``<pipeline_name> <version_name>``.
        namespace: Kubeflow profile namespace (multi-user deployments only).
        service_account: Kubernetes service account the run's pods use.

    Raises:
        InvalidSpec: missing/invalid package, empty pipeline name, unknown/missing or
            non-JSON-serialisable params.
        NotFound: the host is unreachable or not a KFP v2 API.
        PermissionDenied: 401/403 (bad or missing token).
        RateLimited, TransientCloudError, CloudError: other API failures.
    """
    docs = load_package(package_path)
    if not pipeline_name or not pipeline_name.strip():
        raise InvalidSpec("pipeline_name", pipeline_name, "must be a non-empty display name")
    if not host.startswith(("http://", "https://")):
        raise InvalidSpec("host", host, "must start with http:// or https://",
                          remediation="e.g. http://localhost:8080 (kfp-gpu submit --kfp-host)")
    args = dict(params or {})
    try:
        json.dumps(args)
    except (TypeError, ValueError) as exc:
        raise InvalidSpec("params", repr(args)[:80], f"must be JSON-serialisable ({exc})") from None
    check_params(docs[0], args)
    host = host.rstrip("/")
    probe(host, token)
    version = version_name or default_version_name(package_path)

    import kfp

    sink = io.StringIO()  # kfp.Client prints links; we return the URL instead
    with warnings.catch_warnings(), contextlib.redirect_stdout(sink):
        warnings.simplefilter("ignore", FutureWarning)
        with _translated(host, "client setup"):
            kw: dict[str, Any] = {"namespace": namespace} if namespace else {}
            client = kfp.Client(host=host, existing_token=token, **kw)
        with _translated(host, f"looking up pipeline {pipeline_name!r}"):
            pipeline_id = client.get_pipeline_id(pipeline_name)
        if pipeline_id is None:
            with _translated(host, f"uploading pipeline {pipeline_name!r}"):
                pipeline = client.upload_pipeline(str(package_path), pipeline_name=pipeline_name,
                                                  namespace=namespace)
                pipeline_id = str(pipeline.pipeline_id)
            with _translated(host, f"listing versions of {pipeline_name!r}"):
                versions = client.list_pipeline_versions(pipeline_id, page_size=1, sort_by="created_at desc")
                if not versions.pipeline_versions:
                    raise CloudError(f"KFP created pipeline {pipeline_id} without a version",
                                     remediation="retry the submission", host=host)
                version_id = str(versions.pipeline_versions[0].pipeline_version_id)
        else:
            with _translated(host, f"uploading version {version!r} of {pipeline_name!r}"):
                pv = client.upload_pipeline_version(str(package_path), version, pipeline_id=pipeline_id)
                version_id = str(pv.pipeline_version_id)
        experiment_id = ""
        if experiment:
            with _translated(host, f"creating experiment {experiment!r}"):
                experiment_id = str(client.create_experiment(experiment, namespace=namespace).experiment_id)
        with _translated(host, "creating the run"):
            run = client.run_pipeline(
                experiment_id=experiment_id or None,
                job_name=run_name or f"{pipeline_name} {version}",
                params=args,
                pipeline_id=pipeline_id,
                version_id=version_id,
                service_account=service_account,
            )
    run_id = str(run.run_id)
    return SubmitResult(
        run_id=run_id, pipeline_id=pipeline_id, url=f"{host}/#/runs/details/{run_id}",
        backend="kfp", version_id=version_id, experiment_id=experiment_id,
    )
