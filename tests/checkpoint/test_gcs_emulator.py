"""The gs:// store against the real GCS emulator (fake-gcs-server run by the dev cluster's ``gcs`` extra) through the
real google-cloud-storage client: HTTP uploads, listings, deletes; the emulator found through STORAGE_EMULATOR_HOST."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kfp_gpu.checkpoint import MARKER, CheckpointStore, StorageError, probe_writable
from kfp_gpu.checkpoint.backends import EMULATOR_ENV, GCSBackend, emulator_host, gcs_client, open_backend
from kfp_gpu_rehearsal.devcluster import gcs, gcs_profile
from kfp_gpu_rehearsal.devcluster.versions import cluster_dir
from tests.gcs_support import GcsBucket

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.integration  # needs the emulator binary (make cluster-build GCS=1)


class Recording(GCSBackend):
    """The real backend, recording the order of object writes."""

    def __init__(self, bucket: str, prefix: str) -> None:
        super().__init__(bucket, prefix)
        self.puts: list[str] = []

    def put(self, key: str, data: bytes, metadata: dict[str, str] | None = None) -> None:  # type: ignore[override]
        self.puts.append(key)
        super().put(key, data, metadata)


def test_emulator_is_recorded_for_tools(gcs: GcsBucket) -> None:
    from kfp_gpu_rehearsal.devcluster import boot

    assert gcs_profile.url(cluster_dir()) == gcs.url and gcs_profile.env() == {EMULATOR_ENV: gcs.url}
    pid = gcs_profile.running_pid(boot._ctx())
    assert gcs_profile.ensure_up() == gcs.url and gcs_profile.running_pid(boot._ctx()) == pid  # re-used
    assert boot.status()[gcs_profile.NAME] == f"running pid={pid} {gcs.url} healthy"
    assert type(gcs.client._credentials).__name__ == "AnonymousCredentials"
    assert emulator_host() == gcs.url and emulator_host({EMULATOR_ENV: " "}) is None


def test_gs_roundtrip_marker_written_last(gcs: GcsBucket) -> None:
    rec = Recording(gcs.bucket, "runs/r1")
    store = CheckpointStore(gcs.uri("runs/r1"), backend=rec)
    c = store.save(12, {"model.pt": b"M" * 300_000, "optimizer.pt": b"O" * 100}, meta={"run": "r1"})
    assert rec.puts[-1] == f"{c.name}/{MARKER}" and len(rec.puts) == 3
    assert sorted(gcs.keys("runs/r1/")) == sorted(f"runs/r1/{c.name}/{f}" for f in ("model.pt", "optimizer.pt", MARKER))
    fresh = CheckpointStore(gcs.uri("runs/r1") + "/")  # built from the URI alone: the emulator from the env
    assert isinstance(fresh.backend, GCSBackend)
    latest = fresh.latest()
    assert latest is not None and latest.step == 12 and latest.meta == {"run": "r1"}
    assert fresh.load(latest) == {"model.pt": b"M" * 300_000, "optimizer.pt": b"O" * 100}


def test_gs_partial_and_corrupt_are_skipped(gcs: GcsBucket, caplog: pytest.LogCaptureFixture) -> None:
    store = CheckpointStore(gcs.uri("runs/r2"))
    store.save(10, {"model.pt": b"ten"})
    c20 = store.save(20, {"model.pt": b"twenty"})
    bucket = gcs.client.bucket(gcs.bucket)
    bucket.blob(f"runs/r2/{c20.name}/model.pt").upload_from_string(b"tampered")
    bucket.blob("runs/r2/step-000000030.tmp-abcdef12/model.pt").upload_from_string(b"half")  # no marker
    with caplog.at_level(logging.WARNING, logger="kfp_gpu.checkpoint"):
        latest = store.latest()
    assert latest is not None and latest.step == 10
    assert c20.name in caplog.text and "step-000000030.tmp-abcdef12" in caplog.text


def test_gs_prune_and_many_files(gcs: GcsBucket) -> None:
    store = CheckpointStore(gcs.uri("runs/r3"))
    for s in range(1, 5):
        store.save(s, {f"shard-{i}.bin": bytes([s, i]) for i in range(5)})
    deleted = store.prune(keep=2)
    assert len(deleted) == 2 and [c.step for c in store.list()] == [3, 4]
    assert all(k.startswith(("runs/r3/step-000000003", "runs/r3/step-000000004")) for k in gcs.keys())


def test_gs_probe(gcs: GcsBucket) -> None:
    ok, reason = probe_writable(gcs.uri("probe-here"), run_id="run-7")
    assert ok, reason
    assert gcs.keys() == []
    ok, reason = probe_writable("gs://no-such-bucket-kfp-gpu/x")
    assert not ok and "gs://no-such-bucket-kfp-gpu: the bucket does not exist" in reason and "fix:" in reason


def test_gs_save_to_a_missing_bucket_is_storage_error(gcs: GcsBucket) -> None:
    store = CheckpointStore("gs://no-such-bucket-kfp-gpu/x")
    with pytest.raises(StorageError, match="404") as err:
        store.save(1, {"a": b"1"})
    assert err.value.transient and "roles/storage.objectAdmin" in err.value.remediation


def test_open_backend_gs_uses_the_emulator_without_credentials(gcs: GcsBucket, monkeypatch: pytest.MonkeyPatch,
                                                              tmp_path: Path) -> None:
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "no-such-key.json"))  # never read
    backend = open_backend(gcs.uri("p"))
    assert isinstance(backend, GCSBackend)
    backend.put("k", b"v")
    assert backend.get("k") == b"v" and gcs.keys() == ["p/k"]
    assert gcs_client().project == "kfp-gpu-local"


def test_a_trainer_process_reaches_the_bucket_through_the_env(gcs: GcsBucket) -> None:
    """What a rank of a local rehearsal gets: only STORAGE_EMULATOR_HOST (no Google credentials)."""
    script = textwrap.dedent(f"""
        from kfp_gpu.checkpoint import CheckpointStore
        store = CheckpointStore({gcs.uri("runs/child")!r})
        store.save(5, {{"model.pt": b"from the child"}})
        print(store.latest().step)
    """)
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(REPO), "HOME": str(Path.home()), **gcs.env}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "5"
    latest = CheckpointStore(gcs.uri("runs/child")).latest()
    assert latest is not None and CheckpointStore(gcs.uri("runs/child")).load(latest) == {"model.pt": b"from the child"}


def test_missing_binary_is_one_line_naming_the_build(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("KFP_GPU_CACHE", str(tmp_path))
    with pytest.raises(gcs.GcsEmulatorError, match=r"fake-gcs-server-v[0-9.]+ is missing; build it: .*gcs build"):
        gcs.require_binary()


def test_profile_lifecycle_in_its_own_state_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """up starts it and records the URL, a second up re-uses it, stop ends it (a private cache: the shared
    emulator other tests use is not touched)."""
    from kfp_gpu_rehearsal.devcluster import boot, runner

    real = gcs.require_binary()
    monkeypatch.setenv("KFP_GPU_CACHE", str(tmp_path))
    monkeypatch.delenv(gcs_profile.PORT_ENV, raising=False)
    gcs.binary().parent.mkdir(parents=True)
    gcs.binary().symlink_to(real)
    c = boot._ctx()
    c.state.mkdir(parents=True)
    status: dict[str, str] = {}
    try:
        runner.up(c, gcs_profile.UNIT, True, status, 0.0)
        u = gcs_profile.url(c.state)
        assert status == {gcs_profile.NAME: "started"} and u is not None and u.startswith("http://127.0.0.1:")
        pid = gcs_profile.running_pid(c)
        runner.up(c, gcs_profile.UNIT, True, status, 0.0)
        assert status[gcs_profile.NAME] == "running" and gcs_profile.running_pid(c) == pid
        assert gcs_profile.url(c.state) == u
        runner.up(c, gcs_profile.UNIT, False, status, 0.0)  # not wanted: left running
        assert gcs_profile.running_pid(c) == pid
    finally:
        assert runner.stop(c, gcs_profile.UNIT)
    assert gcs_profile.url(c.state) is None and runner.status(c, gcs_profile.UNIT) == {"gcs": "stopped (profile off; up --gcs starts it)"}
    assert not runner.stop(c, gcs_profile.UNIT)
