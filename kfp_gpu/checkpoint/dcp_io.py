"""Sharded checkpoints through ``torch.distributed.checkpoint`` (DCP), committed across ranks.

:func:`save_sharded` is a collective: every rank of the process group calls it with the same step. DCP is
the shard writer, pointed at the store's backend (local path, s3://, gs://, fsspec) through
:class:`BackendFileSystem`, so the attempt prefix is also a valid DCP checkpoint directory
(``__<rank>_0.distcp`` shards + ``.metadata``). On top of DCP, :class:`~kfp_gpu.checkpoint.sharded.RankedSave`
adds each rank's ``rank-<K>/extra.pt`` (RNG state + ``extra``) and ``rank-<K>.done`` manifest, and rank 0
writes ``COMMITTED`` only after it has read every manifest back from the store. DCP's ``.metadata`` alone
means "DCP finished"; only ``COMMITTED`` means "every rank's part, including its RNG state, is there".

:func:`load_sharded` is the matching collective: rank 0 picks the newest complete checkpoint
(:meth:`CheckpointStore.latest`) and broadcasts it, so every rank loads the same one; each file read is
checked against the sha256 in the marker. torch is imported lazily, inside each function.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import logging
import warnings
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from kfp_gpu.checkpoint.backends import Backend, BlobNotFound
from kfp_gpu.checkpoint.errors import CheckpointCorrupt
from kfp_gpu.checkpoint.layout import Checkpoint, attempt_name
from kfp_gpu.checkpoint.sharded import RankedSave, RanksIncomplete
from kfp_gpu.checkpoint.store import CheckpointStore
from kfp_gpu.checkpoint.torch_io import TorchResume, _from_bytes, _to_bytes, rng_state, set_rng_state

log = logging.getLogger("kfp_gpu.checkpoint")

DCP_METADATA = ".metadata"
FORMAT = "kfp-gpu-dcp-1"


def rank_extra_name(rank: int) -> str:
    """Per-rank payload: ``rank-<K>/extra.pt`` (``{"rng": ..., "extra": ...}``)."""
    return f"rank-{rank}/extra.pt"


class _CapturingStream(io.BytesIO):
    """A write stream whose contents survive ``close()`` (DCP closes the stream inside the ``with``)."""

    def __init__(self) -> None:
        super().__init__()
        self.captured: bytes | None = None

    def close(self) -> None:
        if not self.closed:
            self.captured = self.getvalue()
        super().close()


class BackendFileSystem:
    """DCP's ``FileSystemBase`` over a kfp-gpu :class:`~kfp_gpu.checkpoint.backends.Backend`.

    Paths are backend keys (``<attempt>/<file>``). Every file written is recorded in :attr:`written`
    (relative name -> (sha256, size)); with ``expected`` every file read is checked against it.
    """

    def __init__(self, backend: Backend, expected: Mapping[str, str] | None = None, root: str = "") -> None:
        self.backend = backend
        self.expected = expected
        self.root = root
        self.written: dict[str, tuple[str, int]] = {}

    def _rel(self, path: Any) -> str:
        key = str(path)
        return key[len(self.root) + 1:] if self.root and key.startswith(self.root + "/") else key

    @contextlib.contextmanager
    def create_stream(self, path: Any, mode: str) -> Iterator[io.BytesIO]:
        key = str(path)
        if "w" in mode:
            stream = _CapturingStream()
            yield stream
            data = stream.captured if stream.captured is not None else stream.getvalue()
            self.backend.put(key, data)
            self.written[self._rel(key)] = (hashlib.sha256(data).hexdigest(), len(data))
            return
        try:
            data = self.backend.get(key)
        except BlobNotFound:
            raise FileNotFoundError(key) from None
        rel = self._rel(key)
        if self.expected is not None and hashlib.sha256(data).hexdigest() != self.expected.get(rel):
            raise CheckpointCorrupt(
                f"checkpoint file {self.backend.uri}/{key}: sha256 does not match its COMMITTED marker",
                remediation="resume from an older checkpoint", file=rel,
            )
        yield io.BytesIO(data)

    def concat_path(self, path: Any, suffix: str) -> str:
        return f"{str(path).rstrip('/')}/{suffix}"

    def rename(self, path: Any, new_path: Any) -> None:
        data = self.backend.get(str(path))
        self.backend.put(str(new_path), data)
        self.backend.delete(str(path))
        old = self.written.pop(self._rel(path), None)
        self.written[self._rel(new_path)] = old or (hashlib.sha256(data).hexdigest(), len(data))

    def init_path(self, path: Any) -> str:
        return str(path)

    def mkdir(self, path: Any) -> None:
        """Object stores have no directories; local puts create theirs."""

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: Any) -> bool:
        return True

    def exists(self, path: Any) -> bool:
        try:
            self.backend.get(str(path))
        except BlobNotFound:
            return False
        return True

    def rm_file(self, path: Any) -> None:
        self.backend.delete(str(path))


def _writer(fs: BackendFileSystem, prefix: str) -> Any:
    from torch.distributed.checkpoint.filesystem import FileSystemWriter  # lazy

    writer = FileSystemWriter(prefix, sync_files=False)  # the backend's put is durable (fsync / object PUT)
    writer.fs = fs  # type: ignore[assignment]  # the extension point DCP's own FsspecWriter uses
    writer.path = prefix
    return writer


def _reader(fs: BackendFileSystem, prefix: str) -> Any:
    from torch.distributed.checkpoint.filesystem import FileSystemReader  # lazy

    reader = FileSystemReader(prefix)
    reader.fs = fs  # type: ignore[assignment]
    reader.path = prefix
    return reader


def _group_info(group: Any) -> tuple[int, int, bool]:
    import torch.distributed as dist  # lazy

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(group), dist.get_world_size(group), True
    return 0, 1, False


def _broadcast(obj: Any, group: Any, distributed: bool) -> Any:
    if not distributed:
        return obj
    import torch.distributed as dist  # lazy

    box = [obj]
    dist.broadcast_object_list(box, src=0, group=group)
    return box[0]


@contextlib.contextmanager
def _single_process_quiet() -> Iterator[None]:
    """DCP warns that it "assumes the intent is to save in a single process" without a process group; it is."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def _state(model: Any, optimizer: Any) -> dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict  # lazy

    if optimizer is None:
        return {"model": get_model_state_dict(model)}
    model_sd, optim_sd = get_state_dict(model, optimizer)
    return {"model": model_sd, "optim": optim_sd}


def save_sharded(
    store: CheckpointStore,
    step: int,
    model: Any,
    optimizer: Any = None,
    extra: Any = None,
    *,
    meta: Mapping[str, Any] | None = None,
    include_rng: bool = True,
    timeout_s: float = 60.0,
    group: Any = None,
    on_rank_written: Callable[[str], None] | None = None,
) -> Checkpoint:
    """Collective: every rank saves its shard of ``model`` / ``optimizer`` (DDP or FSDP) plus its own RNG
    state and ``extra``; rank 0 commits once every rank's part is in the store (at most ``timeout_s``).

    ``on_rank_written(attempt)`` runs on each rank after its files are written and before its manifest
    (progress reporting; tests use it to kill a rank mid-save). Returns the same Checkpoint on every rank.

    Raises:
        RanksIncomplete: some rank's part is missing (a rank died); on every rank that is still alive.
            The attempt stays uncommitted. A peer that died mid-collective raises torch's error instead.
        StorageError: the store failed.
    """
    from torch.distributed.checkpoint.state_dict_saver import save as dcp_save  # lazy

    rank, world, distributed = _group_info(group)
    attempt = _broadcast(attempt_name(step) if rank == 0 else None, group, distributed)
    save = RankedSave(store, step, attempt, rank=rank, world=world)
    save.writer.put(rank_extra_name(rank), _to_bytes({"rng": rng_state() if include_rng else None,
                                                      "extra": extra}))
    fs = BackendFileSystem(store.backend, root=attempt)
    with _single_process_quiet():
        dcp_save(_state(model, optimizer), storage_writer=_writer(fs, attempt),
                 process_group=group, no_dist=not distributed)
    for name, (digest, size) in fs.written.items():
        save.record(name, digest, size)
    if on_rank_written is not None:
        on_rank_written(attempt)
    save.finish_rank()
    if distributed:
        import torch.distributed as dist  # lazy

        dist.barrier(group=group)  # fast failure detection only: rank 0 still checks the store itself
    outcome: Checkpoint | str | None = None
    if rank == 0:
        try:
            outcome = save.commit({"format": FORMAT, **dict(meta or {})}, timeout_s=timeout_s,
                                  require=(DCP_METADATA,))
        except RanksIncomplete as exc:
            outcome = exc.message
    outcome = _broadcast(outcome, group, distributed)
    if not isinstance(outcome, Checkpoint):
        raise RanksIncomplete(str(outcome), uri=f"{store.uri}/{attempt}", step=step,
                              remediation="resume from the newest complete checkpoint")
    return outcome


def load_sharded(
    store: CheckpointStore,
    model: Any,
    optimizer: Any = None,
    *,
    group: Any = None,
    restore_rng: bool = True,
) -> TorchResume | None:
    """Collective: restore ``model`` / ``optimizer`` / this rank's RNG state from the newest complete
    checkpoint (rank 0 chooses it; every rank loads the same). None on a fresh start.

    Raises:
        CheckpointCorrupt: a file read does not match the marker, or the checkpoint is not a DCP one.
        StorageError: the store failed.
    """
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_state_dict  # lazy

    rank, world, distributed = _group_info(group)
    ckpt = _broadcast(store.latest() if rank == 0 else None, group, distributed)
    if ckpt is None:
        return None
    if DCP_METADATA not in ckpt.files:
        raise CheckpointCorrupt(f"checkpoint {ckpt.uri} is not a sharded (DCP) checkpoint",
                                remediation="load it with load_torch(), or start from an empty checkpoint_uri",
                                uri=ckpt.uri)
    fs = BackendFileSystem(store.backend, expected=ckpt.files, root=ckpt.name)
    state = _state(model, optimizer)
    from torch.distributed.checkpoint.state_dict_loader import load as dcp_load  # lazy

    with _single_process_quiet():
        dcp_load(state, storage_reader=_reader(fs, ckpt.name), process_group=group, no_dist=not distributed)
    if optimizer is None:
        set_model_state_dict(model, state["model"])
    else:
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    restored = ["model"] + (["optimizer"] if optimizer is not None else [])
    name = rank_extra_name(rank)
    extra = None
    if name in ckpt.files:
        with fs.create_stream(f"{ckpt.name}/{name}", "rb") as fh:
            payload = _from_bytes(fh.read(), name, ckpt, "cpu")
        extra = payload.get("extra")
        if restore_rng and payload.get("rng") is not None:
            set_rng_state(payload["rng"])
            restored.append("rng")
    else:
        log.warning("checkpoint %s has no %s (saved by %s ranks, this job has %d): RNG state not restored",
                    ckpt.uri, name, ckpt.meta.get("ranks"), world)
    return TorchResume(ckpt, extra, tuple(restored))


def any_rank(flag: bool, group: Any = None) -> bool:
    """Collective: True on every rank when ``flag`` is True on any rank (all-reduce MAX). The ``agree``
    of :func:`~kfp_gpu.checkpoint.preemption.on_preemption` for torch.distributed jobs.

    Raises: whatever torch.distributed raises when a peer is gone (e.g. gloo's connection errors).
    """
    rank, world, distributed = _group_info(group)
    if not distributed or world == 1:
        return flag
    import torch  # lazy
    import torch.distributed as dist  # lazy

    t = torch.tensor([1 if flag else 0], dtype=torch.int32)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return bool(t.item())
