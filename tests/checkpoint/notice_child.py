"""A tiny real-torch trainer (CPU) per framework, for tests/checkpoint/test_notice.py.

``python -m tests.checkpoint.notice_child FRAMEWORK ROOT GUARD``: FRAMEWORK is kfp | dcp | hf | lightning; ROOT the
checkpoint directory; GUARD "1" installs kfp-gpu's preemption handling for that framework, "0" none (what a plain
script does: SIGTERM kills it). Every completed optimizer step prints ``{"step": n}``; a periodic checkpoint is
written every PERIODIC steps. Each step sleeps STEP_S so the test can signal mid-run.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

PERIODIC = 5
STEP_S = 0.05
MAX_STEPS = 2000


def report(step: int) -> None:
    print(json.dumps({"step": step, "rank": int(os.environ.get("RANK", "0"))}), flush=True)


def kfp_or_dcp(root: str, guard_on: bool, dcp: bool) -> None:
    import torch

    from kfp_gpu.checkpoint import CheckpointStore, on_preemption, save_torch

    store = CheckpointStore(root)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    state = {"step": 0}

    def save() -> None:
        if dcp:  # what an FSDP script does: torch.distributed.checkpoint into one directory per save
            import torch.distributed.checkpoint as dcp_api
            from torch.distributed.checkpoint.state_dict import get_state_dict

            msd, osd = get_state_dict(model, opt)
            dcp_api.save({"model": msd, "optim": osd}, checkpoint_id=f"{root}/step_{state['step']}")
        else:
            save_torch(store, state["step"], model, opt)

    guard = on_preemption(save, 15.0) if guard_on else None
    for _ in range(MAX_STEPS):
        ctx: Any = guard.critical() if guard is not None else _null()
        with ctx:
            x = torch.randn(4, 8)
            loss = model(x).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            time.sleep(STEP_S)
            state["step"] += 1
            report(state["step"])
            if state["step"] % PERIODIC == 0:
                save()


class _null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *a: object) -> None:
        return None


def hf(root: str, guard_on: bool) -> None:
    import torch
    from transformers import Trainer, TrainerCallback, TrainingArguments

    from kfp_gpu.checkpoint.notice import hf_preemption_callback

    class Tiny(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(8, 1)

        def forward(self, x: Any, labels: Any = None) -> dict[str, Any]:
            out = self.lin(x)
            return {"loss": (out.squeeze(-1) - labels).pow(2).mean(), "logits": out}

    class Data(torch.utils.data.Dataset):  # type: ignore[type-arg]
        def __len__(self) -> int:
            return 100000

        def __getitem__(self, i: int) -> dict[str, Any]:
            return {"x": torch.randn(8), "labels": torch.tensor(0.0)}

    class Steps(TrainerCallback):  # type: ignore[misc]
        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> Any:
            time.sleep(STEP_S)
            report(int(state.global_step))
            return control

    callbacks: list[Any] = [Steps()]
    if guard_on:
        callbacks.append(hf_preemption_callback(15.0))
    dist = {"ddp_backend": "gloo"} if os.environ.get("WORLD_SIZE", "1") != "1" else {}
    args = TrainingArguments(output_dir=root, max_steps=MAX_STEPS, per_device_train_batch_size=4, save_steps=PERIODIC,
                             save_strategy="steps", report_to=[], logging_strategy="no", use_cpu=True,
                             dataloader_num_workers=0, disable_tqdm=True, **dist)
    Trainer(model=Tiny(), args=args, train_dataset=Data(), callbacks=callbacks).train()


def lightning(root: str, guard_on: bool) -> None:
    import pytorch_lightning as pl
    import torch

    from kfp_gpu.checkpoint.notice import lightning_preemption_callback

    class Tiny(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(8, 1)

        def training_step(self, batch: Any, idx: int) -> Any:
            return self.lin(batch).pow(2).mean()

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    class Steps(pl.Callback):
        def on_train_batch_end(self, trainer: Any, *a: Any) -> None:
            time.sleep(STEP_S)
            report(int(trainer.global_step))

    data = torch.utils.data.DataLoader(torch.randn(100000, 8), batch_size=4)
    callbacks: list[Any] = [Steps(), pl.callbacks.ModelCheckpoint(dirpath=root, every_n_train_steps=PERIODIC,
                                                                   save_top_k=-1)]
    if guard_on:
        callbacks.append(lightning_preemption_callback(root, 15.0))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    dist: dict[str, Any] = {"strategy": "ddp", "num_nodes": world, "devices": 1} if world > 1 else {}
    trainer = pl.Trainer(max_steps=MAX_STEPS, callbacks=callbacks, accelerator="cpu", logger=False,
                         enable_progress_bar=False, enable_model_summary=False, **dist)
    trainer.fit(Tiny(), data)


if __name__ == "__main__":
    framework, root, guard = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
    if framework in ("kfp", "dcp"):
        kfp_or_dcp(root, guard, framework == "dcp")
    elif framework == "hf":
        hf(root, guard)
    else:
        lightning(root, guard)
