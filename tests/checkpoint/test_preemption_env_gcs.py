"""Preemption guard (in-process and real SIGTERM to a child), env hints, and the gs:// store's corruption handling
against the real GCS emulator (fake-gcs-server, the ``gcs`` fixture; more in test_gcs_emulator.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from kfp_gpu.checkpoint import (
    AWS_SPOT_GRACE_S,
    DEFAULT_GRACE_S,
    EXIT_CODE_PREEMPTED,
    GCE_SPOT_GRACE_S,
    GKE_SPOT_GRACE_S,
    CheckpointStore,
    on_preemption,
    resume_step_from_env,
    spot_grace_s,
)
from kfp_gpu.checkpoint.backends import GCSBackend
from kfp_gpu.errors import InvalidSpec
from tests.gcs_support import GcsBucket

REPO = Path(__file__).resolve().parents[2]


def test_grace_constants() -> None:
    assert (GKE_SPOT_GRACE_S, GCE_SPOT_GRACE_S, AWS_SPOT_GRACE_S, EXIT_CODE_PREEMPTED) == (15.0, 30.0, 120.0, 143)
    assert DEFAULT_GRACE_S == GKE_SPOT_GRACE_S  # the shortest documented budget is the safe default


def test_spot_grace_is_per_cloud_and_capped_by_the_pods_grace() -> None:
    assert (spot_grace_s("gke"), spot_grace_s("EKS"), spot_grace_s("gce")) == (15.0, 120.0, 30.0)
    assert spot_grace_s("eks", termination_grace_s=30) == 30.0  # drained: the pod's own grace applies
    assert spot_grace_s("gke", termination_grace_s=60) == 15.0  # GKE's kubelet gives non-system pods 15 s
    with pytest.raises(ValueError, match="platform 'azure'.*aws, eks, gce, gke"):
        spot_grace_s("azure")


def test_signal_outside_critical_runs_callback_at_once() -> None:
    calls: list[str] = []
    guard = on_preemption(lambda: calls.append("saved"), 5, exit_code=None)
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.01)
        assert calls == ["saved"] and guard.requested and guard.saved
        os.kill(os.getpid(), signal.SIGTERM)  # a second SIGTERM is ignored, not a second save
        time.sleep(0.01)
        assert calls == ["saved"]
    finally:
        guard.uninstall()


def test_signal_inside_critical_is_deferred_to_step_end() -> None:
    calls: list[str] = []
    guard = on_preemption(lambda: calls.append("saved"), 5, exit_code=None)
    try:
        with guard.critical():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.01)
            calls.append("step finished")
        assert calls == ["step finished", "saved"]
    finally:
        guard.uninstall()
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL or callable(signal.getsignal(signal.SIGTERM))


def test_signal_between_blocks_saves_before_the_next_block() -> None:
    calls: list[str] = []
    guard = on_preemption(lambda: calls.append("saved"), 5, exit_code=None)
    try:
        with guard.critical():
            calls.append("step 1")
        os.kill(os.getpid(), signal.SIGTERM)  # e.g. while the loop prints or sleeps
        time.sleep(0.01)
        assert calls == ["step 1"]  # not from inside the signal handler
        with guard.critical():
            calls.append("step 2")
        assert calls == ["step 1", "saved", "step 2"]
    finally:
        guard.uninstall()


def test_step_failing_after_signal_saves_only_with_save_on_error() -> None:
    for save_on_error, expected in ((True, ["saved"]), (False, [])):
        calls: list[str] = []
        guard = on_preemption(lambda c=calls: c.append("saved"), 5, exit_code=None,  # type: ignore[misc]
                              save_on_error=save_on_error)
        try:
            with pytest.raises(RuntimeError, match="peer"), guard.critical():
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(0.01)
                raise RuntimeError("Connection closed by peer")
            assert calls == expected
        finally:
            guard.uninstall()


def test_bad_grace_rejected() -> None:
    with pytest.raises(ValueError):
        on_preemption(lambda: None, 0)


def _child(body: str, tmp_path: Path) -> subprocess.Popen[str]:
    script = textwrap.dedent("""
        import sys, time
        from kfp_gpu.checkpoint import on_preemption
    """) + textwrap.dedent(body)
    return subprocess.Popen([sys.executable, "-c", script], cwd=REPO, env={"PYTHONPATH": str(REPO)},
                            stdout=subprocess.PIPE, stderr=(tmp_path / "err.log").open("w"), text=True)


def test_real_sigterm_saves_then_exits_143(tmp_path: Path) -> None:
    proc = _child("""
        guard = on_preemption(lambda: print("saved", flush=True), 5)
        ready = False
        while True:
            with guard.critical():  # the recommended loop shape: all work, printing included, inside
                if not ready:
                    print("ready", flush=True)
                    ready = True
                time.sleep(0.01)
    """, tmp_path)
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=20)
    assert proc.returncode == 143 and out == "saved\n"


def test_watchdog_exits_143_before_grace_ends(tmp_path: Path) -> None:
    proc = _child("""
        on_preemption(lambda: time.sleep(60), 1.0)
        print("ready", flush=True)
        while True:
            time.sleep(0.01)
    """, tmp_path)
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=20)
    assert proc.returncode == 143 and time.monotonic() - t0 < 5
    assert "did not finish" in (tmp_path / "err.log").read_text()


def test_resume_step_from_env() -> None:
    hint = resume_step_from_env({"KFP_GPU_CHECKPOINT_URI": "s3://b/p", "KFP_GPU_RESUME_STEP": "120"})
    assert (hint.uri, hint.step) == ("s3://b/p", 120)
    assert resume_step_from_env({"KFP_GPU_RESUME_STEP": " "}) == resume_step_from_env({})
    assert resume_step_from_env({}).step is None and resume_step_from_env({}).uri is None
    for bad in ("-1", "ten", "1.5"):
        with pytest.raises(InvalidSpec, match="KFP_GPU_RESUME_STEP"):
            resume_step_from_env({"KFP_GPU_RESUME_STEP": bad})


@pytest.mark.integration  # the GCS emulator
def test_gcs_store_skips_a_tampered_checkpoint(gcs: GcsBucket) -> None:
    store = CheckpointStore(gcs.uri("runs/x"))
    assert isinstance(store.backend, GCSBackend)
    store.save(1, {"model.pt": b"one"})
    c2 = store.save(2, {"model.pt": b"two"})
    assert f"runs/x/{c2.name}/COMMITTED" in gcs.keys("runs/x/")
    assert c2.uri.startswith(gcs.uri("runs/x/step-000000002.tmp-"))
    gcs.client.bucket(gcs.bucket).blob(f"runs/x/{c2.name}/model.pt").upload_from_string(b"rot")  # bit rot
    latest = store.latest()
    assert latest is not None and latest.step == 1
    assert store.prune(keep=1) == []  # the corrupt step 2 is newer: left for inspection
    assert f"runs/x/{c2.name}/model.pt" in gcs.keys("runs/x/")
    store.backend.delete("does/not/exist")  # deleting a missing object is not an error
