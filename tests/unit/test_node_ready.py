"""A node counts as Ready for a gang only once its startup taints are gone (kfp_gpu.plan.readiness.is_ready, the one
predicate every reader uses)."""

from __future__ import annotations

from typing import Any

import pytest

from kfp_gpu.cluster.facts import node_fact
from kfp_gpu.cluster.nodes import NodeView
from kfp_gpu.plan.readiness import STARTUP_TAINTS, is_ready
from kfp_gpu.plan.recovery import gang_ready


def _node(ready: str, taints: list[dict[str, str]]) -> dict[str, Any]:
    return {"metadata": {"name": "n1", "labels": {}},
            "spec": {"taints": taints},
            "status": {"conditions": [{"type": "Ready", "status": ready}], "allocatable": {"nvidia.com/gpu": "8"}}}


@pytest.mark.parametrize("key,effect", [("karpenter.sh/unregistered", "NoExecute"),
                                        ("node.cloudprovider.kubernetes.io/uninitialized", "NoSchedule")])
def test_a_ready_node_still_carrying_a_startup_taint_is_not_ready(key: str, effect: str) -> None:
    # what Karpenter's kwok provider creates and KWOK marks Ready before Karpenter registers the NodeClaim
    assert NodeView.of(_node("True", [{"key": key, "effect": effect}])).ready is False


def test_other_taints_leave_a_ready_node_ready() -> None:
    taints = [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"},
              {"key": "kfp-gpu.io/nodepool", "value": "run", "effect": "NoSchedule"}]
    assert NodeView.of(_node("True", taints)).ready is True
    assert NodeView.of(_node("False", [])).ready is False


# The one predicate (kfp_gpu.plan.readiness.is_ready) is what every reader uses: the gang watch's facts too.

@pytest.mark.parametrize("key", sorted(STARTUP_TAINTS))
def test_the_gang_watch_does_not_count_a_node_with_a_startup_taint_as_ready(key: str) -> None:
    node = _node("True", [{"key": key, "effect": "NoExecute"}])
    fact = node_fact(node, at=0.0)
    assert fact.ready is False
    assert gang_ready(["n1"], {"n1": fact}, gpus_per_node=8) == ("n1",)  # the gang waits for it
    cleared = node_fact(_node("True", []), at=1.0)
    assert cleared.ready is True and gang_ready(["n1"], {"n1": cleared}, gpus_per_node=8) == ()


def test_every_reader_agrees_with_the_one_predicate() -> None:
    cases = [_node("True", []), _node("False", []), _node("True", [{"key": "karpenter.sh/unregistered"}]),
             {"metadata": {"name": "n1"}, "status": {}}]
    for node in cases:
        assert NodeView.of(node).ready is node_fact(node, at=0.0).ready is is_ready(node)


def test_gpus_required_means_allocatable_gpus_registered() -> None:
    node = _node("True", [])
    assert is_ready(node, gpus=8) and not is_ready(node, gpus=9)
    node["status"]["allocatable"] = {}  # the device plugin has not registered the GPUs yet
    assert is_ready(node) and not is_ready(node, gpus=1)


def test_a_startup_taint_its_nodepool_declares_keeps_a_ready_node_not_ready_until_it_goes() -> None:
    declared = {"example.com/agent-not-ready"}
    tainted = _node("True", [{"key": "example.com/agent-not-ready", "effect": "NoExecute"}])
    assert is_ready(tainted) and not is_ready(tainted, startup=declared)  # undeclared: any other taint
    assert is_ready(_node("True", []), startup=declared)
    assert not is_ready(_node("False", []), startup=declared)
