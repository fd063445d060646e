"""Re-export of :func:`kfp_gpu.retry.retry_transient` (the one retry loop lives in :mod:`kfp_gpu.retry`)."""

from kfp_gpu.retry import retry_transient

__all__ = ["retry_transient"]
