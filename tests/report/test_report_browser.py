"""Render real report pages in headless Chromium: DOM has one node-bar per node, screenshot is not blank."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kfp_gpu.report import PreflightRow, cost_report, write_html
from kfp_gpu.report.html import render_html
from kfp_gpu.spec import ProvisioningSpec
from tests.report._browser import dump_dom, png_info, screenshot
from tests.report._timelines import make_timeline


@pytest.mark.parametrize("n", [4, 128])
def test_chromium_renders_every_node(tmp_path: Path, spec: ProvisioningSpec, n: int) -> None:
    tl = make_timeline(n, preempt=2)
    page = write_html(
        tmp_path / "report.html",
        title=f"kfp-gpu run ({n} nodes)",
        timeline=tl,
        cost=cost_report(spec.replace(nodes=n), tl),
        preflight=[PreflightRow("us-central1", "NVIDIA_H100_GPUS", needed=8 * n, free=16, limit=64,
                                short=8 * n - 16, status="short", remediation="request more quota")],
    )
    dom = dump_dom(page)
    assert len(re.findall(r'class="node-bar"', dom)) == n
    names = set(re.findall(r'data-node="([^"]+)"', dom))
    assert names == set(tl.nodes)
    assert len(re.findall(r'class="preempt-mark"', dom)) == 2
    assert "NVIDIA_H100_GPUS" in dom and "$" in dom
    png = screenshot(page, tmp_path / "shot.png")
    w, h, colours = png_info(png)
    assert (w, h) == (1200, 900)
    assert colours >= 6, f"screenshot looks blank ({colours} colours)"


def test_page_is_self_contained(spec: ProvisioningSpec) -> None:
    tl = make_timeline(4)
    html = render_html(title="t", timeline=tl, cost=cost_report(spec, tl))
    assert "<script" not in html
    assert not re.search(r"(src|href)\s*=|url\(|@import|https?://", html), "external reference in report"
