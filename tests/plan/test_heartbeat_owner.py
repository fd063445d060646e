"""An owner the controller cannot observe (a Vertex AI pipeline): alive while a beat or the gang's creation is within
lease_ttl_s, gone after; pure, virtual time."""

from __future__ import annotations

from kfp_gpu.controller.owners import deciding_owner
from kfp_gpu.plan.lease import HEARTBEAT_OWNER, LOCAL_OWNER, WORKFLOW_OWNER, OwnerState, heartbeat_state


def test_a_recent_beat_keeps_the_owner_alive_and_a_stale_one_does_not() -> None:
    assert heartbeat_state(last_beat=1000.0, created=0.0, ttl_s=60.0, now=1059.0) is OwnerState.LIVE
    assert heartbeat_state(last_beat=1000.0, created=0.0, ttl_s=60.0, now=1061.0) is OwnerState.GONE


def test_before_the_first_beat_the_gangs_creation_counts() -> None:
    assert heartbeat_state(last_beat=None, created=500.0, ttl_s=60.0, now=550.0) is OwnerState.LIVE
    assert heartbeat_state(last_beat=None, created=500.0, ttl_s=60.0, now=561.0) is OwnerState.GONE
    assert heartbeat_state(last_beat=None, created=None, ttl_s=60.0, now=561.0) is OwnerState.UNKNOWN


def test_an_observable_owner_decides_before_the_heartbeat() -> None:
    both = {"workflow": "ns/wf", "heartbeat": "true"}
    assert deciding_owner(both, "host-a").kind == WORKFLOW_OWNER  # type: ignore[union-attr]
    local = {"local": "local:host-a:42", "heartbeat": "true"}
    assert deciding_owner(local, "host-a").kind == LOCAL_OWNER  # type: ignore[union-attr]
    assert deciding_owner(local, "host-b").kind == HEARTBEAT_OWNER  # type: ignore[union-attr]
    assert deciding_owner({"local": "local:host-a:42"}, "host-b") is None  # nothing to observe, nothing beats
