"""GangTracker with a topology rule: the gang counts as Ready only inside one domain, and the nodes to claim are
picked in the run's own nodes' domain (kfp_gpu.cluster.gang + kfp_gpu.plan.topology). Plain Node dicts, no cluster."""

from __future__ import annotations

from typing import Any

from kfp_gpu.cluster.gang import GangTracker
from kfp_gpu.ownership import LABEL_RUN_ID
from kfp_gpu.timeline import Timeline
from kfp_gpu_rehearsal.devcluster.nodes import make_gpu_node

BLOCK = "cloud.google.com/gce-topology-block"
ZONE = "us-central1-a"


def _node(name: str, block: str, run: str = "") -> dict[str, Any]:
    labels = {BLOCK: block, **({LABEL_RUN_ID: run} if run else {})}
    node = make_gpu_node(name, "pool", "nvidia-h100-80gb", ZONE, labels=labels)
    node["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
    return node


def _tracker(nodes: list[dict[str, Any]], topology: str = "required") -> GangTracker:
    t = GangTracker("run-1", {"pool"}, Timeline("run-1"), 8, False, domain_label=BLOCK, topology=topology)
    t.seed(nodes, 0.0)
    return t


def test_required_gang_is_ready_only_when_one_block_holds_it() -> None:
    t = _tracker([_node("a0", "A"), _node("a1", "A"), _node("b0", "B")])
    assert t.ready_count([ZONE]) == 2  # three Ready nodes, at most two in one block
    assert _tracker([_node("a0", "A"), _node("b0", "B")], topology="none").ready_count([ZONE]) == 2
    assert _tracker([_node("a0", "A"), _node("b0", "B")], topology="preferred").ready_count([ZONE]) == 2


def test_pick_keeps_the_replacement_in_the_survivors_block() -> None:
    # survivor s0 (the run's, block A); b0/b1 in block B would be the tighter fit for one node on their own
    nodes = [_node("s0", "A", run="run-1"), _node("b0", "B"), _node("b1", "B"), _node("a5", "A"), _node("a6", "A")]
    t = _tracker(nodes)
    assert t.ready_count([ZONE]) == 3  # the run's block: s0 + a5 + a6
    assert t.pick([ZONE], ["s0"], 1) == ["a5"]
    assert t.pick([ZONE], ["s0"], 3) is None  # block A has two more, and required never goes to block B
    assert _tracker(nodes, topology="preferred").pick([ZONE], ["s0"], 3) == ["a5", "a6", "b0"]


def test_pick_without_survivors_takes_the_tightest_block() -> None:
    t = _tracker([_node("a0", "A"), _node("a1", "A"), _node("a2", "A"), _node("b0", "B"), _node("b1", "B")])
    assert t.pick([ZONE], [], 2) == ["b0", "b1"]
    assert t.pick([ZONE], [], 3) == ["a0", "a1", "a2"]
    assert t.pick([ZONE], [], 4) is None
