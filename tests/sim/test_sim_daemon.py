"""The stand-in daemons are re-used only while they run this tree's code (kfp_gpu_rehearsal/sim/daemon.py)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from kfp_gpu_rehearsal.sim import daemon


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(daemon, "state_dir", lambda: tmp_path)
    return tmp_path


def test_a_daemon_of_this_code_is_reused(state: Path) -> None:
    (state / "sim.code").write_text(daemon.code_digest())
    assert daemon._current("sim", "http://127.0.0.1:8787") == "http://127.0.0.1:8787"


def test_a_daemon_of_other_code_is_stopped_and_forgotten(state: Path) -> None:
    # stands in for the old daemon: not our child (a daemon outlives the `up` that started it), so no zombie
    pid = int(subprocess.run(["sh", "-c", "sleep 60 >/dev/null 2>&1 & echo $!"], capture_output=True, text=True,
                             check=True).stdout)
    try:
        (state / "sim.pid").write_text(str(pid))
        (state / "sim.url").write_text("http://127.0.0.1:8787")
        (state / "sim.code").write_text("0123456789abcdef")  # started from other code
        assert daemon._current("sim", "http://127.0.0.1:8787") == ""
        assert not Path(f"/proc/{pid}").exists()  # SIGTERM, and waited for: its port is free for the new one
        assert sorted(p.name for p in state.iterdir()) == []
    finally:
        subprocess.run(["kill", "-9", str(pid)], capture_output=True)


def test_a_daemon_without_a_code_record_is_not_trusted(state: Path) -> None:
    assert daemon._current("sim-aws", "http://127.0.0.1:8788") == ""
    assert daemon._current("sim-aws", "") == ""


def test_the_digest_changes_with_any_module_of_the_world_or_the_product(monkeypatch: pytest.MonkeyPatch,
                                                                      tmp_path: Path) -> None:
    before = daemon.code_digest()
    assert len(before) == 16 and before == daemon.code_digest()
    import kfp_gpu_rehearsal

    fake = tmp_path / "kfp_gpu_rehearsal"
    fake.mkdir()
    (fake / "__init__.py").write_text("")
    monkeypatch.setattr(kfp_gpu_rehearsal, "__file__", str(fake / "__init__.py"))
    assert daemon.code_digest() != before
