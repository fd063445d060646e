"""A checkpoint on every preemption notice, for the Hugging Face Trainer and Lightning (docs/checkpointing.md).

kfp-gpu's own format and DCP/FSDP use :func:`kfp_gpu.checkpoint.on_preemption` around the training step. A
framework that owns the loop gets a callback instead; each one line::

    trainer = Trainer(..., callbacks=[hf_preemption_callback(spot_grace_s("gke"))])          # transformers
    trainer = L.Trainer(..., callbacks=[lightning_preemption_callback(ckpt_dir, spot_grace_s("gke"))])

On SIGTERM (the kubelet's, at the node's shutdown notice) nothing is interrupted: the signal is noted
(:class:`~kfp_gpu.checkpoint.preemption.PreemptionGuard` with ``poll_only``; its watchdog exits 143 just before the
grace ends, whatever happens). At the end of the step in flight the framework saves its own full checkpoint (the HF
Trainer's ``checkpoint-<step>/`` through ``control.should_save``; Lightning's ``trainer.save_checkpoint`` into
``epoch=<e>-step=<s>.ckpt``), which kfp-gpu's resume readers recognise, then the process exits 143 (preempted, not
failed). Under torch.distributed the ranks agree at every step end (:func:`kfp_gpu.checkpoint.dcp_io.any_rank`), so
all save after the same step, as the collective saves need, though the kubelet signals only the preempted node.

The steps lost per notice are the ones in flight when the signal comes (at most the step being computed when the
save happens at its end; 0 completed steps), provided a step plus the save fit the grace: GKE gives a non-system pod
15 s, AWS 2 minutes (:func:`~kfp_gpu.checkpoint.preemption.spot_grace_s`). The frameworks are imported when a
callback is made, never by ``import kfp_gpu.checkpoint``.
"""

from __future__ import annotations

import logging
import os
import signal
from typing import Any

from kfp_gpu.checkpoint.preemption import DEFAULT_GRACE_S, EXIT_CODE_PREEMPTED, PreemptionGuard, _flush

log = logging.getLogger("kfp_gpu.checkpoint")


class _Notice:
    """The signal flag, its watchdog, and the per-step agreement of the ranks."""

    def __init__(self, grace_s: float, exit_code: int | None) -> None:
        if grace_s <= 0:
            raise ValueError(f"grace_s must be > 0, got {grace_s}")
        self.guard = PreemptionGuard(lambda: None, grace_s, exit_code=exit_code, signals=(signal.SIGTERM,),
                                     poll_only=True)
        self.exit_code = exit_code
        self.saved_step: int | None = None
        self.installed = False

    def install(self) -> None:
        if not self.installed:
            self.guard.install()
            self.installed = True

    def uninstall(self) -> None:
        if self.installed:
            self.guard.uninstall()
            self.installed = False

    def due(self) -> bool:
        """At a step end: did any rank get the notice? (Collective under torch.distributed.)"""
        from kfp_gpu.checkpoint.dcp_io import any_rank

        return any_rank(self.guard.requested) if _distributed() else self.guard.requested

    def done(self, step: int) -> None:
        """The emergency checkpoint of ``step`` is written: exit 143 (unless ``exit_code`` is None)."""
        self.saved_step = step
        log.warning("emergency checkpoint of step %d saved; exiting %s", step, self.exit_code)
        if self.exit_code is not None:
            _flush()
            raise SystemExit(self.exit_code)


def _distributed() -> bool:
    if "WORLD_SIZE" not in os.environ or os.environ.get("WORLD_SIZE") == "1":
        return False
    try:
        import torch.distributed as dist
    except ImportError:
        return False
    return bool(dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1)


def hf_preemption_callback(grace_s: float = DEFAULT_GRACE_S, *, exit_code: int | None = EXIT_CODE_PREEMPTED) -> Any:
    """A ``transformers.TrainerCallback``: on SIGTERM, the Trainer saves ``checkpoint-<step>`` after the step in
    flight, then the process exits ``exit_code``. Raises: ImportError (transformers not installed), ValueError
    (``grace_s`` <= 0)."""
    from transformers import TrainerCallback

    notice = _Notice(grace_s, exit_code)

    class KfpGpuPreemption(TrainerCallback):  # type: ignore[misc,unused-ignore]
        state = notice

        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
            notice.install()
            return control

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
            if notice.due():
                control.should_save = True
                control.should_training_stop = True
                self.stopping = int(state.global_step)
            return control

        def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
            if getattr(self, "stopping", None) is not None:
                notice.done(int(state.global_step))
            return control

        def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
            notice.uninstall()
            return control

    return KfpGpuPreemption()


def lightning_preemption_callback(dirpath: str, grace_s: float = DEFAULT_GRACE_S, *,
                                  exit_code: int | None = EXIT_CODE_PREEMPTED) -> Any:
    """A Lightning ``Callback``: on SIGTERM, ``trainer.save_checkpoint(<dirpath>/epoch=<e>-step=<s>.ckpt)`` after
    the batch in flight, then the process exits ``exit_code``. ``dirpath``: where the run's ``ModelCheckpoint``
    writes (under the checkpoint URI). Raises: ImportError (neither ``lightning`` nor ``pytorch_lightning``),
    ValueError (``grace_s`` <= 0)."""
    try:
        from lightning.pytorch import Callback
    except ImportError:
        from pytorch_lightning import Callback

    notice = _Notice(grace_s, exit_code)

    class KfpGpuPreemption(Callback):  # type: ignore[misc,unused-ignore]
        state = notice

        def on_train_start(self, trainer: Any, pl_module: Any) -> None:
            notice.install()  # after Lightning's own SIGTERM handler (its signal connector), so this one is called

        def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
            if notice.due():
                step = int(trainer.global_step)
                trainer.save_checkpoint(f"{dirpath.rstrip('/')}/epoch={trainer.current_epoch}-step={step}.ckpt")
                notice.done(step)

        def on_train_end(self, trainer: Any, pl_module: Any) -> None:
            notice.uninstall()

    return KfpGpuPreemption()
