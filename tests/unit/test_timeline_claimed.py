"""NodeTimeline.claimed_ready: a node first seen Ready when a provisioner claimed it."""

from __future__ import annotations

from kfp_gpu.timeline import NodeState, Timeline


def test_a_fresh_node_is_requested_then_registered_and_ready_at_the_claim() -> None:
    tl = Timeline("r").node("n1", pool="p", zone="z")
    tl.claimed_ready(10.0, 12.5)
    assert tl.state is NodeState.READY
    assert tl.times == {"requested": 10.0, "registered": 12.5, "ready": 12.5}


def test_known_times_are_kept() -> None:
    tl = Timeline("r").node("n1")
    tl.advance(NodeState.REQUESTED, 5.0)
    tl.advance(NodeState.REGISTERED, 8.0)
    tl.claimed_ready(10.0, 12.5)
    assert tl.times == {"requested": 5.0, "registered": 8.0, "ready": 12.5}
    tl.claimed_ready(20.0, 30.0)  # claimed again (a retried pass): nothing moves
    assert tl.times == {"requested": 5.0, "registered": 8.0, "ready": 12.5}
