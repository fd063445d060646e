"""The dev cluster's pid files name our processes; a process started through a venv's ``python3`` (a console
script's shebang) is the same interpreter as the ``python`` that later stops it. make demo on a fresh clone left the
controller row running after ``make cluster-down`` when they were compared by name."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from kfp_gpu_rehearsal.devcluster import procs


def test_a_process_started_by_another_name_of_the_interpreter_is_ours(tmp_path: Path) -> None:
    exe = Path(sys.executable)
    alias = tmp_path / "python-alias"
    alias.symlink_to(exe.resolve())
    proc = subprocess.Popen([str(alias), "-c", "import time; time.sleep(30)"])  # noqa: S603
    try:
        procs.pid_file(tmp_path, "unit").write_text(f"{proc.pid}\n")
        assert procs.running_pid(tmp_path, "unit", exe) == proc.pid
        assert procs.stop(tmp_path, "unit", exe, timeout=5.0) is True
        assert proc.wait(5) is not None
    finally:
        if proc.poll() is None:
            proc.kill()


def test_another_program_under_our_pid_file_is_not_ours(tmp_path: Path) -> None:
    sleep = Path("/bin/sleep")
    if not sleep.exists():
        pytest.fail("/bin/sleep is missing")
    proc = subprocess.Popen([str(sleep), "30"])  # noqa: S603
    try:
        procs.pid_file(tmp_path, "unit").write_text(f"{proc.pid}\n")
        assert procs.running_pid(tmp_path, "unit", Path(sys.executable)) is None
    finally:
        proc.kill()
        proc.wait(5)
