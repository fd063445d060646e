"""Checkpoint-format readers, one small module each, in the order they claim directories.

Each module has ``NAME`` and ``scan(listing) -> (candidates, partials)`` (:class:`base.Reader`), and states its
completeness rule in its docstring. kfp-gpu's own directories go first, then Hugging Face Trainer
``checkpoint-<step>/`` directories (which may hold a DCP directory under FSDP), then DCP directories, then
Lightning ``.ckpt`` files outside all of those.
"""

from __future__ import annotations

from kfp_gpu.checkpoint.formats import dcp, hf, kfp, lightning
from kfp_gpu.checkpoint.formats.base import Reader

READERS: tuple[Reader, ...] = (kfp, hf, dcp, lightning)

__all__ = ["READERS", "Reader"]
