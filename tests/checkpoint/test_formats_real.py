"""The format readers on checkpoints written by the real libraries: transformers' Trainer (a 2-layer GPT-2 built from
a config, no download), PyTorch Lightning, and torch.distributed.checkpoint. Each writer runs in its own process;
the "interrupted" runs are the same libraries killed (os._exit) at the point their save would write its last file.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from kfp_gpu.checkpoint.backends import open_backend
from kfp_gpu.checkpoint.formats import lightning
from kfp_gpu.checkpoint.resume import find

ROOT = Path(__file__).resolve().parents[2]

HF_WRITER = textwrap.dedent("""
    import os, sys, torch
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments
    from transformers.trainer_callback import TrainerState
    out, die_at, resume = sys.argv[1], int(sys.argv[2]), sys.argv[3] or None
    if die_at:  # killed while saving checkpoint-<die_at>: weights, optimizer, RNG written, trainer_state.json not
        real = TrainerState.save_to_json
        def save_to_json(self, path):
            if self.global_step == die_at:
                os._exit(9)
            real(self, path)
        TrainerState.save_to_json = save_to_json
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=2, n_embd=16, vocab_size=64, n_positions=32))
    class Data(torch.utils.data.Dataset):
        def __len__(self): return 64
        def __getitem__(self, i):
            x = torch.randint(0, 64, (16,), generator=torch.Generator().manual_seed(i))
            return {"input_ids": x, "labels": x}
    args = TrainingArguments(output_dir=out, max_steps=8 if resume else 6, save_steps=2, per_device_train_batch_size=4,
                             report_to=[], use_cpu=True, disable_tqdm=True, logging_steps=1)
    trainer = Trainer(model=model, args=args, train_dataset=Data())
    trainer.train(resume_from_checkpoint=resume)
    print("GLOBAL_STEP", trainer.state.global_step)
""")

LIGHTNING_WRITER = textwrap.dedent("""
    import os, sys, torch
    import pytorch_lightning as pl
    out = sys.argv[1]
    class M(pl.LightningModule):
        def __init__(self):
            super().__init__(); self.save_hyperparameters({"lr": 0.1}); self.l = torch.nn.Linear(4, 1)
        def training_step(self, b, i):
            x, y = b; return torch.nn.functional.mse_loss(self.l(x), y)
        def configure_optimizers(self): return torch.optim.SGD(self.parameters(), lr=0.1)
    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(32, 4), torch.randn(32, 1))
    ck = pl.callbacks.ModelCheckpoint(dirpath=out, every_n_train_steps=2, save_top_k=-1)
    pl.Trainer(max_steps=6, callbacks=[ck], logger=False, enable_progress_bar=False, enable_model_summary=False,
               accelerator="cpu", devices=1).fit(M(), torch.utils.data.DataLoader(data, batch_size=4))
""")

DCP_WRITER = textwrap.dedent("""
    import os, sys, torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import filesystem
    out = sys.argv[1]
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(3, 8)).sum().backward(); opt.step()
    for step in (5, 10):
        dcp.save({"model": model.state_dict(), "optim": opt.state_dict()}, checkpoint_id=f"{out}/step_{step}")
    # killed after every rank's data is written, before the coordinator's finish() writes .metadata
    filesystem.FileSystemWriter.finish = lambda self, metadata, results: os._exit(9)
    dcp.save({"model": model.state_dict()}, checkpoint_id=f"{out}/step_15")
""")


def _run(script: str, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    return subprocess.Popen([sys.executable, "-c", script, *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _done(proc: subprocess.Popen[str], expect: int = 0, timeout: float = 240) -> str:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == expect, f"exit {proc.returncode}\n{out[-2000:]}\n{err[-4000:]}"
    return out


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Runs the three writers at once (about 15 s): hf/ (complete), hf-killed/ (died saving checkpoint-6),
    pl/, dcp/ (step_5 and step_10 complete, step_15 killed before .metadata)."""
    base = tmp_path_factory.mktemp("real")
    procs = [(_run(HF_WRITER, str(base / "hf"), "0", ""), 0), (_run(HF_WRITER, str(base / "hf-killed"), "6", ""), 9),
             (_run(LIGHTNING_WRITER, str(base / "pl")), 0), (_run(DCP_WRITER, str(base / "dcp")), 9)]
    for proc, code in procs:
        _done(proc, code)
    yield base


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "kfp_gpu.checkpoint" and r.levelno >= logging.WARNING]


def test_hf_trainer_checkpoints(written: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    hf = written / "hf"
    assert sorted(p.name for p in hf.iterdir()) == ["checkpoint-2", "checkpoint-4", "checkpoint-6"]
    r = find(str(hf))
    assert r is not None and (r.format, r.step, r.path) == ("hf-trainer", 6, str(hf / "checkpoint-6"))
    # the Trainer killed while saving checkpoint-6: everything but trainer_state.json is there
    killed = written / "hf-killed"
    assert (killed / "checkpoint-6" / "model.safetensors").exists()
    caplog.set_level(logging.WARNING, "kfp_gpu.checkpoint")
    r = find(str(killed))
    assert r is not None and (r.step, r.path) == (4, str(killed / "checkpoint-4"))
    assert any(str(killed / "checkpoint-6") in w and "no trainer_state.json" in w for w in _warnings(caplog))
    # truncated trainer_state.json, then missing weights: each skipped, named
    copy = tmp_path / "hf"
    shutil.copytree(hf, copy)
    state = copy / "checkpoint-6" / "trainer_state.json"
    state.write_bytes(state.read_bytes()[:100])
    (copy / "checkpoint-4" / "model.safetensors").unlink()
    caplog.clear()
    r = find(str(copy))
    assert r is not None and r.step == 2
    w = _warnings(caplog)
    assert any("checkpoint-6" in x and "trainer_state.json does not parse" in x for x in w), w
    assert any("checkpoint-4" in x and "no model weights" in x for x in w), w


def test_hf_trainer_resumes_from_the_path_find_returns(written: Path, tmp_path: Path) -> None:
    """What the resume args hand the user's script is what `Trainer.train(resume_from_checkpoint=...)` takes."""
    copy = tmp_path / "hf"
    shutil.copytree(written / "hf-killed", copy)
    r = find(str(copy))
    assert r is not None and r.step == 4
    out = _done(_run(HF_WRITER, str(copy), "0", *r.args(["{path}"])))
    assert "GLOBAL_STEP 8" in out
    state = json.loads((copy / "checkpoint-8" / "trainer_state.json").read_text())
    assert state["global_step"] == 8 and min(e["step"] for e in state["log_history"]) == 1  # history carried over
    assert (find(str(copy)) or r).step == 8


def test_lightning_checkpoints(written: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    import torch

    pl = written / "pl"
    files = sorted(p.name for p in pl.iterdir())
    assert files == ["epoch=0-step=2.ckpt", "epoch=0-step=4.ckpt", "epoch=0-step=6.ckpt"], files
    for f in files:  # the cheap reader agrees with a full torch.load
        step, missing = lightning.read_header(open_backend(str(pl)), f)
        full = torch.load(pl / f, map_location="cpu", weights_only=False)
        assert missing is None and step == full["global_step"], (f, step, missing)
    r = find(str(pl))
    assert r is not None and (r.format, r.step, r.path) == ("lightning", 6, str(pl / "epoch=0-step=6.ckpt"))
    # an interrupted write (the file cut short), and a file that is not a checkpoint at all
    copy = tmp_path / "pl"
    shutil.copytree(pl, copy)
    newest = copy / "epoch=0-step=6.ckpt"
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])
    caplog.set_level(logging.WARNING, "kfp_gpu.checkpoint")
    r = find(str(copy))
    assert r is not None and r.step == 4
    assert any("epoch=0-step=6.ckpt" in w and "not a complete zip archive" in w for w in _warnings(caplog))


def test_dcp_checkpoints(written: Path, caplog: pytest.LogCaptureFixture) -> None:
    d = written / "dcp"
    killed = sorted(p.name for p in (d / "step_15").iterdir())
    assert any(n.endswith(".distcp") for n in killed) and ".metadata" not in killed, killed
    caplog.set_level(logging.WARNING, "kfp_gpu.checkpoint")
    r = find(str(d))
    assert r is not None and (r.format, r.step, r.path) == ("dcp", 10, str(d / "step_10"))
    assert any(str(d / "step_15") in w and "no .metadata" in w for w in _warnings(caplog)), _warnings(caplog)


@pytest.mark.integration  # the GCS emulator
def test_real_checkpoints_over_s3_and_gs(written: Path, tmp_path: Path, request: pytest.FixtureRequest,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The same trees uploaded to s3:// (moto server) and gs:// (the GCS emulator): same choice, same skips."""
    import boto3
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        for k, v in {"AWS_ENDPOINT_URL": f"http://{host}:{port}", "AWS_ACCESS_KEY_ID": "testing",
                     "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}.items():
            monkeypatch.setenv(k, v)
        boto3.client("s3").create_bucket(Bucket="real")
        gcs = request.getfixturevalue("gcs")
        for base in ("s3://real/run", gcs.uri("run")):
            be = open_backend(base)
            for sub in ("hf-killed", "pl", "dcp"):
                for f in sorted((written / sub).rglob("*")):
                    if f.is_file():
                        be.put(f"{sub}/{f.relative_to(written / sub).as_posix()}", f.read_bytes())
            got = {sub: find(f"{base}/{sub}") for sub in ("hf-killed", "pl", "dcp")}
            assert {k: (v.format, v.step) if v else None for k, v in got.items()} == {
                "hf-killed": ("hf-trainer", 4), "pl": ("lightning", 6), "dcp": ("dcp", 10)}, base
            assert got["pl"] is not None and got["pl"].path == f"{base}/pl/epoch=0-step=6.ckpt"
            assert got["pl"].created > 0  # the object's time, from the store
    finally:
        server.stop()
