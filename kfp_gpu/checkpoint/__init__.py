"""Checkpoints for training scripts: atomic saves, verified resume, emergency save on preemption.

Stdlib only at import time; boto3 / google-cloud-storage / fsspec / torch are imported when used::

    from kfp_gpu.checkpoint import CheckpointStore, on_preemption, save_torch, load_torch

    store = CheckpointStore(os.environ["KFP_GPU_CHECKPOINT_URI"])   # path, file://, s3://, gs://
    resumed = load_torch(store, model, optimizer)                  # None on a fresh start
    guard = on_preemption(lambda: save_torch(store, step, model, optimizer), spot_grace_s("gke"))
    for step in range(start, steps):
        with guard.critical():                                     # SIGTERM waits for the step to end
            ...
"""

from __future__ import annotations

from kfp_gpu.checkpoint.backends import Backend, BlobNotFound, open_backend
from kfp_gpu.checkpoint.env import CHECKPOINT_URI_ENV, RESUME_STEP_ENV, ResumeHint, resume_step_from_env
from kfp_gpu.checkpoint.errors import (
    CheckpointCorrupt,
    CheckpointError,
    CheckpointNotFound,
    StorageError,
    StorageUnavailable,
)
from kfp_gpu.checkpoint.layout import MARKER, Checkpoint, Incomplete
from kfp_gpu.checkpoint.preemption import (
    AWS_SPOT_GRACE_S,
    DEFAULT_GRACE_S,
    EXIT_CODE_PREEMPTED,
    GCE_SPOT_GRACE_S,
    GKE_SPOT_GRACE_S,
    SPOT_GRACE_S,
    PreemptionGuard,
    on_preemption,
    spot_grace_s,
)
from kfp_gpu.checkpoint.probe import probe_writable
from kfp_gpu.checkpoint.store import CheckpointStore, PayloadWriter
from kfp_gpu.checkpoint.torch_io import TorchResume, load_torch, rng_state, save_torch, set_rng_state

__all__ = [
    "AWS_SPOT_GRACE_S",
    "Backend",
    "BlobNotFound",
    "CHECKPOINT_URI_ENV",
    "Checkpoint",
    "CheckpointCorrupt",
    "CheckpointError",
    "CheckpointNotFound",
    "CheckpointStore",
    "DEFAULT_GRACE_S",
    "EXIT_CODE_PREEMPTED",
    "GCE_SPOT_GRACE_S",
    "GKE_SPOT_GRACE_S",
    "SPOT_GRACE_S",
    "Incomplete",
    "MARKER",
    "PayloadWriter",
    "PreemptionGuard",
    "RESUME_STEP_ENV",
    "ResumeHint",
    "StorageError",
    "StorageUnavailable",
    "TorchResume",
    "load_torch",
    "on_preemption",
    "open_backend",
    "probe_writable",
    "resume_step_from_env",
    "rng_state",
    "save_torch",
    "set_rng_state",
    "spot_grace_s",
]
