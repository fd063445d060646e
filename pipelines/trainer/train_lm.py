"""A tiny causal character LM that checkpoints, resumes bit-exactly, and survives preemption.

Run as ``python -m pipelines.trainer.train_lm`` (what the example pipeline's PyTorchJob runs) or as a
script. CPU only, no downloads: the corpus is generated in code.

Determinism contract (tested in tests/trainer): the batch of step ``s`` is a pure function of
``(seed, s, rank)``, there is no dropout, and a checkpoint holds weights, optimizer state, RNG state
and the loss curve so far. So a run killed at any point and resumed from its newest complete checkpoint
ends with bitwise-identical weights and an identical loss curve to an uninterrupted run.

Progress goes to stdout as JSON lines (``{"event": "step", ...}``), one per step, flushed, so a launcher
or a test can follow it. Exit codes: 0 done, 143 preempted (emergency checkpoint saved), 2 bad arguments.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

try:
    import kfp_gpu.checkpoint as ckpt
except ImportError:  # run as a plain script from a checkout without the package installed
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    import kfp_gpu.checkpoint as ckpt

import torch
from torch import nn

log = logging.getLogger("train_lm")

_SUBJECTS = ["the cat", "a dog", "the model", "my gpu", "the node", "a spot vm", "the pod", "our job"]
_VERBS = ["sees", "trains", "saves", "loads", "waits for", "preempts", "resumes", "scales"]
_OBJECTS = ["the checkpoint", "a batch", "the quota", "some capacity", "the gradient", "a warm pool"]
_ENDINGS = [".", " again.", " quickly.", " at dawn.", " twice.", " in us-central1."]


def build_corpus(sentences: int = 600, seed: int = 1234) -> str:
    """A deterministic toy corpus (same text on every machine and Python version)."""
    rng = random.Random(seed)
    return " ".join(
        f"{rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} {rng.choice(_OBJECTS)}{rng.choice(_ENDINGS)}"
        for _ in range(sentences)
    )


class TinyLM(nn.Module):
    """Embedding -> 2-layer GRU -> linear head. No dropout, so the forward pass is deterministic."""

    def __init__(self, vocab: int, dim: int = 32, hidden: int = 64, layers: int = 2) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.rnn = nn.GRU(dim, hidden, num_layers=layers, batch_first=True)
        self.head = nn.Linear(hidden, vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.rnn(self.embed(x))
        logits: torch.Tensor = self.head(out)
        return logits


def batch_for_step(data: torch.Tensor, step: int, seed: int, batch: int, seq_len: int,
                   rank: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """The (inputs, targets) of ``step`` on ``rank``: a pure function of its arguments."""
    gen = torch.Generator().manual_seed((seed * 1_000_003 + step) * 131 + rank)
    starts = torch.randint(0, data.numel() - seq_len - 1, (batch,), generator=gen)
    idx = starts[:, None] + torch.arange(seq_len + 1)[None, :]
    window = data[idx]
    return window[:, :-1], window[:, 1:]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=60, help="total optimizer steps")
    p.add_argument("--checkpoint-uri", default=None,
                   help=f"path, file://, s3:// or gs:// (default: ${ckpt.CHECKPOINT_URI_ENV}; none = no checkpoints)")
    p.add_argument("--checkpoint-every", type=int, default=10, help="steps between checkpoints")
    p.add_argument("--keep", type=int, default=3, help="complete checkpoints to keep")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="directory for model.pt and losses.json (rank 0)")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=32)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--hidden", type=int, default=64, help="GRU hidden size")
    p.add_argument("--layers", type=int, default=2, help="GRU layers")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads (fixed for reproducibility)")
    p.add_argument("--grace-s", type=float, default=ckpt.DEFAULT_GRACE_S,
                   help="preemption grace period (30 GCE spot, 120 AWS spot)")
    p.add_argument("--step-sleep", type=float, default=0.0, help="sleep per step (demos and tests)")
    p.add_argument("--dataset", default=None, help="accepted for pipeline compatibility; the corpus is built in")
    args = p.parse_args(argv)
    if args.steps < 1 or args.checkpoint_every < 1 or args.keep < 1:
        p.error("--steps, --checkpoint-every and --keep must be >= 1")
    return args


def emit(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, **fields}, sort_keys=True), flush=True)


def init_distributed() -> tuple[int, int, bool]:
    """(rank, world_size, distributed). PyTorchJob sets RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT."""
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return 0, 1, False
    import torch.distributed as dist

    if dist.is_available() and dist.is_gloo_available() and os.environ.get("MASTER_ADDR"):
        dist.init_process_group("gloo", rank=rank, world_size=world)
        return rank, world, True
    log.warning("WORLD_SIZE=%d but torch.distributed/MASTER_ADDR unavailable: rank %d trains alone "
                "and only rank 0 writes checkpoints", world, rank)
    return rank, world, False


def train(args: argparse.Namespace) -> int:
    torch.set_num_threads(args.threads)
    # CPU kernels with a fixed thread count are deterministic; torch.use_deterministic_algorithms()
    # is not needed for that and costs ~1.5 s of imports (it pulls in torch._inductor).
    rank, world, distributed = init_distributed()
    hint = ckpt.resume_step_from_env()
    uri = args.checkpoint_uri or hint.uri
    store = ckpt.CheckpointStore(uri) if uri else None
    writer = rank == 0

    text = build_corpus()
    vocab = sorted(set(text))
    data = torch.tensor([vocab.index(c) for c in text], dtype=torch.long)
    torch.manual_seed(args.seed)
    random.seed(args.seed)
    model: nn.Module = TinyLM(len(vocab), hidden=args.hidden, layers=args.layers)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    config = {"seed": args.seed, "batch_size": args.batch_size, "seq_len": args.seq_len, "lr": args.lr,
              "hidden": args.hidden, "layers": args.layers, "vocab": len(vocab), "world_size": world}

    losses: list[float] = []
    resumes: list[int] = []
    start = 1
    resumed = ckpt.load_torch(store, model, optimizer) if store else None
    if resumed is not None:
        extra = dict(resumed.extra or {})
        losses = [float(x) for x in extra.get("losses", [])][: resumed.step]
        resumes = [int(x) for x in extra.get("resumes", [])] + [resumed.step]
        start = resumed.step + 1
        if dict(resumed.checkpoint.meta.get("config", {})) != config:
            log.warning("checkpoint config %s differs from this run's %s", resumed.checkpoint.meta.get("config"),
                        config)
        emit("resume", step=resumed.step, checkpoint=resumed.checkpoint.uri, rank=rank)
    if hint.step is not None and hint.step != (resumed.step if resumed else None):
        log.warning("launcher said resume from step %s; newest complete checkpoint is %s", hint.step,
                    resumed.step if resumed else None)
    if distributed:
        from torch.nn.parallel import DistributedDataParallel

        model = DistributedDataParallel(model)

    state = {"step": start - 1, "saved": resumed.step if resumed else -1}

    def save(step: int) -> None:
        if store is None or not writer or state["saved"] == step:
            return
        extra = {"losses": losses[:step], "resumes": resumes}
        c = ckpt.save_torch(store, step, model, optimizer, extra, meta={"config": config})
        state["saved"] = step
        emit("checkpoint", step=step, uri=c.uri)
        store.prune(keep=args.keep)

    def emergency() -> None:
        save(state["step"])
        emit("preempted", saved_step=state["step"] if (store and writer) else None, rank=rank)

    # Distributed: a peer preempted first breaks the all-reduce of the current step; the weights and
    # optimizer state are still those of the last completed step, so save them anyway.
    guard = ckpt.on_preemption(emergency, args.grace_s, save_on_error=distributed)
    loss_fn = nn.CrossEntropyLoss()
    model.train()
    for step in range(start, args.steps + 1):
        with guard.critical():
            x, y = batch_for_step(data, step, args.seed, args.batch_size, args.seq_len, rank)
            logits = model(x)
            loss = loss_fn(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            losses.append(float(loss.item()))
            state["step"] = step
            emit("step", step=step, loss=losses[-1], rank=rank)
            if step % args.checkpoint_every == 0 or step == args.steps:
                save(step)
            if args.step_sleep:
                time.sleep(args.step_sleep)

    with guard.critical():
        if writer and args.out:
            out = Path(args.out)
            out.mkdir(parents=True, exist_ok=True)
            torch.save(getattr(model, "module", model).state_dict(), out / "model.pt")
            (out / "losses.json").write_text(json.dumps({
                "losses": losses, "steps": args.steps, "final_loss": losses[-1] if losses else None,
                "resumed_from": resumes, "config": config,
            }, indent=1))
        emit("done", steps=args.steps, final_loss=losses[-1] if losses else None, resumed_from=resumes,
             rank=rank)
    guard.uninstall()
    if distributed:
        import torch.distributed as dist

        dist.destroy_process_group()
    return 0


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=os.environ.get("LOGLEVEL", "INFO"), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return train(parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
