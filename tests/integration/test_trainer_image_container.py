"""The trainer image runs the 2-rank sharded job in containers (podman, runc, host network), as the PyTorchJob's
workers would: gloo on CPU, a SIGKILL of one rank's container, a resume from its checkpoint, and the same final
weights (``torch.equal``, every tensor) and losses as the uninterrupted job in containers.

tests/trainer/test_sharded_resume.py proves the same on host processes; this proves the image: its torch, its copy of
``kfp_gpu.checkpoint`` and ``pipelines.trainer``, its default user (uid 10001) writing the checkpoint.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from kfp_gpu_rehearsal.devcluster import images

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.integration, pytest.mark.timeout(1800)]  # a cold run builds the images first

STEPS, EVERY = 30, 5
MODEL_ARGS = ["--layers", "1", "--hidden", "32", "--seq-len", "16", "--batch-size", "8", "--seed", "7",
              "--dropout", "0.1", "--data-order", "rng"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class ContainerJob:
    """Two containers of the trainer image, rank 0 and rank 1, with outputs under ``root``; ``shared`` (the
    checkpoint's directory too) is mounted read-write at the same path."""

    def __init__(self, env: Mapping[str, str], shared: Path, root: Path, uri: str, step_sleep: float = 0.0) -> None:
        root.mkdir(parents=True, exist_ok=True)
        root.chmod(0o777)  # the image's user (uid 10001) writes here
        self.root, self.out, self.env = root, root / "out", env
        self.names = [f"kfp-gpu-trainer-test-{uuid.uuid4().hex[:8]}-r{r}" for r in (0, 1)]
        port = _free_port()
        self.procs: list[subprocess.Popen[bytes]] = []
        for rank, name in enumerate(self.names):
            argv = ["podman", "run", "--rm", "--name", name, "--network", "host",
                    "--volume", f"{shared}:{shared}:rw", "--env", f"RANK={rank}", "--env", "WORLD_SIZE=2",
                    "--env", "MASTER_ADDR=127.0.0.1", "--env", f"MASTER_PORT={port}", "--env", "LOGLEVEL=INFO",
                    images.TRAINER, "python", "-m", "pipelines.trainer.train_lm", "--sharded", "--steps", str(STEPS),
                    "--checkpoint-every", str(EVERY), "--checkpoint-uri", uri, "--out", str(self.out),
                    "--step-sleep", str(step_sleep), *MODEL_ARGS]
            self.procs.append(subprocess.Popen(argv, env=dict(env), stdout=(root / f"r{rank}.out").open("wb"),  # noqa: S603
                                               stderr=(root / f"r{rank}.err").open("wb")))

    def events(self, rank: int) -> list[dict[str, Any]]:
        lines = (self.root / f"r{rank}.out").read_text().splitlines()
        return [json.loads(line) for line in lines if line.startswith("{") and line.endswith("}")]

    def steps(self, rank: int) -> list[int]:
        return [e["step"] for e in self.events(rank) if e["event"] == "step"]

    def logs(self) -> str:
        return "\n".join(f"--- rank {r} ---\n" + (self.root / f"r{r}.err").read_text()[-3000:] for r in (0, 1))

    def wait_for(self, rank: int, pred: Callable[[dict[str, Any]], bool], timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(pred(ev) for ev in self.events(rank)):
                return
            assert self.procs[rank].poll() is None, f"rank {rank} exited early\n{self.logs()}"
            time.sleep(0.05)
        raise AssertionError(f"rank {rank}: no such event within {timeout} s\n{self.logs()}")

    def finish(self, timeout: float = 300) -> list[int]:
        try:
            return [p.wait(timeout=timeout) for p in self.procs]
        finally:
            self.remove()

    def remove(self) -> None:
        subprocess.run(["podman", "rm", "--force", "--ignore", *self.names], env=dict(self.env),  # noqa: S603
                       capture_output=True, check=False)
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait()


@pytest.fixture
def root() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="kfp-gpu-trainer-image-"))
    path.chmod(0o777)  # pytest's tmp_path is 0700: the image's uid 10001 could not reach it
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _weights(out: Path) -> dict[str, Any]:
    weights: dict[str, Any] = torch.load(out / "model.pt", weights_only=True)
    return weights


def test_trainer_image_resumes_a_2_rank_job_after_a_sigkill_to_the_same_weights(
        built_images: dict[str, str], root: Path) -> None:
    env = built_images
    baseline = ContainerJob(env, root, root / "baseline", str(root / "baseline" / "ckpt"))
    uri = str(root / "ckpt")
    killed = ContainerJob(env, root, root / "run1", uri, step_sleep=0.05)
    try:
        killed.wait_for(1, lambda e: e["event"] == "step" and e["step"] >= 12)
        kill = subprocess.run(["podman", "kill", "--signal", "KILL", killed.names[1]], env=env,  # noqa: S603
                              capture_output=True, text=True, check=False)
        assert kill.returncode == 0, kill.stderr
        codes = killed.finish()
        assert codes[1] == 137 and codes[0] != 0, f"{codes}: rank 0 must fail when its peer is gone\n{killed.logs()}"
        last = max(killed.steps(1))
        assert EVERY * 2 <= last < STEPS
        assert not (killed.out / "model.pt").exists()

        resumed = ContainerJob(env, root, root / "run2", uri)
        assert resumed.finish() == [0, 0], resumed.logs()
        resume_steps = {rank: [e["step"] for e in resumed.events(rank) if e["event"] == "resume"] for rank in (0, 1)}
        (step,) = resume_steps[0]
        assert resume_steps[1] == [step] and last - EVERY <= step <= last and step % EVERY == 0, resume_steps
        assert resumed.steps(0) == list(range(step + 1, STEPS + 1)) == resumed.steps(1)

        assert baseline.finish() == [0, 0], baseline.logs()
        assert baseline.steps(0) == list(range(1, STEPS + 1))
        wa, wb = _weights(baseline.out), _weights(resumed.out)
        assert list(wa) == list(wb)
        for name in wa:
            assert torch.equal(wa[name], wb[name]), f"tensor {name} differs after the resume in containers"
        la = json.loads((baseline.out / "losses.json").read_text())
        lb = json.loads((resumed.out / "losses.json").read_text())
        assert la["losses"] == lb["losses"] and lb["resumed_from"] == [step]
        assert os.stat(resumed.out / "model.pt").st_uid == 10001  # written by the image's user, not root
    finally:
        killed.remove()
        baseline.remove()
