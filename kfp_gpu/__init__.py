"""kfp-gpu: latency-aware GPU provisioning as Kubeflow Pipelines DAG steps.

Public API (imported lazily, so ``import kfp_gpu.checkpoint`` in a training image needs no kfp)::

    from kfp_gpu import ProvisioningSpec, provisioned, train
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

_LAZY = {
    "provisioned": "kfp_gpu.dsl",
    "train": "kfp_gpu.dsl",
    "JobTemplate": "kfp_gpu.dsl",
    "ProvisioningSpec": "kfp_gpu.spec",
    "Target": "kfp_gpu.spec",
    "TargetKind": "kfp_gpu.spec",
    "CapacityType": "kfp_gpu.spec",
    "WarmPool": "kfp_gpu.spec",
    "Recovery": "kfp_gpu.spec",
    "CostInputs": "kfp_gpu.spec",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'kfp_gpu' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
