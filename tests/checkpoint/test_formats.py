"""checkpoint.resume.find over every format's completeness rule, on every store backend (local, memory://, s3://
via moto server, gs:// via the GCS emulator). The checkpoints here are laid out by hand, byte for byte what the
libraries write; tests/checkpoint/test_formats_real.py runs the real libraries."""

from __future__ import annotations

import io
import json
import logging
import pickle
import uuid
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kfp_gpu.checkpoint import CheckpointStore
from kfp_gpu.checkpoint.backends import Backend, open_backend
from kfp_gpu.checkpoint.formats import lightning
from kfp_gpu.checkpoint.resume import RESUME_FORMAT_ENV, RESUME_PATH_ENV, Resume, find, fresh_env
from kfp_gpu.errors import InvalidSpec
from kfp_gpu.job import JobTemplate
from tests.gcs_support import GcsBucket

BACKENDS = ("local", "memory", "s3", pytest.param("gs", marks=pytest.mark.integration))  # gs: the GCS emulator


@pytest.fixture(scope="module")
def moto_endpoint() -> Iterator[str]:
    server_mod = pytest.importorskip("moto.server")
    server = server_mod.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture(params=BACKENDS)
def root(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh, empty checkpoint root on one backend."""
    kind = request.param
    if kind == "local":
        return str(tmp_path / "ckpt")
    if kind == "memory":
        return f"memory://ckpt-{uuid.uuid4().hex[:8]}"
    if kind == "s3":
        endpoint = request.getfixturevalue("moto_endpoint")
        for k, v in {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                     "AWS_DEFAULT_REGION": "us-east-1"}.items():
            monkeypatch.setenv(k, v)
        monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
        import boto3

        bucket = f"b{uuid.uuid4().hex[:10]}"
        boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=bucket)
        return f"s3://{bucket}/runs/r1"
    gcs: GcsBucket = request.getfixturevalue("gcs")
    return gcs.uri("runs/r1")


# ---- what each library writes, byte for byte in shape ------------------------------------------------------


def hf_checkpoint(be: Backend, step: int, *, state: bytes | None = None, weights: bool = True,
                  prefix: str = "out") -> str:
    d = f"{prefix}/checkpoint-{step}"
    if weights:
        be.put(f"{d}/model.safetensors", b"\0" * 64)
    for name in ("config.json", "optimizer.pt", "scheduler.pt", "rng_state.pth", "training_args.bin"):
        be.put(f"{d}/{name}", b"{}")
    if state is None:
        state = json.dumps({"global_step": step, "epoch": 0.5, "log_history": [{"loss": 1.0, "step": step}]}).encode()
    if state:
        be.put(f"{d}/trainer_state.json", state)
    return d


def dcp_dir(be: Backend, name: str, *, metadata: bool = True) -> str:
    for r in range(2):
        be.put(f"{name}/__{r}_0.distcp", b"\1" * 32)
    if metadata:
        be.put(f"{name}/.metadata", b"\x80\x04N.")
    return name


class _ForeignTensor:  # pickled under a module name that does not exist: the reader must never import it
    pass


class _TorchLikePickler(pickle.Pickler):
    """Writes storages as persistent ids, as torch.save does."""

    def persistent_id(self, obj: Any) -> Any:
        return ("storage", "FloatStorage", "0", "cpu", 4) if isinstance(obj, bytearray) else None


def lightning_bytes(step: int, *, keys: tuple[str, ...] = ("global_step", "epoch"), pad: int = 0) -> bytes:
    """A torch.save zip archive of a Lightning checkpoint dict (data.pkl + one storage record)."""
    top: dict[str, Any] = {k: (step if k == "global_step" else 0) for k in keys}
    top["state_dict"] = {"w": _ForeignTensor(), "storage": bytearray(b"xx")}
    top["hyper_parameters"] = {"lr": 0.1}
    pkl = io.BytesIO()
    _TorchLikePickler(pkl, protocol=2).dump(top)
    data = pkl.getvalue().replace(__name__.encode(), b"no_such_module_anywhere")
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("archive/data.pkl", data)
        zf.writestr("archive/byteorder", "little")
        zf.writestr("archive/data/0", b"\2" * pad)
        zf.writestr("archive/version", "3\n")
    return buf.getvalue()


def test_newest_complete_checkpoint_of_any_format_wins_and_partials_are_named(
    root: str, caplog: pytest.LogCaptureFixture,
) -> None:
    be = open_backend(root)
    CheckpointStore(root, backend=be).save(3, {"model.pt": b"w3"}, meta={"loss": 2.0})
    hf_checkpoint(be, 5)
    dcp_dir(be, "dcp/step_7")
    be.put("lightning_logs/version_0/checkpoints/epoch=0-step=9.ckpt", lightning_bytes(9))
    found = find(root)
    assert found is not None and (found.format, found.step) == ("lightning", 9)
    assert found.path == f"{be.uri}/lightning_logs/version_0/checkpoints/epoch=0-step=9.ckpt"

    # newer, partial ones of every format: none is chosen, each is named with its missing piece
    be.put("step-000000010.tmp-0badf00d/model.pt", b"w10")  # kfp-gpu: no COMMITTED marker
    dcp_dir(be, "dcp/step_11", metadata=False)
    hf_checkpoint(be, 12, state=b"")
    be.put("lightning_logs/version_0/checkpoints/epoch=0-step=13.ckpt", lightning_bytes(13)[:-40])
    caplog.set_level(logging.WARNING, "kfp_gpu.checkpoint")
    again = find(root)
    assert again == found
    warned = [r for r in caplog.records if r.name == "kfp_gpu.checkpoint" and r.levelno == logging.WARNING]
    assert len(warned) == 4, [r.getMessage() for r in warned]
    assert find(root) == found  # asked again (the train step does, per attempt): the same skips are not warned twice
    assert len([r for r in caplog.records if r.name == "kfp_gpu.checkpoint" and r.levelno == logging.WARNING]) == 4
    lines = [r.getMessage() for r in caplog.records if r.name == "kfp_gpu.checkpoint"]
    for name, piece in [("step-000000010.tmp-0badf00d", "COMMITTED"), ("dcp/step_11", "no .metadata"),
                        ("out/checkpoint-12", "no trainer_state.json"),
                        ("epoch=0-step=13.ckpt", "complete zip archive")]:
        line = next((ln for ln in lines if name in ln), "")
        assert piece in line and f"{be.uri}/" in line, (name, lines)


def test_each_format_alone_and_its_env_and_args(root: str) -> None:
    be = open_backend(root)
    assert find(root) is None
    hf_checkpoint(be, 40)
    r = find(root)
    assert r is not None and (r.format, r.step, r.name) == ("hf-trainer", 40, "out/checkpoint-40")
    assert r.env() == {"KFP_GPU_CHECKPOINT_URI": be.uri, "KFP_GPU_RESUME_STEP": "40",
                       RESUME_PATH_ENV: f"{be.uri}/out/checkpoint-40", RESUME_FORMAT_ENV: "hf-trainer"}
    assert r.args(("--resume_from_checkpoint", "{path}", "--note=s{step}-{format}", "/mnt/ckpt/{name}")) == [
        "--resume_from_checkpoint", f"{be.uri}/out/checkpoint-40", "--note=s40-hf-trainer", "/mnt/ckpt/out/checkpoint-40"]
    dcp_dir(be, "sharded/global_step50")
    assert (find(root) or r).format == "dcp"
    CheckpointStore(root, backend=be).save(60, {"model.pt": b"w"})
    assert (find(root) or r).format == "kfp-gpu"


def test_hf_trainer_completeness_rule(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    root = str(tmp_path)
    be = open_backend(root)
    hf_checkpoint(be, 10)
    cases: list[tuple[int, Callable[[int], None], str]] = [
        (20, lambda s: hf_checkpoint(be, s, state=b'{"global_step": 20, "log_hist'), "does not parse"),
        (30, lambda s: hf_checkpoint(be, s, state=json.dumps({"global_step": 29}).encode()), "global_step 29"),
        (40, lambda s: hf_checkpoint(be, s, weights=False), "model weights"),
        (50, lambda s: (hf_checkpoint(be, s, weights=False), be.put(
            f"out/checkpoint-{s}/model.safetensors.index.json",
            json.dumps({"weight_map": {"a": "model-00001-of-00002.safetensors",
                                       "b": "model-00002-of-00002.safetensors"}}).encode()),
            be.put(f"out/checkpoint-{s}/model-00001-of-00002.safetensors", b"x")) and None,
         "model-00002-of-00002.safetensors"),
        (60, lambda s: (hf_checkpoint(be, s, weights=False),
                        dcp_dir(be, f"out/checkpoint-{s}/pytorch_model_fsdp_0", metadata=False)) and None,
         "pytorch_model_fsdp_0/.metadata"),
    ]
    caplog.set_level(logging.WARNING, "kfp_gpu.checkpoint")
    for step, make, piece in cases:
        make(step)
        caplog.clear()
        r = find(root)
        assert r is not None and r.step == 10, (step, r)
        assert f"checkpoint-{step}: " in caplog.text and piece in caplog.text, (step, caplog.text)
    # the DCP directory inside an HF checkpoint belongs to it: never a DCP checkpoint of its own
    assert "partial dcp" not in caplog.text
    # complete sharded / FSDP variants count
    be.put("out/checkpoint-50/model-00002-of-00002.safetensors", b"y")
    assert (find(root) or Resume(0, "", "", 0)).step == 50
    be.put("out/checkpoint-60/pytorch_model_fsdp_0/.metadata", b"m")
    assert (find(root) or Resume(0, "", "", 0)).step == 60


def test_lightning_reads_only_the_zip_directory_and_data_pkl(root: str, monkeypatch: pytest.MonkeyPatch) -> None:
    be = open_backend(root)
    big = lightning_bytes(77, pad=4 * 1024 * 1024)
    be.put("ck/last.ckpt", big)
    read: list[int] = []
    real = lightning.read_range

    def counting(backend: Backend, key: str, start: int, end: int) -> bytes:
        read.append(end - start)
        return real(backend, key, start, end)

    monkeypatch.setattr(lightning, "read_range", counting)
    r = find(root)
    assert r is not None and (r.format, r.step, r.name) == ("lightning", 77, "ck/last.ckpt")
    assert 0 < sum(read) <= 3 * 64 * 1024 < len(big), read  # a few 64 KiB blocks of a 4 MiB file


@pytest.mark.parametrize("content,piece", [
    (b"PK\3\4 not really", "complete zip archive"),
    (lightning_bytes(5, keys=("epoch",)), "'global_step'"),
    (b"", "complete zip archive"),
])
def test_lightning_partial_or_foreign_ckpt_is_skipped(tmp_path: Path, content: bytes, piece: str,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    be = open_backend(str(tmp_path))
    be.put("a/epoch=0-step=4.ckpt", lightning_bytes(4))
    be.put("a/epoch=0-step=8.ckpt", content)
    caplog.set_level(logging.WARNING, "kfp_gpu.checkpoint")
    r = find(str(tmp_path))
    assert r is not None and r.step == 4
    assert "epoch=0-step=8.ckpt" in caplog.text and piece in caplog.text


def test_dcp_without_a_step_in_its_name_is_named_not_used(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    be = open_backend(str(tmp_path))
    dcp_dir(be, "final")
    caplog.set_level(logging.WARNING, "kfp_gpu.checkpoint")
    assert find(str(tmp_path)) is None
    assert "final" in caplog.text and "step number" in caplog.text


def test_fresh_env_and_resume_args_validation() -> None:
    assert fresh_env("s3://b/p") == {"KFP_GPU_CHECKPOINT_URI": "s3://b/p", "KFP_GPU_RESUME_STEP": "0"}
    t = JobTemplate(resume_args=["--resume_from_checkpoint", "{path}"])
    assert JobTemplate.from_json(t.to_json()).resume_args == ("--resume_from_checkpoint", "{path}")
    for bad, field in [(["{paht}"], "train.resume_args[0]"), ("--resume", "train.resume_args"),
                       ([7], "train.resume_args[0]"), (["{"], "train.resume_args[0]")]:
        with pytest.raises(InvalidSpec) as ei:
            JobTemplate(resume_args=bad)
        assert ei.value.field == field and "\n" not in str(ei.value), str(ei.value)


def test_resume_args_fail_at_decoration_time() -> None:
    import kfp_gpu
    from kfp_gpu.spec import ProvisioningSpec

    with pytest.raises(InvalidSpec, match=r"train.resume_args\[1\]='\{pth\}': names \{pth\}") as ei:
        @kfp_gpu.provisioned(ProvisioningSpec("a100-80gb", 2))
        def bad():  # type: ignore[no-untyped-def]
            kfp_gpu.train(resume_args=["--resume_from_checkpoint", "{pth}"])
    assert "\n" not in str(ei.value)
