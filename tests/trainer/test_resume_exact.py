"""Correctness proof for checkpoint/resume: a run killed mid-training (SIGKILL, or SIGTERM with its
emergency save) and restarted ends bitwise-identical to an uninterrupted run, and loses at most one
checkpoint interval of steps (SIGKILL) or none (SIGTERM).

Real processes, real signals: ``python -m pipelines.trainer.train_lm`` is started, followed through its
JSON-lines stdout, signalled at a chosen step, then restarted on the same checkpoint directory.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.timeout(180)

REPO = Path(__file__).resolve().parents[2]
STEPS = 60
EVERY = 10
# Small enough that the whole module runs in a few seconds on 2 cores; the step sleep leaves room to
# signal the process mid-run.
MODEL_ARGS = ["--layers", "1", "--hidden", "32", "--seq-len", "16", "--batch-size", "8", "--seed", "7"]


def _start(ckpt: Path, out: Path, log: Path, sleep: float) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1", LOGLEVEL="INFO")
    env.pop("KFP_GPU_RESUME_STEP", None)
    cmd = [sys.executable, "-m", "pipelines.trainer.train_lm", "--steps", str(STEPS),
           "--checkpoint-every", str(EVERY), "--checkpoint-uri", str(ckpt), "--out", str(out),
           "--step-sleep", str(sleep), *MODEL_ARGS]
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=log.open("w"), text=True)


def _events(lines: list[str]) -> list[dict[str, Any]]:
    return [json.loads(line) for line in lines if line.startswith("{")]


def _run_to_end(proc: subprocess.Popen[str], timeout: float = 60) -> tuple[int, list[dict[str, Any]]]:
    out, _ = proc.communicate(timeout=timeout)
    return proc.returncode, _events(out.splitlines())


def _run_until(proc: subprocess.Popen[str], step: int, sig: int) -> tuple[int, list[dict[str, Any]]]:
    """Follow stdout; send ``sig`` as soon as ``step`` is reported; collect everything until exit."""
    assert proc.stdout is not None
    lines: list[str] = []
    deadline = time.monotonic() + 60
    for line in proc.stdout:
        lines.append(line)
        ev = json.loads(line) if line.startswith("{") else {}
        if ev.get("event") == "step" and ev["step"] >= step:
            proc.send_signal(sig)
            break
        assert time.monotonic() < deadline, "trainer too slow"
    lines += proc.stdout.read().splitlines()
    return proc.wait(timeout=30), _events(lines)


def _load_out(out: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    weights = torch.load(out / "model.pt", weights_only=True)
    losses = json.loads((out / "losses.json").read_text())
    return weights, losses


def _assert_identical(out_a: Path, out_b: Path) -> dict[str, Any]:
    wa, la = _load_out(out_a)
    wb, lb = _load_out(out_b)
    assert list(wa) == list(wb)
    for name in wa:
        assert wa[name].dtype == wb[name].dtype
        assert torch.equal(wa[name], wb[name]), f"tensor {name} differs after resume"
    assert la["losses"] == lb["losses"]  # exact float equality, every step
    assert len(lb["losses"]) == STEPS
    return lb


class _Baseline:
    """The uninterrupted run, started once per module and awaited on first use (it runs in parallel)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.proc = _start(root / "ckpt", root / "out", root / "stderr.log", sleep=0.0)
        self._out: Path | None = None

    def out(self) -> Path:
        if self._out is None:
            code, events = _run_to_end(self.proc)
            assert code == 0, (self.root / "stderr.log").read_text()
            assert [e["step"] for e in events if e["event"] == "step"] == list(range(1, STEPS + 1))
            assert not [e for e in events if e["event"] == "resume"]
            self._out = self.root / "out"
        return self._out


@pytest.fixture(scope="module")
def baseline(tmp_path_factory: pytest.TempPathFactory) -> Iterator[_Baseline]:
    b = _Baseline(tmp_path_factory.mktemp("baseline"))
    yield b
    if b.proc.poll() is None:
        b.proc.kill()
        b.proc.wait()


def test_sigkill_then_resume_is_bitwise_identical(baseline: _Baseline, tmp_path: Path) -> None:
    ckpt, out = tmp_path / "ckpt", tmp_path / "out"
    code, first = _run_until(_start(ckpt, out, tmp_path / "1.log", sleep=0.03), step=25, sig=signal.SIGKILL)
    assert code == -signal.SIGKILL
    last_done = max(e["step"] for e in first if e["event"] == "step")
    assert 25 <= last_done < STEPS
    assert not (out / "model.pt").exists()

    code, second = _run_to_end(_start(ckpt, out, tmp_path / "2.log", sleep=0.0))
    assert code == 0, (tmp_path / "2.log").read_text()
    (resume,) = [e for e in second if e["event"] == "resume"]
    assert resume["step"] % EVERY == 0
    lost = last_done - resume["step"]
    assert 0 <= lost <= EVERY, f"lost {lost} steps, checkpoint interval is {EVERY}"
    assert [e["step"] for e in second if e["event"] == "step"] == list(range(resume["step"] + 1, STEPS + 1))
    result = _assert_identical(baseline.out(), out)
    assert result["resumed_from"] == [resume["step"]]


def test_sigterm_emergency_save_loses_no_steps(baseline: _Baseline, tmp_path: Path) -> None:
    ckpt, out = tmp_path / "ckpt", tmp_path / "out"
    code, first = _run_until(_start(ckpt, out, tmp_path / "1.log", sleep=0.03), step=33, sig=signal.SIGTERM)
    assert code == 143, (tmp_path / "1.log").read_text()
    last_done = max(e["step"] for e in first if e["event"] == "step")
    (pre,) = [e for e in first if e["event"] == "preempted"]
    assert pre["saved_step"] == last_done

    code, second = _run_to_end(_start(ckpt, out, tmp_path / "2.log", sleep=0.0))
    assert code == 0, (tmp_path / "2.log").read_text()
    (resume,) = [e for e in second if e["event"] == "resume"]
    assert resume["step"] == last_done, "SIGTERM must lose no completed step"
    _assert_identical(baseline.out(), out)
