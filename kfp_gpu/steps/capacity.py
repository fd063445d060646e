"""Re-export of :mod:`kfp_gpu.cluster.capacity` (the scale-up -> train contract lives below the steps, so
cluster modules can use it without importing :mod:`kfp_gpu.steps`)."""

from kfp_gpu.cluster.capacity import GPU_TAINT_KEY, Capacity, Placement

__all__ = ["GPU_TAINT_KEY", "Capacity", "Placement"]
