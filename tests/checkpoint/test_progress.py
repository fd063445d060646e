"""The per-rank progress API beside the checkpoints (kfp_gpu.checkpoint.progress), its framework callbacks, and
the supervisor's reader (kfp_gpu.steps.stall_watch): local store, injected clocks, no sleeps."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kfp_gpu.checkpoint import progress
from kfp_gpu.checkpoint.backends import LocalBackend
from kfp_gpu.checkpoint.callbacks import hf_progress_callback, lightning_progress_callback
from kfp_gpu.checkpoint.resume import find
from kfp_gpu.plan.stall import StallPolicy, State
from kfp_gpu.steps.stall_watch import StallWatch, policy_for


class Clock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_each_rank_overwrites_one_small_object_and_the_reader_lists_the_prefix(tmp_path: Path) -> None:
    be = LocalBackend(tmp_path)
    clock = Clock()
    reporters = [progress.Progress(be, r, min_interval_s=0.0, clock=clock, node=f"n{r}") for r in range(3)]
    for step in range(1, 6):
        clock.t += 2.0
        for p in reporters:
            p.step(step)
    assert sorted(be.list(progress.PREFIX)) == [f"_progress/rank-0000{r}.json" for r in range(3)]
    recs = progress.read(be)
    assert {r: (x.step, x.step_time_s, x.node) for r, x in recs.items()} == {r: (5, 2.0, f"n{r}") for r in range(3)}
    assert all(len(be.get(progress.key_for(r))) < 200 for r in range(3))
    progress.clear(be)
    assert progress.read(be) == {}


class Timers:
    """A virtual-time :data:`progress.Schedule`: ``advance(s)`` moves ``clock`` and fires what fell due, in order."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.due: list[list[Any]] = []  # [when, order, fn]
        self.n = 0

    def __call__(self, delay_s: float, fn: Any) -> Any:
        self.n += 1
        entry = [self.clock.t + delay_s, self.n, fn]
        self.due.append(entry)

        def cancel() -> None:
            if entry in self.due:
                self.due.remove(entry)
        return cancel

    def advance(self, s: float) -> None:
        end = self.clock.t + s
        while self.due and min(self.due)[0] <= end:
            entry = min(self.due)
            self.due.remove(entry)
            self.clock.t = entry[0]
            entry[2]()
        self.clock.t = end


def test_writes_are_throttled_but_the_first_step_is_written(tmp_path: Path) -> None:
    be = LocalBackend(tmp_path)
    clock = Clock()
    timers = Timers(clock)
    p = progress.Progress(be, 0, min_interval_s=10.0, clock=clock, schedule=timers)
    written = []
    for step in range(1, 31):
        timers.advance(1.0)
        p.step(step)
        written.append(progress.read(be)[0].step)
    # step 1 at t+1; steps 2-10 are held back; the trailing write at t+11 stores the newest of them (10), and so on
    assert (written[0], written[9], written[10], written[19], written[20], written[-1]) == (1, 1, 10, 10, 20, 20)
    assert len(timers.due) == 1  # steps held back since: one timer, not one per step
    assert p.last is not None and p.last.step == 30  # the newest is always known to the reporter


def test_a_step_held_back_by_the_throttle_is_written_when_no_step_follows(tmp_path: Path) -> None:
    """A rank that finishes step 7 inside the interval and then hangs in the next collective: its trailing write
    stores step 7 with the time it was done (the old throttle dropped it, and the store said step 1 for ever)."""
    be = LocalBackend(tmp_path)
    clock = Clock()
    timers = Timers(clock)
    p = progress.Progress(be, 0, min_interval_s=10.0, clock=clock, schedule=timers)
    for step in range(1, 8):
        timers.advance(1.0)
        p.step(step)
    assert progress.read(be)[0].step == 1
    done_at = clock.t
    timers.advance(3.9)  # 1 + 10 = 11 s: not due yet
    assert progress.read(be)[0].step == 1
    timers.advance(0.2)
    rec = progress.read(be)[0]
    assert (rec.step, rec.at) == (7, done_at)
    timers.advance(60.0)
    assert progress.read(be)[0].step == 7 and timers.due == []  # nothing more to write, no timer left


def test_flush_writes_the_held_back_step_at_once_and_cancels_its_timer(tmp_path: Path) -> None:
    be = LocalBackend(tmp_path)
    clock = Clock()
    timers = Timers(clock)
    p = progress.Progress(be, 0, min_interval_s=10.0, clock=clock, schedule=timers)
    p.step(1)
    timers.advance(1.0)
    p.step(2)
    assert progress.read(be)[0].step == 1 and len(timers.due) == 1
    assert p.flush() is True
    assert progress.read(be)[0].step == 2 and timers.due == []
    assert p.flush() is False  # nothing held back


def test_the_step_time_follows_a_slowdown(tmp_path: Path) -> None:
    clock = Clock()
    p = progress.Progress(LocalBackend(tmp_path), 0, min_interval_s=0.0, clock=clock)
    for step in range(1, 40):
        clock.t += 1.0 if step < 20 else 3.0
        p.step(step)
    assert p.last is not None and p.last.step_time_s is not None and 2.9 < p.last.step_time_s <= 3.0


def test_no_store_means_no_op_and_a_failing_store_never_stops_training(tmp_path: Path) -> None:
    assert progress.Progress.from_env(environ={}).report(1, 1.0) is False
    blocker = tmp_path / "file"
    blocker.write_text("x")
    p = progress.Progress(LocalBackend(blocker), 0, min_interval_s=0.0)  # a "directory" that is a file
    assert p.report(1, 1.0) is False


def test_from_env_reads_the_checkpoint_uri_rank_and_interval(tmp_path: Path) -> None:
    p = progress.Progress.from_env(environ={"KFP_GPU_CHECKPOINT_URI": str(tmp_path), "RANK": "3",
                                            "KFP_GPU_PROGRESS_INTERVAL_S": "0.5", "NODE_NAME": "gpu-7"})
    assert (p.rank, p.min_interval_s, p.node) == (3, 0.5, "gpu-7")
    assert p.report(9, 1.5)
    assert progress.read(LocalBackend(tmp_path))[3].step == 9
    assert progress.interval_from_env({"KFP_GPU_PROGRESS_INTERVAL_S": "soon"}) == progress.DEFAULT_INTERVAL_S


def test_progress_objects_are_not_mistaken_for_checkpoints(tmp_path: Path) -> None:
    be = LocalBackend(tmp_path)
    progress.Progress(be, 0, min_interval_s=0.0).report(5, 1.0)
    assert find(str(tmp_path)) is None


def test_hugging_face_trainer_reports_each_optimizer_step(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")

    class Tiny(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(2, 1)

        def forward(self, x: Any, labels: Any) -> dict[str, Any]:
            return {"loss": torch.nn.functional.mse_loss(self.lin(x).squeeze(-1), labels)}

    data = [{"x": torch.tensor([float(i), 1.0]), "labels": torch.tensor(float(i))} for i in range(16)]
    be = LocalBackend(tmp_path / "ckpt")
    p = progress.Progress(be, 0, min_interval_s=0.0)
    args = transformers.TrainingArguments(output_dir=str(tmp_path / "out"), max_steps=4, per_device_train_batch_size=2,
                                          gradient_accumulation_steps=2, report_to=[], save_strategy="no",
                                          use_cpu=True, logging_strategy="no", disable_tqdm=True)
    trainer = transformers.Trainer(model=Tiny(), args=args, train_dataset=data, callbacks=[hf_progress_callback(p)])
    trainer.train()
    assert progress.read(be)[0].step == 4


def test_lightning_callback_reports_only_new_optimizer_steps(tmp_path: Path) -> None:
    # the real pytorch_lightning Trainer (make venv-torch installs it), on CPU: 8 batches with gradient
    # accumulation 2 are 4 optimizer steps, and each new step is one report, in order
    torch = pytest.importorskip("torch")
    pl = pytest.importorskip("pytorch_lightning")

    class Tiny(pl.LightningModule):  # type: ignore[misc,name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(2, 1)

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            x, y = batch
            return torch.nn.functional.mse_loss(self.lin(x).squeeze(-1), y)

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    data = torch.utils.data.TensorDataset(torch.randn(16, 2), torch.randn(16))
    be = LocalBackend(tmp_path / "ckpt")
    seen: list[int] = []

    class Recorded(progress.Progress):
        def step(self, step: int) -> None:
            seen.append(step)
            super().step(step)

    p = Recorded(be, 0, min_interval_s=0.0)
    trainer = pl.Trainer(max_epochs=1, accumulate_grad_batches=2, accelerator="cpu", devices=1, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         default_root_dir=str(tmp_path / "out"), callbacks=[lightning_progress_callback(p)])
    trainer.fit(Tiny(), torch.utils.data.DataLoader(data, batch_size=2))
    assert trainer.global_step == 4
    assert seen == [1, 2, 3, 4] and progress.read(be)[0].step == 4


def test_the_stall_watch_detects_a_rank_that_stops_writing(tmp_path: Path) -> None:
    be = LocalBackend(tmp_path)
    clock = Clock()
    progress.Progress(be, 1, min_interval_s=0.0, clock=clock).report(99, 9.0)  # an old attempt's record
    w = StallWatch(str(tmp_path), 2, StallPolicy(floor_s=5.0, multiple=3.0), backend=be, clock=clock)
    w.begin()  # clears the old attempt's progress
    ranks = [progress.Progress(be, r, min_interval_s=0.0, clock=clock) for r in (0, 1)]
    for step in range(1, 11):
        clock.t += 1.0
        for p in ranks:
            p.step(step)
        assert w.poll().state is State.HEALTHY
    for step in range(11, 20):  # rank 1 hangs; rank 0 reports one more step, then blocks in the collective
        clock.t += 1.0
        if step == 11:
            ranks[0].step(step)
        a = w.poll()
    assert a.state is State.STALLED and a.first_stopped == (1,) and a.timeout_s == 5.0


def test_the_spec_knobs_make_the_policy_in_world_time() -> None:
    from kfp_gpu.spec import ProvisioningSpec

    spec = ProvisioningSpec(accelerator="nvidia-h100-80gb", nodes=2, stall_timeout=240, straggler_window_s=600)
    pol = policy_for(spec, scale=120.0)
    assert (pol.timeout_s, pol.window_s, pol.floor_s) == (2.0, 5.0, 1.0)
    assert policy_for(ProvisioningSpec(accelerator="nvidia-h100-80gb", nodes=2)).timeout_s is None


def test_the_stall_watch_takes_a_sample_per_change_of_the_trainer_status(tmp_path: Path) -> None:
    from kfp_gpu.plan.stall import TrainerStatus

    clock = Clock()
    w = StallWatch(str(tmp_path), 2, StallPolicy(floor_s=5.0), backend=LocalBackend(tmp_path), clock=clock)
    w.begin()
    for t, pct in ((1.0, 10), (2.0, 10), (3.0, 11)):
        clock.t += 1.0
        w.observe_trainer_status(TrainerStatus(pct, None, f"2026-12-05T06:00:0{int(t)}Z" if pct == 11 else "x"),
                                 clock.t)
    assert [s.at for s in w.gang] == [1001.0, 1003.0]
    clock.t += 6.0
    a = w.poll()
    assert a.state is State.STALLED and "trainerStatus" in a.reason
