from __future__ import annotations

import xml.etree.ElementTree as ET

from kfp_gpu.report.timeline_svg import nice_step, render_timeline_svg
from kfp_gpu.timeline import NodeState, Timeline
from tests.report._timelines import make_timeline

NS = "{http://www.w3.org/2000/svg}"


def _bars(svg: str) -> list[ET.Element]:
    root = ET.fromstring(svg)
    return [g for g in root.iter(f"{NS}g") if g.get("class") == "node-bar"]


def test_one_bar_per_node_with_segments_and_preemption() -> None:
    tl = make_timeline(4, preempt=1)
    svg = render_timeline_svg(tl)
    bars = _bars(svg)
    assert [b.get("data-node") for b in bars] != []
    assert {b.get("data-node") for b in bars} == set(tl.nodes)
    preempted = [b for b in bars if b.get("data-state") == "released" and b.find(f"{NS}path") is not None]
    assert len(preempted) == 1
    kinds = {r.get("class") for b in bars for r in b.iter(f"{NS}rect")}
    assert {"seg seg-pending", "seg seg-booting", "seg seg-ready", "seg seg-preempted"} <= kinds
    assert "seconds from first request" in svg
    assert "gpu-a/us-central1-a" in svg  # pool/zone labels


def test_scales_row_height_for_many_nodes() -> None:
    small = ET.fromstring(render_timeline_svg(make_timeline(4)))
    big = ET.fromstring(render_timeline_svg(make_timeline(128)))
    assert len(_bars(ET.tostring(big, encoding="unicode"))) == 128
    assert float(big.get("height", 0)) < 128 * 22  # rows shrank
    assert float(small.get("height", 0)) < float(big.get("height", 0))


def test_open_and_failed_nodes_and_escaping() -> None:
    tl = Timeline(run_id="r<&>")
    a = tl.node('n"1<x>', pool="p", zone="z")
    a.advance(NodeState.REQUESTED, 10.0)
    b = tl.node("n2")
    b.advance(NodeState.REQUESTED, 10.0)
    b.advance(NodeState.FAILED, 30.0)
    tl.event("job-running", 40.0)
    svg = render_timeline_svg(tl)
    root = ET.fromstring(svg)  # well-formed despite hostile names
    bars = _bars(svg)
    assert {x.get("data-node") for x in bars} == {'n"1<x>', "n2"}
    assert root.find(f".//{NS}rect[@class='job-band']") is not None


def test_empty_timeline_renders() -> None:
    svg = render_timeline_svg(Timeline())
    assert "no nodes recorded" in svg and _bars(svg) == []


def test_nice_step() -> None:
    assert nice_step(900) == 200
    assert nice_step(60) == 10
    assert nice_step(0) == 1
