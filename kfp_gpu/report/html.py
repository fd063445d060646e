"""One self-contained HTML page per run: inline CSS, inline SVG, no scripts and no external URLs.

Sections: title + summary, the node timeline (SVG), the preflight table (quota per placement,
how much is short, remediation) and the cost-risk table. Preflight rows are
:class:`PreflightRow` objects (or plain dicts with the same keys), so the preflight step's
result only needs a thin adapter.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from html import escape
from pathlib import Path
from typing import Any

from kfp_gpu.errors import InvalidSpec
from kfp_gpu.report.cost import CostReport
from kfp_gpu.report.timeline_svg import render_timeline_svg
from kfp_gpu.timeline import Timeline

_STATUSES = ("ok", "short", "unknown")


@dataclass(frozen=True)
class PreflightRow:
    """One quota check of the preflight verdict, as displayed.

    ``status`` is "ok" (enough free), "short" (``short`` units missing) or "unknown" (could not be
    read; never counts as ok). Amounts are in ``unit`` (gpus or vcpus); None means unknown.
    """

    placement: str  # region, zone, or "global"
    metric: str
    needed: float
    free: float | None
    limit: float | None = None
    short: float | None = None
    status: str = "ok"
    unit: str = "gpus"
    remediation: str = ""
    lead_time_days: float | None = None

    def __post_init__(self) -> None:
        if self.status not in _STATUSES:
            raise InvalidSpec("preflight.status", self.status, f"allowed: {', '.join(_STATUSES)}")

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> PreflightRow:
        """Build from a dict with the field names above; unknown keys are ignored.

        Raises: InvalidSpec when a required key (placement, metric, needed) is missing or status is bad.
        """
        names = {f.name for f in dataclasses.fields(cls)}
        for req in ("placement", "metric", "needed"):
            if req not in data:
                raise InvalidSpec(f"preflight.{req}", None, "is required in every preflight row")
        return cls(**{k: v for k, v in data.items() if k in names})


def rows_from_quota_checks(checks: Iterable[Any], *, placement: str = "") -> list[PreflightRow]:
    """Adapt :class:`kfp_gpu.plan.quota.QuotaCheck` objects (or anything with the same attributes).

    ``placement`` overrides the check's own ``location`` (e.g. a zone label). The remediation is the
    check's reason plus where to raise the quota.

    Raises:
        AttributeError: an item lacks the QuotaCheck attributes.
    """
    out = []
    for c in checks:
        verdict = str(getattr(c.verdict, "value", c.verdict))
        status = {"fits": "ok"}.get(verdict, verdict if verdict in _STATUSES else "unknown")
        fix = "; ".join(x for x in (c.reason, f"raise at {c.raise_path}" if c.raise_path and status != "ok" else "") if x)
        out.append(PreflightRow(
            placement=placement or c.location, metric=c.metric, needed=c.needed, free=c.free, limit=c.limit,
            short=c.short_by if status == "short" else None, status=status, unit=c.unit, remediation=fix,
            lead_time_days=c.lead_time_days or None,
        ))
    return out


def coerce_rows(rows: Iterable[PreflightRow | Mapping[str, Any]]) -> list[PreflightRow]:
    """Accept PreflightRow objects or dicts. Raises: InvalidSpec for a malformed dict."""
    return [r if isinstance(r, PreflightRow) else PreflightRow.from_mapping(r) for r in rows]


_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;color:#1d1d1f;background:#fff}
h1{font-size:22px;margin:0 0 4px} h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #ddd;padding-bottom:4px}
.meta{color:#555;font-size:13px} table{border-collapse:collapse;font-size:13px;margin-top:6px}
th,td{border:1px solid #d0d0d0;padding:4px 8px;text-align:left;vertical-align:top} th{background:#f3f3f3}
td.num{text-align:right;font-variant-numeric:tabular-nums}
tr.status-short td{background:#fde8ec} tr.status-unknown td{background:#fff6d6}
.badge{display:inline-block;padding:1px 6px;border-radius:8px;font-size:11px;font-weight:600}
.badge-ok{background:#d7f5e8;color:#0b6e4f} .badge-short{background:#f9c9d5;color:#9b1237}
.badge-unknown{background:#fde9a8;color:#7a5a00} .svgwrap{overflow-x:auto;border:1px solid #eee}
.notes{color:#555;font-size:12px}
"""


def _num(v: float | None) -> str:
    return "?" if v is None else f"{v:g}"


def preflight_table_html(rows: Sequence[PreflightRow]) -> str:
    """The preflight rows as an HTML ``<table class="preflight">``. Raises: nothing."""
    if not rows:
        return '<p class="notes">no preflight checks recorded</p>'
    out = [
        '<table class="preflight"><thead><tr><th>placement</th><th>quota</th><th>needed</th>'
        "<th>free</th><th>limit</th><th>short</th><th>status</th><th>remediation</th></tr></thead><tbody>"
    ]
    for r in rows:
        fix = r.remediation + (f" (typical approval lead time {r.lead_time_days:g} days)"
                               if r.lead_time_days and r.status != "ok" else "")
        out.append(
            f'<tr class="status-{escape(r.status)}"><td>{escape(r.placement)}</td><td>{escape(r.metric)}</td>'
            f'<td class="num">{_num(r.needed)} {escape(r.unit)}</td><td class="num">{_num(r.free)}</td>'
            f'<td class="num">{_num(r.limit)}</td><td class="num">{_num(r.short) if r.status == "short" else ""}</td>'
            f'<td><span class="badge badge-{escape(r.status)}">{escape(r.status)}</span></td>'
            f"<td>{escape(fix)}</td></tr>"
        )
    out.append("</tbody></table>")
    return "".join(out)


def cost_table_html(cost: CostReport) -> str:
    """The cost-risk rows as an HTML ``<table class="cost">``. Raises: nothing."""
    out = ['<table class="cost"><thead><tr><th>item</th><th>value</th><th>how</th></tr></thead><tbody>']
    for a, b, c in cost.rows():
        strong = a == "total"
        cell = f"<strong>{escape(b)}</strong>" if strong else escape(b)
        out.append(f'<tr><td>{escape(a)}</td><td class="num">{cell}</td><td>{escape(c)}</td></tr>')
    out.append("</tbody></table>")
    out += [f'<p class="notes">{escape(n)}</p>' for n in cost.notes]
    return "".join(out)


def render_html(
    *,
    title: str,
    timeline: Timeline | None = None,
    preflight: Iterable[PreflightRow | Mapping[str, Any]] = (),
    cost: CostReport | None = None,
    summary: str = "",
    generated_at: _dt.datetime | None = None,
) -> str:
    """A complete, self-contained HTML document.

    Raises:
        InvalidSpec: a preflight dict row is malformed.
    """
    rows = coerce_rows(preflight)
    when = (generated_at or _dt.datetime.now(_dt.timezone.utc)).strftime("%Y-%m-%d %H:%M:%S %Z")
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{escape(title)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{escape(title)}</h1>",
        f'<p class="meta">generated {escape(when)}'
        + (f" &middot; run <code>{escape(timeline.run_id)}</code>" if timeline and timeline.run_id else "")
        + "</p>",
    ]
    if summary:
        parts.append(f"<p>{escape(summary)}</p>")
    if timeline is not None:
        n_ready = sum(1 for n in timeline.nodes.values() if n.times.get("ready") is not None)
        parts.append(f"<h2>Node timeline ({n_ready}/{len(timeline.nodes)} nodes reached Ready)</h2>")
        svg = render_timeline_svg(timeline, title=" ").replace(' xmlns="http://www.w3.org/2000/svg"', "", 1)
        parts.append(f'<div class="svgwrap">{svg}</div>')
    parts.append("<h2>Preflight</h2>")
    parts.append(preflight_table_html(rows))
    if cost is not None:
        parts.append("<h2>Cost risk</h2>")
        parts.append(cost_table_html(cost))
    parts.append("</body></html>")
    return "\n".join(parts)


def write_html(path: str | Path, **kwargs: Any) -> Path:
    """``render_html(**kwargs)`` written to ``path`` (parents created). Raises: InvalidSpec, OSError."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(render_html(**kwargs), encoding="utf-8")
    return p
