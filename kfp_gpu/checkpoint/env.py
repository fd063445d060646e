"""What the launcher tells a training process through its environment.

The kfp-gpu train step sets these in the PyTorchJob's pod template:

- ``KFP_GPU_CHECKPOINT_URI``: where checkpoints live (path, ``file://``, ``s3://``, ``gs://``).
- ``KFP_GPU_RESUME_STEP``: the step of the newest complete checkpoint the launcher saw when it
  (re)started the job, or empty on a fresh start. Advisory: the store itself is the source of truth,
  so a trainer resumes from :meth:`CheckpointStore.latest` and only warns when the two disagree.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from kfp_gpu.errors import InvalidSpec

CHECKPOINT_URI_ENV = "KFP_GPU_CHECKPOINT_URI"
RESUME_STEP_ENV = "KFP_GPU_RESUME_STEP"


@dataclass(frozen=True)
class ResumeHint:
    """``uri`` and ``step`` are None when the variable is unset or empty."""

    uri: str | None
    step: int | None


def resume_step_from_env(environ: Mapping[str, str] | None = None) -> ResumeHint:
    """Read ``KFP_GPU_CHECKPOINT_URI`` and ``KFP_GPU_RESUME_STEP`` (from ``os.environ`` by default).

    Raises: InvalidSpec when ``KFP_GPU_RESUME_STEP`` is set but is not a non-negative integer.
    """
    env = os.environ if environ is None else environ
    uri = (env.get(CHECKPOINT_URI_ENV) or "").strip() or None
    raw = (env.get(RESUME_STEP_ENV) or "").strip()
    step: int | None = None
    if raw:
        try:
            step = int(raw)
        except ValueError:
            step = -1
        if step < 0:
            raise InvalidSpec(
                RESUME_STEP_ENV, raw, "must be a non-negative integer step or empty",
                remediation=f"unset {RESUME_STEP_ENV} to resume from the newest complete checkpoint",
            )
    return ResumeHint(uri=uri, step=step)
