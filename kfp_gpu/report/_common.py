"""Shared geometry of the timeline pictures (SVG and terminal): spans, segments, ordering.

A node's bar is cut into segments by its recorded transitions (see :mod:`kfp_gpu.timeline`):

* ``pending``   requested -> registered (the cloud is creating the VM)
* ``booting``   registered -> Ready (kubelet up, GPU driver and device plugin starting)
* ``ready``     Ready -> preempted / released (usable GPUs; this is what the run pays for)
* ``preempted`` preempted -> released (capacity reclaimed by the cloud)
* ``failed``    failed -> released

A node that has not reached a later state yet extends to the end of the timeline.
"""

from __future__ import annotations

from dataclasses import dataclass

from kfp_gpu.timeline import NodeState, NodeTimeline, Timeline

SEGMENT_KINDS = ("pending", "booting", "ready", "preempted", "failed")
SEGMENT_COLOURS = {
    "pending": "#f2b701",
    "booting": "#3969ac",
    "ready": "#11a579",
    "preempted": "#e73f74",
    "failed": "#7f3c8d",
}
SEGMENT_LABELS = {
    "pending": "requested \u2192 registered",
    "booting": "registered \u2192 Ready",
    "ready": "Ready \u2192 released",
    "preempted": "preempted \u2192 released",
    "failed": "failed \u2192 released",
}

def duration(seconds: float) -> str:
    """A duration as people read one: ``45s`` under 2 minutes, ``12.5 min`` under 2 hours, else ``3.2 h``."""
    if seconds < 120:
        return f"{seconds:.1f}s" if seconds < 10 else f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def world(tl: Timeline) -> tuple[Timeline, str]:
    """``tl`` in the clock of the world the run happened in, and the one sentence that says so ("" on a real
    cluster): the local rehearsal compresses time by :func:`kfp_gpu.rehearsal_seam.world_time_scale`, and every
    time and cost it reports is in the world's clock. Raises: InvalidSpec (a malformed scale variable)."""
    from kfp_gpu.rehearsal_seam import world_time_scale

    scale = world_time_scale()
    if scale == 1.0:
        return tl, ""
    return tl.scaled(scale), clock_note(scale)


def clock_note(scale: float) -> str:
    """The one sentence that says a report is in the rehearsal world's clock ("" on a real cluster, ``scale`` 1.0)."""
    from kfp_gpu.rehearsal_seam import TIME_SCALE_ENV

    if scale == 1.0:
        return ""
    return (f"times and costs are in the rehearsal world's clock: one second here is {scale:g} real-world seconds "
            f"({TIME_SCALE_ENV}={scale:g})")


# Run-level event kinds the reports read (written by steps/ through ``Timeline.event``):
JOB_START_KINDS = frozenset({"job-running"})
JOB_END_KINDS = frozenset({"job-finished", "job-failed", "job-preempted", "job-cancelled"})


@dataclass(frozen=True)
class Segment:
    kind: str
    start: float
    end: float


def span(tl: Timeline) -> tuple[float, float]:
    """(first request, last recorded instant) over all nodes and events; (0, 0) when empty."""
    starts: list[float] = []
    ends: list[float] = []
    for n in tl.nodes.values():
        if n.times:
            starts.append(n.times.get(NodeState.REQUESTED.value, min(n.times.values())))
            ends.append(max(n.times.values()))
    for e in tl.events:
        try:
            t = float(e["t"])
        except (KeyError, TypeError, ValueError):
            continue
        ends.append(t)
        if not starts:
            starts.append(t)
    if not starts:
        return 0.0, 0.0
    t0 = min(starts)
    return t0, max([t0, *ends])


def segments(node: NodeTimeline, t_end: float) -> list[Segment]:
    """The coloured segments of one node's bar, in time order."""
    t = node.times
    order = [
        ("pending", NodeState.REQUESTED, (NodeState.REGISTERED, NodeState.FAILED, NodeState.RELEASED)),
        ("booting", NodeState.REGISTERED,
         (NodeState.READY, NodeState.FAILED, NodeState.PREEMPTED, NodeState.RELEASED)),
        ("ready", NodeState.READY, (NodeState.PREEMPTED, NodeState.RELEASED)),
        ("preempted", NodeState.PREEMPTED, (NodeState.RELEASED,)),
        ("failed", NodeState.FAILED, (NodeState.RELEASED,)),
    ]
    out: list[Segment] = []
    for kind, start_state, end_states in order:
        start = t.get(start_state.value)
        if start is None:
            continue
        ends = [t[s.value] for s in end_states if s.value in t and t[s.value] >= start]
        end = min(ends) if ends else max(t_end, start)
        out.append(Segment(kind, start, end))
    return out


def ordered_nodes(tl: Timeline) -> list[NodeTimeline]:
    """Nodes sorted by first request time, then name (stable, readable top-to-bottom)."""
    def key(n: NodeTimeline) -> tuple[float, str]:
        first = n.times.get(NodeState.REQUESTED.value, min(n.times.values()) if n.times else 0.0)
        return first, n.name
    return sorted(tl.nodes.values(), key=key)


def job_intervals(tl: Timeline, t_end: float) -> list[tuple[float, float, int | None]]:
    """(start, end, gpus) of every job-running interval; an open interval ends at ``t_end``.

    A ``job-running`` event opens an interval, the next ``job-finished``/``job-failed``/
    ``job-preempted``/``job-cancelled`` closes it. ``gpus`` is the event's ``gpus`` field, if any.
    """
    out: list[tuple[float, float, int | None]] = []
    open_at: float | None = None
    open_gpus: int | None = None
    for e in sorted(tl.events, key=lambda e: float(e.get("t", 0.0))):
        kind = str(e.get("kind", ""))
        t = float(e.get("t", 0.0))
        if kind in JOB_START_KINDS and open_at is None:
            open_at = t
            g = e.get("gpus")
            open_gpus = int(g) if isinstance(g, (int, float)) and not isinstance(g, bool) else None
        elif kind in JOB_END_KINDS and open_at is not None:
            out.append((open_at, max(t, open_at), open_gpus))
            open_at, open_gpus = None, None
    if open_at is not None:
        out.append((open_at, max(t_end, open_at), open_gpus))
    return out


def label(node: NodeTimeline) -> str:
    where = "/".join(p for p in (node.pool, node.zone) if p)
    return f"{node.name} ({where})" if where else node.name
