"""EKS capacity provider (boto3, imported lazily inside this package only)."""

from __future__ import annotations

from kfp_gpu.providers.eks.errors import ERROR_TABLE, classify
from kfp_gpu.providers.eks.provider import FAIL_FAST, EksProvider

__all__ = ["ERROR_TABLE", "FAIL_FAST", "EksProvider", "classify"]
