"""Write every rendering of one run's report into a directory (for teardown, the demo and the CLI)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from kfp_gpu.report.cost import CostReport, cost_report
from kfp_gpu.report.html import PreflightRow, render_html
from kfp_gpu.report.secrets import scan_for_secrets
from kfp_gpu.report.terminal import gantt
from kfp_gpu.report.timeline_svg import render_timeline_svg
from kfp_gpu.spec import ProvisioningSpec
from kfp_gpu.timeline import Timeline


def write_run_report(
    out_dir: str | Path,
    *,
    spec: ProvisioningSpec,
    timeline: Timeline,
    preflight: Iterable[PreflightRow | Mapping[str, Any]] = (),
    title: str = "",
) -> dict[str, Path]:
    """Write ``report.html``, ``timeline.svg``, ``cost.md``, ``cost.json``, ``timeline.txt``,
    ``timeline.json`` into ``out_dir``; returns name -> path.

    Raises:
        InvalidSpec: a malformed preflight row.
        OSError: the directory cannot be written.
        RuntimeError: a rendering contains something that looks like a secret (never written).
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cost: CostReport = cost_report(spec, timeline)
    heading = title or f"kfp-gpu run {timeline.run_id}".strip()
    texts = {
        "report.html": render_html(title=heading, timeline=timeline, preflight=preflight, cost=cost),
        "timeline.svg": render_timeline_svg(timeline, title=heading),
        "cost.md": cost.to_markdown(),
        "cost.json": json.dumps(cost.to_dict(), indent=2, sort_keys=True),
        "timeline.txt": gantt(timeline) + "\n\n" + cost.to_terminal() + "\n",
        "timeline.json": timeline.to_json(),
    }
    for name, text in texts.items():
        found = scan_for_secrets(text)
        if found:
            raise RuntimeError(f"refusing to write {name}: looks like it contains secrets: {found[:3]}")
    paths: dict[str, Path] = {}
    for name, text in texts.items():
        paths[name] = out / name
        paths[name].write_text(text, encoding="utf-8")
    return paths
