"""Progress callbacks for the Hugging Face Trainer and for Lightning: three lines per framework (docs/stalls.md).

Hugging Face::

    from kfp_gpu.checkpoint.callbacks import hf_progress_callback
    trainer = Trainer(..., callbacks=[hf_progress_callback()])

Lightning::

    from kfp_gpu.checkpoint.callbacks import lightning_progress_callback
    trainer = L.Trainer(..., callbacks=[lightning_progress_callback()])

Both report the optimizer step (``state.global_step`` / ``trainer.global_step``) once per optimizer step (gradient
accumulation calls them per micro-batch with the same step: only a new step is reported, so the step time is the
optimizer step's). When training ends, both flush the step the throttle held back. The frameworks are imported
when a callback is made, never by ``import kfp_gpu.checkpoint``.
"""

from __future__ import annotations

from typing import Any

from kfp_gpu.checkpoint.progress import Progress


class _OnNewStep:
    """Report ``step`` to ``progress`` only when it is a new optimizer step."""

    def __init__(self, progress: Progress | None) -> None:
        self.progress = progress if progress is not None else Progress.from_env()
        self.seen: int | None = None

    def __call__(self, step: int) -> None:
        if step != self.seen:
            self.seen = step
            self.progress.step(step)


def hf_progress_callback(progress: Progress | None = None) -> Any:
    """A ``transformers.TrainerCallback`` whose ``on_step_end`` reports ``state.global_step``.
    ``progress`` defaults to :meth:`Progress.from_env` (``KFP_GPU_CHECKPOINT_URI``, ``RANK``).
    Raises: ImportError when transformers is not installed."""
    from transformers import TrainerCallback

    hook = _OnNewStep(progress)

    class KfpGpuProgress(TrainerCallback):  # type: ignore[misc,unused-ignore]
        progress = hook.progress

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
            hook(int(state.global_step))
            return control

        def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
            hook.progress.flush()
            return control

    return KfpGpuProgress()


def lightning_progress_callback(progress: Progress | None = None) -> Any:
    """A Lightning ``Callback`` whose ``on_train_batch_end`` reports ``trainer.global_step`` (``lightning`` 2.x, or
    the older ``pytorch_lightning`` package). Raises: ImportError when neither is installed."""
    try:
        from lightning.pytorch import Callback
    except ImportError:
        from pytorch_lightning import Callback

    hook = _OnNewStep(progress)

    class KfpGpuProgress(Callback):  # type: ignore[misc,unused-ignore]
        progress = hook.progress

        def on_train_start(self, trainer: Any, pl_module: Any) -> None:
            # the step training starts from (0, or the resumed step) is no progress: with gradient accumulation
            # the first batches end before the first optimizer step, at this same global_step
            hook.seen = int(trainer.global_step)

        def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
            hook(int(trainer.global_step))

        def on_train_end(self, trainer: Any, pl_module: Any) -> None:
            hook.progress.flush()

    return KfpGpuProgress()
