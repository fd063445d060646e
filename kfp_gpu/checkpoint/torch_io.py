"""torch helpers: model + optimizer + extra state <-> a checkpoint, via ``torch.save`` to bytes.

torch is imported lazily, inside each function, so the rest of :mod:`kfp_gpu.checkpoint` needs no torch.
Payload files: ``model.pt`` (state_dict, DDP wrapper stripped), ``optimizer.pt`` (when given),
``extra.pt`` (any ``torch.load(weights_only=True)``-safe object: numbers, lists, dicts, tensors) and
``rng.pt`` (torch CPU + Python ``random`` generator states, when ``include_rng``).
"""

from __future__ import annotations

import io
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kfp_gpu.checkpoint.errors import CheckpointCorrupt
from kfp_gpu.checkpoint.layout import Checkpoint
from kfp_gpu.checkpoint.store import CheckpointStore

MODEL_FILE = "model.pt"
OPTIMIZER_FILE = "optimizer.pt"
EXTRA_FILE = "extra.pt"
RNG_FILE = "rng.pt"


@dataclass(frozen=True)
class TorchResume:
    """What :func:`load_torch` restored."""

    checkpoint: Checkpoint
    extra: Any = None
    restored: tuple[str, ...] = field(default_factory=tuple)

    @property
    def step(self) -> int:
        return self.checkpoint.step


def _to_bytes(obj: Any) -> bytes:
    import torch  # lazy

    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def _from_bytes(data: bytes, name: str, ckpt: Checkpoint, map_location: Any) -> Any:
    import torch  # lazy

    try:
        return torch.load(io.BytesIO(data), map_location=map_location, weights_only=True)
    except Exception as exc:
        raise CheckpointCorrupt(
            f"checkpoint {ckpt.uri}: {name} does not load with torch.load ({type(exc).__name__}: {exc})",
            remediation="resume from an older checkpoint, or save only weights_only-safe objects in extra",
            uri=ckpt.uri, file=name,
        ) from exc


def rng_state() -> dict[str, Any]:
    """The torch CPU and Python ``random`` generator states."""
    import torch  # lazy

    return {"torch": torch.get_rng_state(), "python": random.getstate()}


def set_rng_state(state: Mapping[str, Any]) -> None:
    """Restore what :func:`rng_state` returned."""
    import torch  # lazy

    if "torch" in state:
        torch.set_rng_state(state["torch"])
    if "python" in state:
        py = state["python"]
        random.setstate((py[0], tuple(py[1]), py[2]))


def save_torch(
    store: CheckpointStore,
    step: int,
    model: Any,
    optimizer: Any = None,
    extra: Any = None,
    *,
    meta: Mapping[str, Any] | None = None,
    include_rng: bool = True,
) -> Checkpoint:
    """Checkpoint ``model`` (and ``optimizer``, ``extra``, RNG state) as step ``step``.

    Raises:
        StorageError: the store failed (see :meth:`CheckpointStore.save`).
        ValueError: ``meta`` is not JSON-serialisable.
    """
    module = getattr(model, "module", model)  # unwrap DistributedDataParallel
    payload: dict[str, bytes] = {MODEL_FILE: _to_bytes(module.state_dict())}
    if optimizer is not None:
        payload[OPTIMIZER_FILE] = _to_bytes(optimizer.state_dict())
    if extra is not None:
        payload[EXTRA_FILE] = _to_bytes(extra)
    if include_rng:
        payload[RNG_FILE] = _to_bytes(rng_state())
    return store.save(step, payload, meta={"format": "kfp-gpu-torch-1", **dict(meta or {})})


def load_torch(
    store: CheckpointStore,
    model: Any,
    optimizer: Any = None,
    *,
    checkpoint: Checkpoint | None = None,
    map_location: Any = "cpu",
    restore_rng: bool = True,
) -> TorchResume | None:
    """Restore ``model`` / ``optimizer`` / RNG from ``checkpoint``, or from the newest complete one.

    Returns None when the store has no complete checkpoint (a fresh start).

    Raises:
        CheckpointCorrupt: the chosen checkpoint is damaged or lacks ``optimizer.pt`` when one is passed.
        StorageError: the store failed.
    """
    if checkpoint is None:
        found = store.load_latest()
        if found is None:
            return None
        ckpt, files = found
    else:
        ckpt, files = checkpoint, store.load(checkpoint)
    if MODEL_FILE not in files:
        raise CheckpointCorrupt(f"checkpoint {ckpt.uri} has no {MODEL_FILE}", uri=ckpt.uri, file=MODEL_FILE)
    restored = [MODEL_FILE]
    getattr(model, "module", model).load_state_dict(_from_bytes(files[MODEL_FILE], MODEL_FILE, ckpt, map_location))
    if optimizer is not None:
        if OPTIMIZER_FILE not in files:
            raise CheckpointCorrupt(
                f"checkpoint {ckpt.uri} has no {OPTIMIZER_FILE}", uri=ckpt.uri, file=OPTIMIZER_FILE,
                remediation="pass optimizer=None to restore the weights only",
            )
        optimizer.load_state_dict(_from_bytes(files[OPTIMIZER_FILE], OPTIMIZER_FILE, ckpt, map_location))
        restored.append(OPTIMIZER_FILE)
    if restore_rng and RNG_FILE in files:
        set_rng_state(_from_bytes(files[RNG_FILE], RNG_FILE, ckpt, "cpu"))
        restored.append(RNG_FILE)
    extra = _from_bytes(files[EXTRA_FILE], EXTRA_FILE, ckpt, map_location) if EXTRA_FILE in files else None
    return TorchResume(ckpt, extra, tuple(restored))
