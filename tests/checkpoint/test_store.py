"""CheckpointStore on local paths and fsspec memory://: atomic commit, verification, prune, probe."""

from __future__ import annotations

import hashlib
import json
import logging
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kfp_gpu.checkpoint import (
    MARKER,
    CheckpointCorrupt,
    CheckpointNotFound,
    CheckpointStore,
    PayloadWriter,
    StorageError,
    probe_writable,
)
from kfp_gpu.checkpoint.backends import LocalBackend, open_backend
from kfp_gpu.checkpoint.layout import attempt_name

REPO = Path(__file__).resolve().parents[2]


def _payload(step: int) -> dict[str, bytes]:
    return {"model.pt": f"weights-{step}".encode() * 10, "sub/opt.bin": bytes([step % 256]) * 33}


def test_roundtrip_and_layout(tmp_path: Path) -> None:
    store = CheckpointStore(str(tmp_path))
    assert store.latest() is None and store.list() == []
    c = store.save(10, _payload(10), meta={"lr": 0.1})
    assert c.name == "step-000000010" and c.uri == f"{tmp_path}/step-000000010"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-000000010"]  # attempt dir renamed away
    marker = json.loads((tmp_path / c.name / MARKER).read_text())
    assert marker["step"] == 10 and set(marker["files"]) == {"model.pt", "sub/opt.bin"}
    assert marker["meta"] == {"lr": 0.1} and marker["time"] > 0
    latest = store.latest()
    assert latest is not None and latest.step == 10 and latest.meta == {"lr": 0.1}
    assert store.load(latest) == _payload(10)


def test_file_uri_and_callable_writer(tmp_path: Path) -> None:
    store = CheckpointStore(f"file://{tmp_path}")

    def write(w: PayloadWriter) -> None:
        w.put("a", b"A")
        with w.open("b/c") as fh:
            fh.write(b"BC")

    store.save(3, write)
    found = store.load_latest()
    assert found is not None and found[0].step == 3 and found[1] == {"a": b"A", "b/c": b"BC"}
    assert (tmp_path / "step-000000003" / "b" / "c").read_bytes() == b"BC"


@pytest.mark.parametrize("name", ["", "/abs", "../up", "a/../b", MARKER, ".hidden", "a//b", "x\\y"])
def test_bad_payload_names_rejected_and_nothing_left(tmp_path: Path, name: str) -> None:
    store = CheckpointStore(str(tmp_path))
    with pytest.raises(ValueError):
        store.save(1, {"ok": b"1", name: b"x"})
    assert list(tmp_path.iterdir()) == []


def test_half_written_checkpoint_from_killed_process_is_never_latest(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = CheckpointStore(str(tmp_path))
    store.save(10, _payload(10))
    # A real process dies (os._exit, no cleanup) after writing one payload file of step 20.
    script = textwrap.dedent(f"""
        import os
        from kfp_gpu.checkpoint import CheckpointStore
        def writer(w):
            w.put("model.pt", b"half")
            os._exit(9)
        CheckpointStore({str(tmp_path)!r}).save(20, writer)
    """)
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, env={"PYTHONPATH": str(REPO)}, timeout=60)
    assert proc.returncode == 9
    attempts = [p.name for p in tmp_path.iterdir() if p.name.startswith("step-000000020.tmp-")]
    assert len(attempts) == 1
    with caplog.at_level(logging.WARNING, logger="kfp_gpu.checkpoint"):
        latest = store.latest()
    assert latest is not None and latest.step == 10
    assert attempts[0] in caplog.text and "no COMMITTED marker" in caplog.text


def test_failed_marker_write_leaves_no_checkpoint(tmp_path: Path) -> None:
    class FailingMarker(LocalBackend):
        def put(self, key: str, data: bytes) -> None:
            if key.endswith("/" + MARKER):
                raise OSError(28, "No space left on device")
            super().put(key, data)

    store = CheckpointStore(str(tmp_path), backend=FailingMarker(tmp_path))
    with pytest.raises(StorageError, match="No space left") as err:
        store.save(5, _payload(5))
    assert err.value.transient and "committing step 5" in err.value.message
    assert store.latest() is None and list(tmp_path.iterdir()) == []  # attempt cleaned up


def test_corrupt_newest_is_skipped_with_warning_naming_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = CheckpointStore(str(tmp_path))
    for s in (10, 20, 30):
        store.save(s, _payload(s))
    blob = tmp_path / "step-000000030" / "model.pt"
    blob.write_bytes(b"X" + blob.read_bytes()[1:])  # bit rot / torn overwrite
    (tmp_path / "step-000000020" / MARKER).write_text("{not json")
    with caplog.at_level(logging.WARNING, logger="kfp_gpu.checkpoint"):
        latest = store.latest()
    assert latest is not None and latest.step == 10
    assert "step-000000030" in caplog.text and "sha256" in caplog.text
    assert "step-000000020" in caplog.text and "unreadable COMMITTED marker" in caplog.text
    found = store.load_latest()
    assert found is not None and found[0].step == 10
    with pytest.raises(CheckpointCorrupt, match="sha256"):
        store.load(store.list()[-1])
    assert store.latest(verify=False) is not None and store.latest(verify=False).step == 30  # type: ignore[union-attr]


def test_missing_payload_file_and_marker_step_mismatch(tmp_path: Path) -> None:
    store = CheckpointStore(str(tmp_path))
    store.save(1, _payload(1))
    c2 = store.save(2, _payload(2))
    (tmp_path / c2.name / "model.pt").unlink()
    with pytest.raises(CheckpointCorrupt, match="missing payload file"):
        store.load(c2)
    store.save(3, _payload(3))
    marker = tmp_path / "step-000000003" / MARKER
    marker.write_text(marker.read_text().replace('"step": 3', '"step": 4'))
    assert store.latest().step == 1  # type: ignore[union-attr]
    with pytest.raises(CheckpointNotFound):
        store.get(3)
    assert store.get(1).step == 1


def test_writer_errors_propagate_unchanged_and_bad_meta(tmp_path: Path) -> None:
    store = CheckpointStore(str(tmp_path))

    def writer(w: PayloadWriter) -> None:
        w.put("a", b"1")
        raise KeyError("user bug")

    with pytest.raises(KeyError, match="user bug"):
        store.save(1, writer)
    with pytest.raises(ValueError, match="JSON"):
        store.save(1, {"a": b"1"}, meta={"x": object()})
    assert list(tmp_path.iterdir()) == []


def test_resave_same_step_replaces(tmp_path: Path) -> None:
    store = CheckpointStore(str(tmp_path))
    store.save(7, {"a": b"old"})
    store.save(7, {"a": b"new"})
    assert [c.step for c in store.list()] == [7]
    assert store.load(store.get(7)) == {"a": b"new"}


def test_prune_keeps_newest_good_and_leaves_newer_attempts(tmp_path: Path) -> None:
    store = CheckpointStore(str(tmp_path))
    for s in (10, 20, 30, 40):
        store.save(s, _payload(s))
    (tmp_path / "step-000000005.tmp-deadbeef").mkdir()
    (tmp_path / "step-000000005.tmp-deadbeef" / "model.pt").write_bytes(b"old partial")
    (tmp_path / "step-000000050.tmp-cafef00d").mkdir()  # maybe in progress: must survive
    (tmp_path / "step-000000050.tmp-cafef00d" / "model.pt").write_bytes(b"partial")
    corrupt = tmp_path / "step-000000040" / "model.pt"
    corrupt.write_bytes(b"garbage")
    deleted = store.prune(keep=2)
    assert sorted(deleted) == ["step-000000005.tmp-deadbeef", "step-000000010"]
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == ["step-000000020", "step-000000030", "step-000000040", "step-000000050.tmp-cafef00d"]
    assert store.latest().step == 30  # type: ignore[union-attr]
    with pytest.raises(ValueError):
        store.prune(keep=0)


def test_fsspec_memory_backend_commits_by_marker(caplog: pytest.LogCaptureFixture) -> None:
    pytest.importorskip("fsspec")
    store = CheckpointStore("memory://kfp-gpu-test/run1")
    c1 = store.save(1, _payload(1))
    assert c1.name.startswith("step-000000001.tmp-")  # object-store semantics: no rename, marker commits
    store.backend.put("step-000000002.tmp-0badf00d/model.pt", b"partial")
    with caplog.at_level(logging.WARNING, logger="kfp_gpu.checkpoint"):
        latest = store.latest()
    assert latest is not None and latest.step == 1 and "step-000000002.tmp-0badf00d" in caplog.text
    assert store.load(latest) == _payload(1)
    assert store.prune(keep=1) == []
    store.backend.delete_prefix("")


def test_probe_writable(tmp_path: Path) -> None:
    ok, reason = probe_writable(str(tmp_path / "new" / "dir"))
    assert ok, reason
    assert "wrote, read back and deleted" in reason and list((tmp_path / "new" / "dir").iterdir()) == []
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    ok, reason = probe_writable(str(blocker / "ckpt"))
    assert not ok and "cannot write" in reason and "fix:" in reason
    ok, reason = probe_writable("nosuchproto://bucket/x")
    assert not ok and "nosuchproto" in reason


def test_open_backend_schemes(tmp_path: Path) -> None:
    assert isinstance(open_backend(str(tmp_path)), LocalBackend)
    assert isinstance(open_backend(f"file://{tmp_path}"), LocalBackend)
    with pytest.raises(StorageError):
        open_backend("nosuchproto://x/y")


def test_commit_attempt_commits_files_already_in_the_store(tmp_path: Path) -> None:
    store = CheckpointStore(str(tmp_path))
    attempt = attempt_name(7, "abc123")
    assert attempt == "step-000000007.tmp-abc123"
    for bad in ("XYZ", "", "../x"):
        with pytest.raises(ValueError, match="nonce"):
            attempt_name(7, bad)
    store.backend.put(f"{attempt}/shard.bin", b"S" * 10)
    assert store.latest() is None  # written but not committed
    ckpt = store.commit_attempt(attempt, 7, {"shard.bin": (hashlib.sha256(b"S" * 10).hexdigest(), 10)},
                                {"k": 1}, ranks=2)
    assert ckpt.name == "step-000000007" and ckpt.sizes == {"shard.bin": 10}
    assert json.loads((tmp_path / ckpt.name / MARKER).read_text())["ranks"] == 2
    found = store.load_latest()
    assert found is not None and found[1] == {"shard.bin": b"S" * 10} and found[0].meta == {"k": 1}
