"""Terminal renderings: a width-bounded Unicode Gantt of the nodes, the cost table, a progress line.

Gantt cell characters (one column = a slice of the run's seconds)::

    \u00b7 requested -> registered   \u2592 registered -> Ready   \u2588 Ready   \u2591 preempted   ! failed   X preemption

Above ``max_rows`` nodes the Gantt is summarised: one row per (pool, zone) group whose cells shade
from blank to full block with the fraction of that group's nodes Ready at that instant.
"""

from __future__ import annotations

import os
import statistics
from collections import defaultdict

from kfp_gpu.report._common import duration, label, ordered_nodes, segments, span
from kfp_gpu.report.cost import CostReport
from kfp_gpu.timeline import NodeState, NodeTimeline, Timeline

CELL = {"pending": "\u00b7", "booting": "\u2592", "ready": "\u2588", "preempted": "\u2591", "failed": "!"}
_SHADES = " \u2581\u2582\u2583\u2584\u2585\u2586\u2587\u2588"
LEGEND = (
    "\u00b7 requested\u2192registered  \u2592 registered\u2192Ready  \u2588 Ready  "
    "\u2591 preempted  ! failed  X preemption"
)


def _cut(text: str, n: int) -> str:
    return text if len(text) <= n else text[: max(0, n - 1)] + "\u2026"


def _short_names(nodes: list[NodeTimeline], width: int) -> list[str]:
    """Node names share long prefixes (gke-<cluster>-<pool>-NNNN): when full labels would be cut, drop the
    shared prefix so every row still says which node it is."""
    full = [label(n) for n in nodes]
    if max(len(f) for f in full) <= width or len(nodes) < 2:
        return full
    if max(len(n.name) for n in nodes) <= width:
        return [n.name for n in nodes]
    prefix = os.path.commonprefix([n.name for n in nodes])
    prefix = prefix[: prefix.rfind("-") + 1]
    return [("\u2026" + n.name[len(prefix):]) if prefix else n.name for n in nodes]


def _cell_at(node: NodeTimeline, t: float, t_end: float) -> str:
    for seg in segments(node, t_end):
        if seg.start <= t < seg.end or (seg.start == seg.end == t):
            return CELL[seg.kind]
    return " "


def _ready_at(node: NodeTimeline, t: float, t_end: float) -> bool:
    return any(s.kind == "ready" and s.start <= t < s.end for s in segments(node, t_end))


def _axis(label_w: int, cols: int, extent: float) -> str:
    left, right = "0s", duration(extent)
    mid = duration(extent / 2)
    line = [" "] * cols
    for pos, text in ((0, left), (max(0, cols // 2 - len(mid) // 2), mid), (max(0, cols - len(right)), right)):
        for i, ch in enumerate(text):
            if pos + i < cols:
                line[pos + i] = ch
    return " " * (label_w + 1) + "\u2502" + "".join(line)


def gantt(tl: Timeline, *, width: int = 100, max_rows: int = 40) -> str:
    """A Gantt chart no wider than ``width`` characters (min 40); summarised above ``max_rows`` nodes.

    Raises:
        Nothing: an empty timeline renders "(no nodes recorded)".
    """
    width = max(40, width)
    nodes = ordered_nodes(tl)
    if not nodes:
        return "(no nodes recorded)"
    t0, t1 = span(tl)
    extent = max(t1 - t0, 1e-9)
    if len(nodes) <= max_rows:
        labels = _short_names(nodes, min(32, width // 3))
    else:
        groups: dict[str, list[NodeTimeline]] = defaultdict(list)
        for n in nodes:
            groups["/".join(p for p in (n.pool, n.zone) if p) or "(ungrouped)"].append(n)
        labels = [f"{k} ({len(v)})" for k, v in groups.items()]
    label_w = min(32, max(len(s) for s in labels), width // 3)
    cols = width - label_w - 2
    dt = extent / cols
    mids = [t0 + (c + 0.5) * dt for c in range(cols)]
    out: list[str] = []
    if len(nodes) <= max_rows:
        out.append(f"{len(nodes)} nodes, {duration(extent)} from first request")
        for n, text in zip(nodes, labels, strict=True):
            row = [_cell_at(n, t, t1) for t in mids]
            pre = n.at(NodeState.PREEMPTED)
            if pre is not None:
                row[min(cols - 1, int((pre - t0) / dt))] = "X"
            out.append(f"{_cut(text, label_w):<{label_w}} \u2502" + "".join(row))
        out.append(_axis(label_w, cols, extent))
        out.append(LEGEND)
    else:
        out.append(
            f"{len(nodes)} nodes in {len(groups)} groups, {duration(extent)} from first request; "
            "shade = fraction of the group Ready"
        )
        for (_, members), text in zip(groups.items(), labels, strict=True):
            cells = []
            for t in mids:
                frac = sum(_ready_at(n, t, t1) for n in members) / len(members)
                cells.append(_SHADES[round(frac * (len(_SHADES) - 1))])
            out.append(f"{_cut(text, label_w):<{label_w}} \u2502" + "".join(cells))
        out.append(_axis(label_w, cols, extent))
        lat = tl.ready_latencies()
        pre = sum(1 for n in nodes if n.at(NodeState.PREEMPTED) is not None)
        if lat:
            out.append(
                f"Ready {len(lat)}/{len(nodes)}; request\u2192Ready median {duration(statistics.median(lat))}, "
                f"max {duration(max(lat))}; preempted {pre}"
            )
    return "\n".join(_cut(line, width) for line in out)


def cost_table(cost: CostReport, *, width: int = 100) -> str:
    """The cost-risk report as aligned text (same rows as the Markdown/HTML versions). Raises: nothing."""
    return cost.to_terminal(width=width)


def progress_line(ready: int, total: int, *, elapsed_s: float, eta_s: float | None = None, bar: int = 20) -> str:
    """``nodes Ready 3/8 [███████░░░░░░░░░░░░░] 42s elapsed, ETA 70s`` for long waits.

    Without ``eta_s`` the ETA is a linear extrapolation (elapsed / ready x remaining), "?" before the
    first node is Ready.

    Raises: nothing.
    """
    total = max(total, 0)
    ready = min(max(ready, 0), total) if total else max(ready, 0)
    filled = round(bar * ready / total) if total else 0
    if eta_s is None and 0 < ready < total:
        eta_s = elapsed_s / ready * (total - ready)
    if ready >= total and total:
        eta = "done"
    else:
        eta = "ETA ?" if eta_s is None else f"ETA {max(0.0, eta_s):.0f}s"
    gauge = "\u2588" * filled + "\u2591" * (bar - filled)
    return f"nodes Ready {ready}/{total} [{gauge}] {elapsed_s:.0f}s elapsed, {eta}"


def eta_from_timeline(tl: Timeline, total: int, now: float) -> float | None:
    """Seconds until ``total`` nodes are Ready, from the median request->Ready latency so far.

    Each requested-but-not-Ready node is expected at its request time + the median latency; missing
    nodes (not requested yet) at ``now`` + the median. None before any node is Ready.

    Raises: nothing.
    """
    lat = tl.ready_latencies()
    if not lat:
        return None
    med = statistics.median(lat)
    waits = []
    ready = 0
    for n in tl.nodes.values():
        if n.at(NodeState.READY) is not None:
            ready += 1
            continue
        if n.state in (NodeState.FAILED, NodeState.RELEASED, NodeState.PREEMPTED):
            continue
        req = n.at(NodeState.REQUESTED)
        waits.append(max(0.0, (req if req is not None else now) + med - now))
    if ready + len(waits) < total:
        waits.append(med)
    return max(waits) if waits else 0.0


def progress_from_timeline(tl: Timeline, total: int, now: float, scale: float = 1.0) -> str:
    """:func:`progress_line` filled from a live timeline (elapsed from the first request); ``scale`` real-world
    seconds per second puts elapsed and ETA in the world's clock (the rehearsal). Raises: nothing."""
    t0, _ = span(tl)
    ready = sum(1 for n in tl.nodes.values() if n.state is NodeState.READY)
    eta = eta_from_timeline(tl, total, now)
    return progress_line(ready, total, elapsed_s=(max(0.0, now - t0) if tl.nodes else 0.0) * scale,
                         eta_s=None if eta is None else eta * scale)
