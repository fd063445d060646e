"""A tiny causal character LM that checkpoints, resumes bit-exactly, and survives preemption.

Run as ``python -m pipelines.trainer.train_lm`` (what the example pipeline's PyTorchJob runs) or as a
script. CPU only, no downloads: the corpus is generated in code.

Determinism contract (tested in tests/trainer): by default the batch of step ``s`` is a pure function of
``(seed, s, rank)`` and there is no dropout; with ``--data-order rng --dropout P`` both the data order
and the dropout masks are drawn from each rank's torch RNG, whose state the checkpoint carries. A
checkpoint holds weights, optimizer state, RNG state and the loss curve so far. So a run killed at any
point and resumed from its newest complete checkpoint ends with bitwise-identical weights and an
identical loss curve to an uninterrupted run.

``--sharded`` saves through torch.distributed.checkpoint (DCP): every rank writes its shard, and the
checkpoint is committed only once every rank's part is in the store (kfp_gpu.checkpoint.dcp_io). The
emergency save on SIGTERM is then collective: the ranks agree on the step after which to save.

Progress goes to stdout as JSON lines (``{"event": "step", ...}``), one per step, flushed, so a launcher
or a test can follow it, and, per rank, to ``_progress/`` beside the checkpoints (kfp_gpu.checkpoint.progress,
throttled by ``KFP_GPU_PROGRESS_INTERVAL_S``), which the stall detector reads. Exit codes: 0 done, 143 preempted (emergency checkpoint saved), 2 bad arguments.
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

    def __init__(self, vocab: int, dim: int = 32, hidden: int = 64, layers: int = 2, dropout: float = 0.0) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.drop = nn.Dropout(dropout)
        self.rnn = nn.GRU(dim, hidden, num_layers=layers, batch_first=True)
        self.head = nn.Linear(hidden, vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.rnn(self.drop(self.embed(x)))
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


def batch_from_rng(data: torch.Tensor, batch: int, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch whose windows are drawn from the global torch RNG (its state is part of the checkpoint)."""
    starts = torch.randint(0, data.numel() - seq_len - 1, (batch,))
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
                   help="preemption grace period (15 GKE spot pods, 120 EKS spot; kfp_gpu.checkpoint.spot_grace_s)")
    p.add_argument("--step-sleep", type=float, default=0.0, help="sleep per step (demos and tests)")
    p.add_argument("--sharded", action="store_true",
                   help="save/load through torch.distributed.checkpoint, every rank writing its shard")
    p.add_argument("--fsdp", action="store_true",
                   help="with --sharded under torch.distributed: shard parameters with FSDP2 instead of DDP")
    p.add_argument("--dropout", type=float, default=0.0, help="dropout after the embedding")
    p.add_argument("--data-order", choices=("step", "rng"), default="step",
                   help="step: batch = f(seed, step, rank); rng: drawn from the rank's torch RNG")
    p.add_argument("--save-sleep", type=float, default=0.0,
                   help="sharded: sleep after this rank's files are written, before its manifest (tests)")
    p.add_argument("--no-rng-restore", action="store_true",
                   help="do not restore RNG state on resume (only to show that resume then diverges)")
    p.add_argument("--dataset", default=None, help="accepted for pipeline compatibility; the corpus is built in")
    args = p.parse_args(argv)
    if args.steps < 1 or args.checkpoint_every < 1 or args.keep < 1:
        p.error("--steps, --checkpoint-every and --keep must be >= 1")
    if args.fsdp and not args.sharded:
        p.error("--fsdp needs --sharded (FSDP parameters are saved shard by shard, through DCP)")
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
    if args.sharded and world > 1 and not distributed:
        print(f"error: --sharded with WORLD_SIZE={world} needs torch.distributed (gloo) and MASTER_ADDR; "
              "fix: run under torchrun or a PyTorchJob, or drop --sharded", file=sys.stderr)
        return 2
    hint = ckpt.resume_step_from_env()
    uri = args.checkpoint_uri or hint.uri
    store = ckpt.CheckpointStore(uri) if uri else None
    writer = rank == 0 or args.sharded  # sharded: every rank writes its part

    text = build_corpus()
    vocab = sorted(set(text))
    data = torch.tensor([vocab.index(c) for c in text], dtype=torch.long)
    torch.manual_seed(args.seed)
    random.seed(args.seed)
    lm = TinyLM(len(vocab), hidden=args.hidden, layers=args.layers, dropout=args.dropout)
    model: nn.Module = lm
    torch.manual_seed(args.seed + 7919 * (rank + 1))  # same init everywhere; per-rank dropout and data order
    config = {"seed": args.seed, "batch_size": args.batch_size, "seq_len": args.seq_len, "lr": args.lr,
              "hidden": args.hidden, "layers": args.layers, "vocab": len(vocab), "world_size": world,
              "dropout": args.dropout, "data_order": args.data_order, "sharded": args.sharded, "fsdp": args.fsdp}
    if distributed and args.fsdp:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (world,))
        for sub in (lm.embed, lm.head):
            fully_shard(sub, mesh=mesh)
        fully_shard(model, mesh=mesh)  # the GRU's parameters are in the root group
    elif distributed:
        from torch.nn.parallel import DistributedDataParallel

        model = DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)  # after FSDP's swap

    losses: list[float] = []
    resumes: list[int] = []
    start = 1
    resumed = None
    if store is not None and args.sharded:
        from kfp_gpu.checkpoint import dcp_io

        resumed = dcp_io.load_sharded(store, model, optimizer, restore_rng=not args.no_rng_restore)
    elif store is not None:
        resumed = ckpt.load_torch(store, model, optimizer, restore_rng=not args.no_rng_restore)
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

    state = {"step": start - 1, "saved": resumed.step if resumed else -1}
    guard: ckpt.PreemptionGuard | None = None

    def on_rank_written(attempt: str) -> None:
        emit("saving", step=state["step"], rank=rank, attempt=attempt)
        if args.save_sleep:
            time.sleep(args.save_sleep)

    def save(step: int) -> None:
        if store is None or not writer or state["saved"] == step:
            return
        extra = {"losses": losses[:step], "resumes": resumes}
        meta = {"config": config}
        if args.sharded:
            from kfp_gpu.checkpoint import dcp_io

            timeout = guard.remaining_s() if guard is not None else 60.0
            c = dcp_io.save_sharded(store, step, model, optimizer, extra, meta=meta, timeout_s=timeout,
                                    on_rank_written=on_rank_written)
        else:
            c = ckpt.save_torch(store, step, model, optimizer, extra, meta=meta)
        state["saved"] = step
        emit("checkpoint", step=step, uri=c.uri, rank=rank)
        if rank == 0:
            store.prune(keep=args.keep)

    def emergency() -> None:
        try:
            save(state["step"])
        finally:
            saved = state["step"] if state["saved"] == state["step"] and writer else None
            emit("preempted", saved_step=saved, rank=rank)

    agree = None
    if args.sharded and distributed:
        from kfp_gpu.checkpoint import dcp_io

        agree = dcp_io.any_rank  # every rank saves after the same step
    # Distributed: a peer preempted first breaks the all-reduce of the current step; the weights and
    # optimizer state are still those of the last completed step, so save them anyway.
    guard = ckpt.on_preemption(emergency, args.grace_s, save_on_error=distributed, agree=agree)
    # per-rank progress beside the checkpoints (kfp_gpu.checkpoint.progress): what the stall detector reads
    from kfp_gpu.checkpoint.progress import Progress

    progress = Progress.from_env(uri, rank)
    loss_fn = nn.CrossEntropyLoss()
    model.train()
    for step in range(start, args.steps + 1):
        with guard.critical():
            if args.data_order == "rng":
                x, y = batch_from_rng(data, args.batch_size, args.seq_len)
            else:
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
            progress.step(step)
            if step % args.checkpoint_every == 0 or step == args.steps:
                save(step)
            if args.step_sleep:
                time.sleep(args.step_sleep)
    progress.flush()  # the last step, if the throttle held it back

    with guard.critical():
        if distributed and args.fsdp:
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

            # Collective: the full (unsharded) weights, on rank 0 only.
            final = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        else:
            final = getattr(model, "module", model).state_dict()
        if rank == 0 and args.out:
            out = Path(args.out)
            out.mkdir(parents=True, exist_ok=True)
            torch.save(final, out / "model.pt")
            (out / "losses.json").write_text(json.dumps({
                "losses": losses, "steps": args.steps, "final_loss": losses[-1] if losses else None,
                "resumed_from": resumes, "config": config,
            }, indent=1))
        emit("done", steps=args.steps, final_loss=losses[-1] if losses else None, resumed_from=resumes,
             rank=rank)
    guard.uninstall()
    if distributed:
        import torch.distributed as dist

        # Every rank reaches the end before any tears down: a rank that destroys its gloo group and exits
        # while a peer is still saving or pruning leaves that peer's transport to fail at its own exit
        # (seen once in CI as SIGABRT, "terminate called without an active exception", on the later rank).
        dist.barrier()
        dist.destroy_process_group()
    return 0


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=os.environ.get("LOGLEVEL", "INFO"), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    code = train(parse_args(argv))
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        # Even after the barrier, rank 0 (the TCPStore's server) has aborted at interpreter exit once every file was
        # written ("terminate called without an active exception": a C++ thread still joinable in a static
        # destructor; CI on e5d0c6b). Nothing is left to run: flush and leave without the destructors.
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


if __name__ == "__main__":
    sys.exit(main())
