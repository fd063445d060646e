"""The s3:// backend against moto in server mode: real HTTP, endpoint taken from AWS_ENDPOINT_URL."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest

boto3 = pytest.importorskip("boto3")
moto_server = pytest.importorskip("moto.server")

from kfp_gpu.checkpoint import MARKER, CheckpointStore, StorageError, probe_writable  # noqa: E402
from kfp_gpu.checkpoint.backends import S3Backend, open_backend  # noqa: E402

BUCKET = "kfp-gpu-ckpt"


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def s3(endpoint: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    for var in ("AWS_PROFILE", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    client = boto3.client("s3", endpoint_url=endpoint)
    client.create_bucket(Bucket=BUCKET)
    yield client
    keys = [o["Key"] for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET)
            for o in page.get("Contents", [])]
    if keys:
        client.delete_objects(Bucket=BUCKET, Delete={"Objects": [{"Key": k} for k in keys]})
    client.delete_bucket(Bucket=BUCKET)


class RecordingClient:
    """Wraps a boto3 client and records the order of PUTs."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.puts: list[str] = []

    def put_object(self, **kw: Any) -> Any:
        self.puts.append(kw["Key"])
        return self.inner.put_object(**kw)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_s3_roundtrip_marker_written_last(s3: Any) -> None:
    rec = RecordingClient(s3)
    store = CheckpointStore(f"s3://{BUCKET}/runs/r1", backend=S3Backend(BUCKET, "runs/r1", client=rec))
    c = store.save(12, {"model.pt": b"M" * 5000, "optimizer.pt": b"O" * 100}, meta={"run": "r1"})
    assert rec.puts[-1] == f"runs/r1/{c.name}/{MARKER}" and len(rec.puts) == 3
    assert c.uri == f"s3://{BUCKET}/runs/r1/{c.name}"
    # A store built from the URI alone finds it through AWS_ENDPOINT_URL.
    fresh = CheckpointStore(f"s3://{BUCKET}/runs/r1/")
    assert isinstance(fresh.backend, S3Backend)
    latest = fresh.latest()
    assert latest is not None and latest.step == 12 and latest.meta == {"run": "r1"}
    assert fresh.load(latest) == {"model.pt": b"M" * 5000, "optimizer.pt": b"O" * 100}


def test_s3_partial_and_corrupt_are_skipped(s3: Any, caplog: pytest.LogCaptureFixture) -> None:
    store = CheckpointStore(f"s3://{BUCKET}/runs/r2")
    store.save(10, {"model.pt": b"ten"})
    c20 = store.save(20, {"model.pt": b"twenty"})
    s3.put_object(Bucket=BUCKET, Key=f"runs/r2/{c20.name}/model.pt", Body=b"tampered")
    s3.put_object(Bucket=BUCKET, Key="runs/r2/step-000000030.tmp-abcdef12/model.pt", Body=b"half")
    with caplog.at_level(logging.WARNING, logger="kfp_gpu.checkpoint"):
        latest = store.latest()
    assert latest is not None and latest.step == 10
    assert c20.name in caplog.text and "step-000000030.tmp-abcdef12" in caplog.text


def test_s3_prune_and_many_files(s3: Any) -> None:
    store = CheckpointStore(f"s3://{BUCKET}/runs/r3")
    for s in range(1, 5):
        store.save(s, {f"shard-{i}.bin": bytes([s, i]) for i in range(5)})
    deleted = store.prune(keep=2)
    assert len(deleted) == 2 and [c.step for c in store.list()] == [3, 4]
    assert all(k.startswith(("step-000000003", "step-000000004")) for k in store.backend.list())


def test_s3_probe(s3: Any) -> None:
    ok, reason = probe_writable(f"s3://{BUCKET}/probe-here")
    assert ok, reason
    assert store_keys(s3, "probe-here/") == []
    ok, reason = probe_writable("s3://no-such-bucket-kfp-gpu/x")
    assert not ok and "NoSuchBucket" in reason and "fix:" in reason


def test_s3_save_failure_is_storage_error(s3: Any) -> None:
    store = CheckpointStore("s3://no-such-bucket-kfp-gpu/x")
    with pytest.raises(StorageError, match="NoSuchBucket") as err:
        store.save(1, {"a": b"1"})
    assert err.value.transient and "s3:PutObject" in err.value.remediation


def test_open_backend_s3_without_endpoint_env_still_builds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    assert isinstance(open_backend("s3://b/p"), S3Backend)


def store_keys(client: Any, prefix: str) -> list[str]:
    resp = client.list_objects_v2(Bucket=BUCKET, Prefix=prefix)
    return [o["Key"] for o in resp.get("Contents", [])]
