"""Proof for multi-rank (sharded, DCP) checkpoints at CPU scale: 2 real processes, gloo, DDP (and one FSDP2
case), dropout on and the data order drawn from each rank's torch RNG.

A job killed mid-training (SIGKILL of one rank), killed mid-save (SIGKILL of one rank after its shard is
written, before its manifest), or preempted (SIGTERM to one rank only) and restarted ends with every weight
``torch.equal`` to an uninterrupted job's, on a local path, on s3:// (moto server) and on gs:// (the
fake-gcs-server emulator). The uninterrupted job also shows the loss falls and the weights move, and a
resume that skips the RNG restore diverges, so the RNG state in the checkpoint matters.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from kfp_gpu.checkpoint import MARKER, CheckpointStore  # noqa: E402
from kfp_gpu.checkpoint.dcp_io import DCP_METADATA  # noqa: E402

pytestmark = pytest.mark.timeout(240)

REPO = Path(__file__).resolve().parents[2]
STEPS = 30
EVERY = 5
SEED = 7
MODEL_ARGS = ["--layers", "1", "--hidden", "32", "--seq-len", "16", "--batch-size", "8", "--seed", str(SEED),
              "--dropout", "0.1", "--data-order", "rng"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Job:
    """A 2-rank sharded training job: two processes, like a PyTorchJob's master and worker."""

    def __init__(self, root: Path, uri: str, *, env: dict[str, str] | None = None, args: tuple[str, ...] = (),
                 step_sleep: float = 0.0) -> None:
        root.mkdir(parents=True, exist_ok=True)
        self.root, self.out = root, root / "out"
        port = _free_port()
        self.procs: list[subprocess.Popen[bytes]] = []
        for rank in (0, 1):
            e = dict(os.environ, PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1", LOGLEVEL="INFO", RANK=str(rank),
                     WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), **(env or {}))
            e.pop("KFP_GPU_RESUME_STEP", None)
            cmd = [sys.executable, "-m", "pipelines.trainer.train_lm", "--sharded", "--steps", str(STEPS),
                   "--checkpoint-every", str(EVERY), "--checkpoint-uri", uri, "--out", str(self.out),
                   "--step-sleep", str(step_sleep), *MODEL_ARGS, *args]
            self.procs.append(subprocess.Popen(cmd, cwd=REPO, env=e, stdout=(root / f"r{rank}.out").open("wb"),
                                               stderr=(root / f"r{rank}.err").open("wb")))

    def events(self, rank: int) -> list[dict[str, Any]]:
        lines = (self.root / f"r{rank}.out").read_text().splitlines()
        return [json.loads(line) for line in lines if line.startswith("{") and line.endswith("}")]

    def logs(self) -> str:
        return "\n".join(f"--- rank {r} ---\n" + (self.root / f"r{r}.err").read_text()[-3000:] for r in (0, 1))

    def wait_for(self, rank: int, pred: Callable[[dict[str, Any]], bool], timeout: float = 90) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for ev in self.events(rank):
                if pred(ev):
                    return ev
            assert self.procs[rank].poll() is None, f"rank {rank} exited early\n{self.logs()}"
            time.sleep(0.02)
        raise AssertionError(f"rank {rank}: no such event within {timeout} s\n{self.logs()}")

    def wait(self, timeout: float = 120) -> list[int]:
        codes = [p.wait(timeout=timeout) for p in self.procs]
        return codes

    def kill(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait()

    def steps(self, rank: int) -> list[int]:
        return [e["step"] for e in self.events(rank) if e["event"] == "step"]


def _weights(out: Path) -> dict[str, Any]:
    weights: dict[str, Any] = torch.load(out / "model.pt", weights_only=True)
    return weights


def _losses(out: Path) -> dict[str, Any]:
    result: dict[str, Any] = json.loads((out / "losses.json").read_text())
    return result


def _assert_identical(base: Path, out: Path) -> None:
    wa, wb = _weights(base), _weights(out)
    assert list(wa) == list(wb)
    for name in wa:
        assert torch.equal(wa[name], wb[name]), f"tensor {name} differs after resume"
    assert _losses(base)["losses"] == _losses(out)["losses"]  # exact floats, every step (rank 0)


def _finish(job: Job) -> list[int]:
    try:
        return job.wait()
    finally:
        job.kill()


def _resume_and_check(root: Path, uri: str, env: dict[str, str], expect_step: int, baseline: Path,
                      args: tuple[str, ...] = ()) -> None:
    job = Job(root, uri, env=env, args=args)
    codes = _finish(job)
    assert codes == [0, 0], job.logs()
    for rank in (0, 1):
        (resume,) = [e for e in job.events(rank) if e["event"] == "resume"]
        assert resume["step"] == expect_step
        assert job.steps(rank) == list(range(expect_step + 1, STEPS + 1))
    _assert_identical(baseline, job.out)
    assert _losses(job.out)["resumed_from"] == [expect_step]


class _Baseline:
    """The uninterrupted job, started once per module, awaited on first use (it runs in parallel)."""

    def __init__(self, root: Path) -> None:
        self.job = Job(root, str(root / "ckpt"))
        self.root = root
        self._done = False

    def out(self) -> Path:
        if not self._done:
            codes = _finish(self.job)
            assert codes == [0, 0], self.job.logs()
            assert self.job.steps(0) == list(range(1, STEPS + 1)) == self.job.steps(1)
            self._done = True
        return self.job.out


@pytest.fixture(scope="module")
def baseline(tmp_path_factory: pytest.TempPathFactory) -> Iterator[_Baseline]:
    b = _Baseline(tmp_path_factory.mktemp("sharded-baseline"))
    yield b
    b.job.kill()


@pytest.fixture(scope="module")
def moto_endpoint() -> Iterator[str]:
    moto_server = pytest.importorskip("moto.server")
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def s3_env(moto_endpoint: str) -> dict[str, str]:
    boto3 = pytest.importorskip("boto3")
    env = {"AWS_ENDPOINT_URL": moto_endpoint, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
           "AWS_DEFAULT_REGION": "us-east-1"}
    boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1", aws_access_key_id="testing",
                 aws_secret_access_key="testing").create_bucket(Bucket="sharded")
    return env


def _store(uri: str, env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> CheckpointStore:
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return CheckpointStore(uri)


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")  # dcp.load(no_dist=True) says so
def test_uninterrupted_job_learns_and_writes_a_valid_dcp_checkpoint(baseline: _Baseline) -> None:
    out = baseline.out()
    from pipelines.trainer.train_lm import TinyLM, build_corpus

    torch.manual_seed(SEED)
    init = TinyLM(len(set(build_corpus())), hidden=32, layers=1, dropout=0.1).state_dict()
    final = _weights(out)
    assert all(not torch.equal(init[k], final[k]) for k in init), "every tensor must move"
    losses = _losses(out)["losses"]
    assert len(losses) == STEPS and sum(losses[-5:]) / 5 < sum(losses[:5]) / 5 - 0.3, losses
    # Each rank draws its own batches and dropout masks: their loss curves differ.
    loss1 = [e["loss"] for e in baseline.job.events(1) if e["event"] == "step"]
    assert loss1 != losses
    # The committed checkpoint is a plain DCP directory too: torch's own reader loads it.
    import torch.distributed.checkpoint as dcp

    ckpt_dir = baseline.root / "ckpt" / f"step-{STEPS:09d}"
    assert (ckpt_dir / MARKER).exists() and (ckpt_dir / DCP_METADATA).exists()
    state = {"model": {k: torch.zeros_like(v) for k, v in final.items()}}
    dcp.load(state, checkpoint_id=str(ckpt_dir), no_dist=True)
    assert all(torch.equal(state["model"][k], final[k]) for k in final)


def test_sigkill_one_rank_mid_training_resumes_bitwise_and_rng_restore_matters(
    baseline: _Baseline, tmp_path: Path
) -> None:
    uri = str(tmp_path / "ckpt")
    job = Job(tmp_path / "run1", uri, step_sleep=0.05)
    job.wait_for(1, lambda e: e["event"] == "step" and e["step"] >= 12)
    job.procs[1].send_signal(signal.SIGKILL)
    codes = _finish(job)
    assert codes[1] == -signal.SIGKILL and codes[0] != 0, "rank 0 must fail when its peer is gone"
    last = max(job.steps(1))
    latest = CheckpointStore(uri).latest()
    assert latest is not None and last - EVERY <= latest.step <= last and latest.step % EVERY == 0
    shutil.copytree(tmp_path / "ckpt", tmp_path / "ckpt-norng")
    control = Job(tmp_path / "control", str(tmp_path / "ckpt-norng"), args=("--no-rng-restore",))
    _resume_and_check(tmp_path / "run2", uri, {}, latest.step, baseline.out())
    assert _finish(control) == [0, 0], control.logs()
    differs = [k for k, v in _weights(control.out).items() if not torch.equal(v, _weights(baseline.out())[k])]
    assert differs, "a resume without the RNG state must diverge, or the test proves nothing about RNG restore"


def _kill_mid_save(job: Job, uri: str, env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> int:
    """SIGKILL rank 1 after its shard of the step-10 save is written, before its manifest; return the step
    of the newest complete checkpoint, after checking the half-done attempt is present and uncommitted."""
    ev = job.wait_for(1, lambda e: e["event"] == "saving" and e["step"] >= 2 * EVERY)
    job.procs[1].send_signal(signal.SIGKILL)
    codes = _finish(job)
    assert codes[1] == -signal.SIGKILL and codes[0] != 0, job.logs()
    store = _store(uri, env, monkeypatch)
    attempt = ev["attempt"]
    keys = {k.partition("/")[2] for k in store.backend.list(attempt + "/")}
    assert DCP_METADATA in keys and "__1_0.distcp" in keys, keys  # DCP finished: .metadata alone looks complete
    assert MARKER not in keys and "rank-1.done" not in keys, keys
    done, partial = store.scan()
    assert attempt in [i.name for i in partial] and attempt not in [c.name for c in done]
    latest = store.latest()
    assert latest is not None and latest.step == ev["step"] - EVERY
    # The launcher's view (every recognised format): the uncommitted attempt is not taken for a complete
    # DCP checkpoint although its .metadata is there.
    from kfp_gpu.checkpoint import resume

    chosen = resume.find(uri)
    assert chosen is not None and (chosen.step, chosen.format) == (latest.step, "kfp-gpu")
    return latest.step


def test_sigkill_one_rank_mid_save_local(baseline: _Baseline, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    uri = str(tmp_path / "ckpt")
    job = Job(tmp_path / "run1", uri, args=("--save-sleep", "1.0"))
    step = _kill_mid_save(job, uri, {}, monkeypatch)
    _resume_and_check(tmp_path / "run2", uri, {}, step, baseline.out())


def test_sigkill_one_rank_mid_save_s3(baseline: _Baseline, tmp_path: Path, s3_env: dict[str, str],
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    uri = f"s3://sharded/{tmp_path.name}"
    job = Job(tmp_path / "run1", uri, env=s3_env, args=("--save-sleep", "1.0"))
    step = _kill_mid_save(job, uri, s3_env, monkeypatch)
    _resume_and_check(tmp_path / "run2", uri, s3_env, step, baseline.out())


@pytest.mark.integration  # the GCS emulator (fake-gcs-server)
def test_sigkill_one_rank_mid_save_gs(baseline: _Baseline, tmp_path: Path, gcs: Any,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    uri = gcs.uri(tmp_path.name)
    job = Job(tmp_path / "run1", uri, env=gcs.env, args=("--save-sleep", "1.0"))
    step = _kill_mid_save(job, uri, gcs.env, monkeypatch)
    _resume_and_check(tmp_path / "run2", uri, gcs.env, step, baseline.out())


def test_fsdp_sigkill_one_rank_mid_save_resumes_bitwise(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """FSDP2 (fully_shard) on CPU with gloo: parameters and AdamW state are DTensor shards, one per rank."""
    fsdp_baseline = Job(tmp_path / "baseline", str(tmp_path / "ckpt-baseline"), args=("--fsdp",))
    try:
        uri = str(tmp_path / "ckpt")
        job = Job(tmp_path / "run1", uri, args=("--fsdp", "--save-sleep", "1.0"))
        step = _kill_mid_save(job, uri, {}, monkeypatch)
        assert _finish(fsdp_baseline) == [0, 0], fsdp_baseline.logs()
        _resume_and_check(tmp_path / "run2", uri, {}, step, fsdp_baseline.out, args=("--fsdp",))
    finally:
        fsdp_baseline.kill()


@pytest.fixture(params=["local", "s3", pytest.param("gs", marks=pytest.mark.integration)])  # gs: the GCS emulator
def any_store(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, dict[str, str]]:
    """(uri, env for the trainer) on a local path, s3:// (moto) or gs:// (fake-gcs-server)."""
    if request.param == "s3":
        env: dict[str, str] = request.getfixturevalue("s3_env")
        return f"s3://sharded/{tmp_path.name}", env
    if request.param == "gs":
        bucket = request.getfixturevalue("gcs")
        return bucket.uri(tmp_path.name), dict(bucket.env)
    return str(tmp_path / "ckpt"), {}


def test_sigterm_to_one_rank_both_save_the_same_step(baseline: _Baseline, tmp_path: Path,
                                                     any_store: tuple[str, dict[str, str]],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    uri, env = any_store
    job = Job(tmp_path / "run1", uri, env=env, step_sleep=0.05)
    job.wait_for(1, lambda e: e["event"] == "step" and e["step"] >= 12)
    job.procs[1].send_signal(signal.SIGTERM)  # the kubelet of one node only; rank 0 is never signalled
    codes = _finish(job)
    assert codes == [143, 143], job.logs()
    saved = [[e["saved_step"] for e in job.events(r) if e["event"] == "preempted"] for r in (0, 1)]
    assert saved[0] == saved[1] and len(saved[0]) == 1 and saved[0][0] is not None, saved
    step = saved[0][0]
    assert step == max(job.steps(0)) == max(job.steps(1)), "the emergency save must hold the last completed step"
    latest = _store(uri, env, monkeypatch).latest()
    assert latest is not None and latest.step == step
    _resume_and_check(tmp_path / "run2", uri, env, step, baseline.out())


def test_emergency_save_that_outlasts_the_grace_period_stays_uncommitted(tmp_path: Path) -> None:
    uri = str(tmp_path / "ckpt")
    # Every save takes > 5 s, the grace period is 3 s: the watchdogs end both ranks mid-save with 143.
    job = Job(tmp_path / "run1", uri, step_sleep=0.05, args=("--grace-s", "3", "--save-sleep", "5"))
    job.wait_for(1, lambda e: e["event"] == "step" and e["step"] >= 2)
    t0 = time.monotonic()
    job.procs[1].send_signal(signal.SIGTERM)
    codes = _finish(job)
    elapsed = time.monotonic() - t0
    assert codes == [143, 143], job.logs()
    assert elapsed < 3 + 2.5, f"the ranks outlived the grace period: {elapsed:.1f} s"
    saving = [e for r in (0, 1) for e in job.events(r) if e["event"] == "saving"]
    assert {e["rank"] for e in saving} == {0, 1} and len({e["attempt"] for e in saving}) == 1
    store = CheckpointStore(uri)
    done, partial = store.scan()
    assert done == [] and store.latest() is None
    assert [i.name for i in partial] == [saving[0]["attempt"]]
    keys = {k.partition("/")[2] for k in store.backend.list(saving[0]["attempt"] + "/")}
    assert DCP_METADATA in keys and MARKER not in keys, keys  # DCP's part finished; ours never did
