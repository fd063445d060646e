"""A checkpoint on the preemption notice for every supported framework, measured with real torch on CPU.

Each case runs a tiny trainer (tests/checkpoint/notice_child.py) as a child process, sends it a real SIGTERM
mid-run (what the kubelet sends at a node's shutdown notice) and measures: the exit code, the time from the signal
to the exit against GKE's 15 s grace for a non-system pod, and the steps lost = the last step the trainer completed
minus the step of the newest complete checkpoint kfp-gpu's resume finds (kfp_gpu.checkpoint.resume.find), with and
without kfp-gpu's handling (periodic checkpoints every 5 steps either way).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kfp_gpu.checkpoint import resume
from kfp_gpu.checkpoint.preemption import EXIT_CODE_PREEMPTED, GKE_SPOT_GRACE_S

pytest.importorskip("torch")  # as tests/trainer: the Makefile installs CPU torch and the frameworks for tests
ROOT = Path(__file__).resolve().parents[2]
MODULES = {"hf": "transformers", "lightning": "pytorch_lightning"}
SIGNAL_AT = 8  # steps completed before the notice (between two periodic checkpoints: 5 and 10)
FORMATS = {"kfp": "kfp-gpu", "dcp": "dcp", "hf": "hf-trainer", "lightning": "lightning"}


def _notice(framework: str, root: Path, guard: bool) -> dict[str, object]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.Popen([sys.executable, "-m", "tests.checkpoint.notice_child", framework, str(root),
                             "1" if guard else "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=ROOT, env=env)
    assert proc.stdout is not None
    steps: list[int] = []
    signalled = 0.0
    for line in proc.stdout:
        if line.startswith("{"):
            steps.append(int(json.loads(line)["step"]))
        if steps and steps[-1] >= SIGNAL_AT and not signalled:
            signalled = time.monotonic()
            proc.send_signal(signal.SIGTERM)
    code = proc.wait(60)
    took = time.monotonic() - signalled
    assert signalled, f"{framework}: the trainer never reached step {SIGNAL_AT}: {proc.stderr.read()[-2000:]}"
    found = resume.find(str(root))
    ckpt = found.step if found is not None else 0
    return {"code": code, "took": took, "last": max(steps), "ckpt": ckpt, "lost": max(steps) - ckpt,
            "format": found.format if found is not None else "", "stderr": proc.stderr.read()[-2000:]}


@pytest.mark.parametrize("framework", ["kfp", "dcp", "hf", "lightning"])
def test_notice_emergency_checkpoint_loses_no_completed_step(framework: str, tmp_path: Path) -> None:
    if framework in MODULES:
        pytest.importorskip(MODULES[framework])
    with_guard = _notice(framework, tmp_path / "guard", True)
    assert with_guard["code"] == EXIT_CODE_PREEMPTED, with_guard
    assert float(with_guard["took"]) < GKE_SPOT_GRACE_S, with_guard  # fits GKE's 15 s grace
    assert with_guard["format"] == FORMATS[framework], with_guard
    assert with_guard["lost"] == 0 and int(with_guard["ckpt"]) >= SIGNAL_AT, with_guard
    plain = _notice(framework, tmp_path / "plain", False)
    # killed by the signal; Lightning 2.x catches SIGTERM itself, stops and exits 0 without a checkpoint (measured)
    assert plain["code"] == (0 if framework == "lightning" else -signal.SIGTERM), plain
    assert int(plain["lost"]) > 0 and int(plain["ckpt"]) % 5 == 0, plain  # back to the periodic checkpoint
    print(f"\nnotice [{framework}]: with kfp-gpu exit {with_guard['code']} {float(with_guard['took']):.2f}s after "
          f"SIGTERM, checkpoint step {with_guard['ckpt']} of last step {with_guard['last']}: {with_guard['lost']} "
          f"steps lost; without: {plain['lost']} steps lost (checkpoint {plain['ckpt']}, last {plain['last']})")


@pytest.mark.parametrize("framework", ["hf", "lightning"])
def test_notice_two_ranks_gloo_one_signalled_both_save_the_same_step(framework: str, tmp_path: Path) -> None:
    """torch.distributed (2 ranks, gloo, CPU): the kubelet signals one node only; the ranks agree at the step end,
    the framework writes one checkpoint of that step (a collective save), and both exit 143."""
    pytest.importorskip(MODULES[framework])
    root = tmp_path / "ddp"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}
    procs, outs = [], []
    port = str(29500 + os.getpid() % 1000)
    for rank in (0, 1):
        # Lightning: two one-process "nodes" (NODE_RANK, LOCAL_RANK 0), as on a 2-node gang; HF: two local ranks
        local = {"LOCAL_RANK": "0", "NODE_RANK": str(rank)} if framework == "lightning" else {"LOCAL_RANK": str(rank)}
        e = {**env, "RANK": str(rank), **local, "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}
        procs.append(subprocess.Popen([sys.executable, "-m", "tests.checkpoint.notice_child", framework, str(root), "1"],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=e))
    assert procs[1].stdout is not None
    steps: list[int] = []
    signalled = 0.0
    for line in procs[1].stdout:  # rank 1 only is preempted
        if line.startswith("{"):
            steps.append(int(json.loads(line)["step"]))
        if steps and steps[-1] >= SIGNAL_AT and not signalled:
            signalled = time.monotonic()
            procs[1].send_signal(signal.SIGTERM)
    codes = [p.wait(90) for p in procs]
    took = time.monotonic() - signalled
    outs = [p.stderr.read()[-1500:] if p.stderr else "" for p in procs]
    assert signalled, outs
    found = resume.find(str(root))
    assert codes == [EXIT_CODE_PREEMPTED, EXIT_CODE_PREEMPTED], (codes, outs)
    assert found is not None and found.format == FORMATS[framework] and found.step >= max(steps), (found, steps)
    assert took < GKE_SPOT_GRACE_S
    print(f"\nnotice [{framework}, 2 ranks gloo]: rank 1 signalled at step {max(steps)}; both exited 143 in {took:.2f}s; "
          f"checkpoint step {found.step}: {max(steps) - found.step if found.step <= max(steps) else 0} steps lost")
