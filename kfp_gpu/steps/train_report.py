"""The train step's result: the JSON output, metrics and Markdown summary of one supervised run."""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

from kfp_gpu.steps.result import StepResult

if TYPE_CHECKING:
    from kfp_gpu.steps.train import TrainState


def result(st: TrainState, status: str, wall_s: float) -> StepResult:
    """Close the books of ``st`` (usage, timeline, ledger) and summarise the run. The JSON output and the summary
    give durations and GPU-hours in the world's clock (``scale``: :func:`kfp_gpu.rehearsal_seam.world_time_scale`,
    1.0 on a real cluster); the metrics stay on this process's clock, for :func:`kfp_gpu.steps.entry.run_step`
    scales them (:data:`kfp_gpu.steps.result.WALL_CLOCK_METRICS`). The ledger keeps the measured values."""
    from kfp_gpu.rehearsal_seam import world_time_scale

    st.close_usage(time.time())
    st.timeline.event("job-finished", time.time(), job=st.job, status=status, attempt=st.attempt)
    ck = st.checkpoint()
    final_step = ck.step if ck is not None else None
    final_loss = (ck.meta or {}).get("loss") if ck is not None else None
    st.ledger["status"] = status
    st.save_ledger()
    # read once the books are closed (as run_step does): a malformed factor must not keep the ledger from its status
    scale = world_time_scale()
    pre = list(st.ledger.get("preemptions", []))
    lat = [float(p["detect_latency_s"]) for p in pre if p.get("detect_latency_s") is not None]
    waits = [float(a["wait_s"]) for a in st.ledger.get("admissions", []) if a.get("wait_s") is not None]
    out = {
        "job": st.job, "job_kind": st.kind.NAME, "namespace": st.namespace, "status": status, "final_step": final_step,
        "final_loss": final_loss, "gpu_hours": round(st.usage.gpu_hours * scale, 6), "preemptions": len(pre),
        "app_failures": st.budget.app_failures, "attempts": st.attempt, "on_demand": st.budget.on_demand,
        "detect_latency_s": [round(x * scale, 4) for x in lat], "ledger": st.ledger,
        "capacity": json.loads(st.capacity.to_json()), "timeline": st.timeline.to_json(), "queue": st.queue,
        "queue_wait_s": [round(w * scale, 4) for w in waits],
        "queue_evictions": sum(1 for p in pre if p.get("cause") == "queue-eviction"),
    }
    metrics = {
        "gpu_hours": st.usage.gpu_hours, "preemptions": float(len(pre)), "attempts": float(st.attempt),
        "app_failures": float(st.budget.app_failures), "wall_s": wall_s,
        "steps_lost": float(sum(int(p.get("steps_lost", 0)) for p in pre)),
    }
    if lat:
        metrics["preemption_detect_latency_max_s"] = max(lat)
    if st.queue:
        metrics["queue_wait_s"] = sum(waits)
        metrics["queue_evictions"] = float(out["queue_evictions"])
    if final_step is not None:
        metrics["final_step"] = float(final_step)
    if isinstance(final_loss, (int, float)):
        metrics["final_loss"] = float(final_loss)
    return StepResult(json.dumps(out, sort_keys=True), metrics, markdown(out, pre, scale))


def _world_s(value: Any, scale: float) -> str:
    """A ledger duration (this process's seconds) in the world's clock, as the table shows it; '' when absent."""
    return "" if value in (None, "") else f"{float(value) * scale:.4g}"


def markdown(out: dict[str, Any], pre: list[dict[str, Any]], scale: float = 1.0) -> str:
    """The run's summary; ``out`` holds world-clock values already, ``pre`` (ledger entries) is scaled here."""
    from kfp_gpu.report._common import clock_note

    lines = [
        f"# Training job `{out['job']}` ({out.get('job_kind', 'pytorchjob')}): {out['status']}", "",
        f"- attempts: {out['attempts']}, preemptions: {out['preemptions']}, app failures: {out['app_failures']}",
        f"- GPU-hours: {out['gpu_hours']:.4f}; on-demand fallback: {'yes' if out['on_demand'] else 'no'}",
        f"- final step: {out['final_step'] if out['final_step'] is not None else 'unknown'}"
        + (f", loss {out['final_loss']}" if out["final_loss"] is not None else ""),
    ]
    if out.get("queue"):
        waits = ", ".join(f"{w:.1f} s" for w in out["queue_wait_s"]) or "-"
        lines.append(f"- Kueue LocalQueue `{out['queue']}`: waited for admission {waits}; "
                     f"evictions by Kueue: {out['queue_evictions']}")
    if pre:
        lines += ["", "| # | lost nodes | reason | checkpoint | steps lost | detect (s) | resume (s) |",
                  "|---|---|---|---|---|---|---|"]
        for i, p in enumerate(pre, 1):
            lines.append(f"| {i} | {', '.join(p.get('lost_nodes', [])) or '-'} | {p.get('reason', '')} | "
                         f"{p.get('checkpoint_step', 0)} | {p.get('steps_lost', 0)} | "
                         f"{_world_s(p.get('detect_latency_s'), scale)} | "
                         f"{_world_s(p.get('time_to_resume_s'), scale)} |")
    note = clock_note(scale)
    return "\n".join(lines + (["", f"_{note}_"] if note else []))


