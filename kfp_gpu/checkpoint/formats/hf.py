"""Hugging Face Trainer checkpoints: ``checkpoint-<step>/`` directories (at any depth under the root).

``Trainer._save_checkpoint`` writes the model weights, then the optimizer, scheduler, scaler and RNG state, and
``trainer_state.json`` last (transformers/trainer.py). Completeness rule: ``trainer_state.json`` is present and
parses, its ``global_step`` equals the directory's step, and the weights it implies exist: ``model.safetensors``
or ``pytorch_model.bin``, or an index (``model.safetensors.index.json`` / ``pytorch_model.bin.index.json``) and
every shard its ``weight_map`` names, or PEFT ``adapter_model.safetensors`` / ``adapter_model.bin``, or FSDP's
``pytorch_model_fsdp.bin`` or a ``pytorch_model_fsdp_<n>/`` DCP directory with its ``.metadata``. A directory
without ``trainer_state.json`` is partial from the listing alone. DeepSpeed's ``global_step<N>/`` directory
inside the checkpoint is not checked.
"""

from __future__ import annotations

import json
import re
from typing import Any

from kfp_gpu.checkpoint.formats.base import Candidate, Check, Listing, Partial, modified, read_small

NAME = "hf-trainer"
STATE_FILE = "trainer_state.json"
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin", "adapter_model.safetensors", "adapter_model.bin",
                "pytorch_model_fsdp.bin")
INDEX_FILES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
_DIR_RE = re.compile(r"^checkpoint-(\d+)$")
_FSDP_DIR_RE = re.compile(r"^pytorch_model_fsdp(_\d+)?$")


def scan(listing: Listing) -> tuple[list[Candidate], list[Partial]]:
    """Every ``checkpoint-<step>/`` directory: candidates when ``trainer_state.json`` is listed, else partials.
    Claims the directories (a DCP directory inside one belongs to it). Never raises (no reads)."""
    dirs: set[str] = set()
    for key in listing.keys:
        if not listing.free(key):
            continue
        parts = key.split("/")
        for i in range(len(parts) - 1):
            if _DIR_RE.match(parts[i]):
                dirs.add("/".join(parts[: i + 1]))
                break
    out: list[Candidate] = []
    partial: list[Partial] = []
    for d in sorted(dirs):
        step = int(_DIR_RE.match(d.rsplit("/", 1)[-1]).group(1))  # type: ignore[union-attr]
        files = set(listing.under(d))
        listing.claimed.add(d)
        if STATE_FILE not in files:
            partial.append(Partial(NAME, step, d, f"no {STATE_FILE} (the Trainer writes it last)"))
            continue
        out.append(Candidate(NAME, step, d, modified(listing.backend, f"{d}/{STATE_FILE}"),
                             _checker(listing, d, step, files)))
    return out, partial


def _checker(listing: Listing, d: str, step: int, files: set[str]) -> Check:
    def check() -> str | None:
        raw = read_small(listing.backend, f"{d}/{STATE_FILE}")
        if raw is None:
            return f"{STATE_FILE} vanished"
        try:
            state: Any = json.loads(raw.decode())
            global_step = int(state["global_step"])
        except (ValueError, KeyError, TypeError, UnicodeDecodeError) as exc:
            return f"{STATE_FILE} does not parse or has no global_step (truncated?): {type(exc).__name__}: {exc}"
        if global_step != step:
            return f"{STATE_FILE} says global_step {global_step}, the directory says {step}"
        return _weights_missing(listing, d, files)

    return check


def _weights_missing(listing: Listing, d: str, files: set[str]) -> str | None:
    if any(w in files for w in WEIGHT_FILES):
        return None
    for fsdp in sorted({f.split("/", 1)[0] for f in files if "/" in f}):
        if _FSDP_DIR_RE.match(fsdp):
            return None if f"{fsdp}/.metadata" in files else f"no {fsdp}/.metadata (FSDP sharded weights unfinished)"
    for index in INDEX_FILES:
        if index in files:
            raw = read_small(listing.backend, f"{d}/{index}")
            try:
                shards = set(dict(json.loads((raw or b"").decode())["weight_map"]).values())
            except (ValueError, KeyError, TypeError, UnicodeDecodeError) as exc:
                return f"{index} does not parse ({type(exc).__name__})"
            absent = sorted(str(s) for s in shards if s not in files)
            return f"no weight shard {absent[0]} (named by {index})" if absent else None
    return "no model weights (" + ", ".join((*WEIGHT_FILES[:2], *INDEX_FILES[:1])) + ")"
