"""What every step returns: a JSON output for the next step, metrics, and a report.

A step measures its durations on the clock of the process it runs in. A local rehearsal compresses that clock
(:func:`kfp_gpu.rehearsal_seam.world_time_scale` real-world seconds per second), so the metrics a step emits are put
in the world's clock in one place, :func:`in_world_time` (called by :func:`kfp_gpu.steps.entry.run_step`), from the
declared set :data:`WALL_CLOCK_METRICS`. On a real cluster the factor is 1.0 and nothing changes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

# The metrics a step measures on its own clock: elapsed seconds and GPU-hours used. Counts, ratios, step numbers and
# losses are never here. Teardown's cost metrics (``*_ready_s``, ``*_gpu_hours``, ``*_usd``...) are not either: they
# are computed from the run's timeline already in the world's clock (:func:`kfp_gpu.report._common.world`).
WALL_CLOCK_METRICS: frozenset[str] = frozenset({
    "preflight_seconds", "check_capacity_seconds",  # quota_preflight
    "warm_pool_seconds",  # reserve_warm_pool
    "scale_up_seconds", "p50_node_ready_seconds", "max_node_ready_seconds",  # burst_scale_up
    "wall_s", "gpu_hours", "preemption_detect_latency_max_s", "queue_wait_s",  # train
})


@dataclass
class StepResult:
    output_json: str
    metrics: dict[str, float] = field(default_factory=dict)
    markdown: str = ""  # terminal/markdown report
    html: str = ""  # full self-contained HTML page; built from markdown when empty


def world_metrics(metrics: Mapping[str, float], scale: float) -> dict[str, float]:
    """``metrics`` with every :data:`WALL_CLOCK_METRICS` value multiplied by ``scale`` (real-world seconds per
    second of the clock they were measured on); every other metric as it is."""
    return {k: float(v) * scale if k in WALL_CLOCK_METRICS else float(v) for k, v in metrics.items()}


def in_world_time(result: StepResult, scale: float) -> StepResult:
    """``result`` with its metrics in the world's clock (:func:`world_metrics`); ``result`` itself when
    ``scale`` is 1.0 (a real cluster)."""
    if scale == 1.0:
        return result
    return replace(result, metrics=world_metrics(result.metrics, scale))
