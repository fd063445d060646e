"""Render a :class:`~kfp_gpu.timeline.Timeline` as one self-contained SVG (no scripts, no URLs).

One row per node; each row is a ``<g class="node-bar" data-node="NAME">`` holding the coloured
segments (see :mod:`kfp_gpu.report._common`), a red X where the node was preempted, and a tooltip.
The x axis is seconds from the first request. Shaded bands behind the rows are job-running
intervals. Row height shrinks with the node count (22 px for a handful, 4 px minimum), and labels are
thinned out when rows get too small to carry text, so 4 and 128 nodes both render legibly.
"""

from __future__ import annotations

import math
from html import escape

from kfp_gpu.report._common import (
    SEGMENT_COLOURS,
    SEGMENT_KINDS,
    SEGMENT_LABELS,
    job_intervals,
    label,
    ordered_nodes,
    segments,
    span,
)
from kfp_gpu.timeline import NodeState, Timeline

_LEFT = 230
_RIGHT = 24
_TOP = 46
_PLOT_BUDGET = 760.0  # px of rows before rows start to shrink


def nice_step(extent: float, target_ticks: int = 8) -> float:
    """A 1/2/5 x 10^k tick step giving about ``target_ticks`` ticks over ``extent``. Raises: nothing."""
    if extent <= 0:
        return 1.0
    raw = extent / max(1, target_ticks)
    mag = 10.0 ** math.floor(math.log10(raw))
    for m in (1.0, 2.0, 5.0, 10.0):
        if raw <= m * mag:
            return m * mag
    return 10 * mag


def _fmt(v: float) -> str:
    return f"{v:.2f}".rstrip("0").rstrip(".")


def render_timeline_svg(tl: Timeline, *, width: int = 1100, title: str = "") -> str:
    """The timeline as an SVG document string (UTF-8 text, starts with ``<svg``).

    Args:
        tl: the run's node timeline (nodes and run-level events).
        width: total picture width in px (min 500).
        title: optional caption above the plot; defaults to "Node timeline <run id>".

    Raises:
        Nothing for well-formed timelines; an empty timeline renders a "no nodes" placeholder.
    """
    width = max(500, int(width))
    nodes = ordered_nodes(tl)
    t0, t1 = span(tl)
    extent = max(t1 - t0, 1e-9)
    n = len(nodes)
    row_h = max(4.0, min(22.0, _PLOT_BUDGET / max(n, 1)))
    bar_h = max(2.0, row_h * 0.72)
    plot_w = width - _LEFT - _RIGHT
    plot_h = row_h * max(n, 1)
    legend_y = _TOP + plot_h + 56
    height = int(legend_y + 30)
    caption = title or f"Node timeline {tl.run_id}".strip()

    def x(t: float) -> float:
        return _LEFT + (t - t0) / extent * plot_w

    out: list[str] = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif" class="kfp-gpu-timeline" '
        f'data-nodes="{n}">',
        f'<rect x="0" y="0" width="{width}" height="{height}" fill="#ffffff"/>',
        f'<text x="{_LEFT}" y="20" font-size="15" font-weight="bold">{escape(caption)}</text>',
    ]
    # job-running bands
    for start, end, gpus in job_intervals(tl, t1):
        tip = f"job running {_fmt(start - t0)}s \u2192 {_fmt(end - t0)}s" + (f", {gpus} GPUs" if gpus else "")
        out.append(
            f'<rect class="job-band" x="{x(start):.1f}" y="{_TOP}" width="{max(1.0, x(end) - x(start)):.1f}" '
            f'height="{plot_h:.1f}" fill="#11a579" fill-opacity="0.10" stroke="#11a579" '
            f'stroke-dasharray="4 3"><title>{escape(tip)}</title></rect>'
        )
    # axis + grid
    step = nice_step(extent)
    axis_y = _TOP + plot_h
    out.append(f'<line x1="{_LEFT}" y1="{axis_y:.1f}" x2="{_LEFT + plot_w}" y2="{axis_y:.1f}" stroke="#333"/>')
    k = 0
    while k * step <= extent + 1e-9 and k < 1000:
        xs = x(t0 + k * step)
        out.append(
            f'<line x1="{xs:.1f}" y1="{_TOP}" x2="{xs:.1f}" y2="{axis_y + 4:.1f}" stroke="#ddd"/>'
            f'<text x="{xs:.1f}" y="{axis_y + 16:.1f}" font-size="10" text-anchor="middle">{_fmt(k * step)}</text>'
        )
        k += 1
    out.append(
        f'<text x="{_LEFT + plot_w / 2:.1f}" y="{axis_y + 32:.1f}" font-size="11" text-anchor="middle">'
        "seconds from first request</text>"
    )
    if not nodes:
        out.append(f'<text x="{_LEFT + 10}" y="{_TOP + 15}" font-size="12" fill="#666">no nodes recorded</text>')
    label_every = 1 if row_h >= 9 else math.ceil(9 / row_h)
    font = min(11.0, max(6.0, row_h - 3))
    for i, node in enumerate(nodes):
        y = _TOP + i * row_h + (row_h - bar_h) / 2
        lines = [label(node), f"{node.gpus} GPUs" + (" spot" if node.spot else "")]
        lines += [f"{s}: +{_fmt(v - t0)}s" for s, v in sorted(node.times.items(), key=lambda kv: kv[1])]
        out.append(
            f'<g class="node-bar" data-node="{escape(node.name, quote=True)}" '
            f'data-state="{escape(node.state.value)}"><title>{escape(chr(10).join(lines))}</title>'
        )
        for seg in segments(node, t1):
            w = max(0.8, x(seg.end) - x(seg.start))
            out.append(
                f'<rect class="seg seg-{seg.kind}" x="{x(seg.start):.1f}" y="{y:.1f}" width="{w:.1f}" '
                f'height="{bar_h:.1f}" fill="{SEGMENT_COLOURS[seg.kind]}"/>'
            )
        pre = node.at(NodeState.PREEMPTED)
        if pre is not None:
            cx, cy, r = x(pre), y + bar_h / 2, max(2.5, min(7.0, bar_h * 0.7))
            out.append(
                f'<path class="preempt-mark" d="M{cx - r:.1f},{cy - r:.1f} L{cx + r:.1f},{cy + r:.1f} '
                f'M{cx - r:.1f},{cy + r:.1f} L{cx + r:.1f},{cy - r:.1f}" stroke="#d00000" '
                f'stroke-width="{max(1.5, r / 2.5):.1f}"/>'
            )
        if i % label_every == 0:
            out.append(
                f'<text x="{_LEFT - 6}" y="{y + bar_h / 2 + font / 3:.1f}" font-size="{font:.1f}" '
                f'text-anchor="end">{escape(label(node) if row_h >= 9 else node.name)}</text>'
            )
        out.append("</g>")
    # legend
    lx = 10.0
    for kind in SEGMENT_KINDS:
        out.append(
            f'<rect x="{lx:.0f}" y="{legend_y - 10:.0f}" width="14" height="10" fill="{SEGMENT_COLOURS[kind]}"/>'
            f'<text x="{lx + 18:.0f}" y="{legend_y:.0f}" font-size="11">{escape(SEGMENT_LABELS[kind])}</text>'
        )
        lx += 40 + 6.2 * len(SEGMENT_LABELS[kind])
    out.append(
        f'<path d="M{lx:.0f},{legend_y - 10:.0f} l10,10 m-10,0 l10,-10" stroke="#d00000" stroke-width="2"/>'
        f'<text x="{lx + 14:.0f}" y="{legend_y:.0f}" font-size="11">preempted</text>'
        f'<rect x="{lx + 90:.0f}" y="{legend_y - 10:.0f}" width="14" height="10" fill="#11a579" '
        f'fill-opacity="0.15" stroke="#11a579" stroke-dasharray="3 2"/>'
        f'<text x="{lx + 108:.0f}" y="{legend_y:.0f}" font-size="11">job running</text>'
    )
    out.append("</svg>")
    return "\n".join(out)
