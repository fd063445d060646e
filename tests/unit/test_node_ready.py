"""A node counts as Ready for a gang only once its startup taints are gone (kfp_gpu.cluster.nodes.is_ready)."""

from __future__ import annotations

from typing import Any

import pytest

from kfp_gpu.cluster.nodes import NodeView


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
