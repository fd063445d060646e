"""The preflight step probes the checkpoint store: gs:// against the real GCS emulator (fake-gcs-server), s3:// against
moto in server mode (real HTTP, moto's IAM evaluation for the denied path). Every case runs the real step function
(:func:`kfp_gpu.steps.preflight_step.run`) with FakeProvider and the in-process Kubernetes API of test_preflight."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from google.api_core import exceptions as gexc
from moto.core.authorization import enable_iam_authentication
from moto.server import ThreadedMotoServer

from kfp_gpu.checkpoint.backends import GCSBackend
from kfp_gpu.checkpoint.probe import DENIED, MISSING, UNKNOWN, classify, probe, probe_key
from kfp_gpu.errors import QuotaExceeded
from kfp_gpu.plan.quota import Verdict
from kfp_gpu.steps import preflight_step
from kfp_gpu.steps.result import StepResult
from tests.gcs_support import GcsBucket
from tests.steps.test_preflight import KubeState, fake, fake_kube, spec  # noqa: F401  (fake_kube is a fixture)

RUN = "run-probe-1"


def ckpt_check(out: StepResult) -> dict[str, Any]:
    checks = {c["name"]: c for c in json.loads(out.output_json)["cluster_checks"]}
    return dict(checks["checkpoint-uri"])


def run_step(uri: str, api: Any) -> StepResult:
    return preflight_step.run(spec(checkpoint_uri=uri), RUN, "", api=api, provider=fake())


# ---- gs:// against the emulator ------------------------------------------------------------------------------------
@pytest.mark.integration  # the GCS emulator
def test_gs_writable_bucket_is_ok_and_left_clean(gcs: GcsBucket, fake_kube: tuple[Any, KubeState]) -> None:  # noqa: F811
    out = run_step(gcs.uri("runs/a"), fake_kube[0])
    check = ckpt_check(out)
    assert check["verdict"] == Verdict.FITS.value, check
    assert f"wrote, read back and deleted {gcs.uri('runs/a')}/{probe_key(RUN)}" in check["detail"]
    assert gcs.keys() == []  # the probe object is gone
    assert out.metrics["unknown_checks"] == 0.0


class Watching(GCSBackend):
    """The real gs:// backend, reading the probe object's metadata from the emulator just before it is deleted."""

    seen: dict[str, str] | None = None

    def delete(self, key: str) -> None:
        blob = self._bucket.get_blob(self._key(key))
        self.seen = dict(blob.metadata or {}) if blob is not None else None
        super().delete(key)


@pytest.mark.integration  # the GCS emulator
def test_gs_probe_object_carries_the_run_id(gcs: GcsBucket) -> None:
    backend = Watching(gcs.bucket, "p")
    res = probe(gcs.uri("p"), run_id=RUN, backend=backend, now=0.0)
    assert res.ok, res
    assert backend.seen == {"kfp-gpu-run-id": RUN, "kfp-gpu-step": "preflight",
                            "kfp-gpu-lease-expires": "1970-01-01T01:00:00Z"}


@pytest.mark.integration  # the GCS emulator
def test_gs_missing_bucket_fails_the_step_naming_it(gcs: GcsBucket, fake_kube: tuple[Any, KubeState]) -> None:  # noqa: F811
    bucket = f"no-such-bucket-{uuid.uuid4().hex[:8]}"
    with pytest.raises(QuotaExceeded) as err:
        run_step(f"gs://{bucket}/ckpt", fake_kube[0])
    msg = err.value.message
    assert "checkpoint-uri" in msg and f"gs://{bucket}: the bucket does not exist" in msg
    assert f"create the bucket {bucket}" in err.value.remediation


@pytest.mark.integration  # the GCS emulator
def test_gs_unreachable_store_is_unknown_never_ok(gcs: GcsBucket, fake_kube: tuple[Any, KubeState],  # noqa: F811
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{dead}")
    out = run_step(gcs.uri("x"), fake_kube[0])
    check = ckpt_check(out)
    assert check["verdict"] == Verdict.UNKNOWN.value and "could not write the probe object" in check["detail"]
    assert "ConnectionError" in check["detail"] and out.metrics["unknown_checks"] >= 1.0


def test_gs_denied_names_the_bucket_and_permission() -> None:
    """The emulator checks no IAM, so the 403 path is the classifier's logic, on the SDK's own exception types."""
    for phase, perm in (("write", "storage.objects.create"), ("read", "storage.objects.get"),
                        ("delete", "storage.objects.delete")):
        res = classify("gs://team-ckpt/runs", phase, gexc.Forbidden("caller does not have permission"))
        assert res.status == DENIED and "gs://team-ckpt" in res.reason and f"missing permission {perm}" in res.reason
        assert "roles/storage.objectUser" in res.remediation
    assert classify("gs://b/x", "write", gexc.NotFound("no bucket")).status == MISSING
    assert classify("gs://b/x", "read", gexc.NotFound("gone")).status == UNKNOWN  # not a missing bucket
    assert classify("gs://b/x", "write", gexc.ServiceUnavailable("try later")).status == UNKNOWN
    rejected = classify("gs://b/x", "write", gexc.Unauthorized("invalid token"))
    assert rejected.status == DENIED and "rejected the credentials" in rejected.reason


# ---- s3:// against moto --------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def moto_endpoint() -> Iterator[str]:
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def s3_bucket(moto_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Any, str]]:
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_endpoint)
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    for var in ("AWS_PROFILE", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    client = boto3.client("s3", endpoint_url=moto_endpoint)
    name = f"probe-{uuid.uuid4().hex[:10]}"
    client.create_bucket(Bucket=name)
    yield client, name
    for o in client.list_objects_v2(Bucket=name).get("Contents", []):
        client.delete_object(Bucket=name, Key=o["Key"])
    client.delete_bucket(Bucket=name)


def test_s3_writable_bucket_is_ok_and_left_clean(s3_bucket: tuple[Any, str],
                                                 fake_kube: tuple[Any, KubeState]) -> None:  # noqa: F811
    client, bucket = s3_bucket
    check = ckpt_check(run_step(f"s3://{bucket}/runs/a", fake_kube[0]))
    assert check["verdict"] == Verdict.FITS.value, check
    assert client.list_objects_v2(Bucket=bucket).get("KeyCount") == 0


def test_s3_missing_bucket_fails_the_step(s3_bucket: tuple[Any, str], fake_kube: tuple[Any, KubeState]) -> None:  # noqa: F811
    bucket = f"no-such-bucket-{uuid.uuid4().hex[:8]}"
    with pytest.raises(QuotaExceeded) as err:
        run_step(f"s3://{bucket}/ckpt", fake_kube[0])
    assert f"s3://{bucket}: the bucket does not exist" in err.value.message and "NoSuchBucket" in err.value.message


def test_s3_denied_names_the_bucket_and_missing_permission(s3_bucket: tuple[Any, str], moto_endpoint: str,
                                                          fake_kube: tuple[Any, KubeState],  # noqa: F811
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    _, bucket = s3_bucket
    iam = boto3.client("iam", endpoint_url=moto_endpoint)
    user = f"reader-{uuid.uuid4().hex[:6]}"
    iam.create_user(UserName=user)
    iam.put_user_policy(UserName=user, PolicyName="read-only", PolicyDocument=json.dumps({
        "Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": ["s3:GetObject", "s3:ListBucket"],
                                                "Resource": [f"arn:aws:s3:::{bucket}", f"arn:aws:s3:::{bucket}/*"]}]}))
    key = iam.create_access_key(UserName=user)["AccessKey"]
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", key["AccessKeyId"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", key["SecretAccessKey"])
    monkeypatch.setattr(boto3, "DEFAULT_SESSION", None)  # boto3's default session caches the first credentials
    with enable_iam_authentication(), pytest.raises(QuotaExceeded) as err:
        run_step(f"s3://{bucket}/ckpt", fake_kube[0])
    msg = err.value.message
    assert f"s3://{bucket}: write of the probe object denied, missing permission s3:PutObject" in msg, msg
    assert "AccessDenied" in msg and f"arn:aws:s3:::{bucket}" in err.value.remediation
