"""claim_all: a batch of nodes claimed at once against the real API server, each with claim()'s conditional patch."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from kfp_gpu.cluster.nodes import (
    SCALE_DOWN_DISABLED,
    annotations_of,
    claim,
    claim_all,
    is_claim_taint,
    labels_of,
    name_of,
    read_node,
    run_taint,
)
from kfp_gpu.ownership import LABEL_RUN_ID, label_safe
from kfp_gpu_rehearsal.devcluster.client import Kube

pytestmark = pytest.mark.integration

NodeFactory = Callable[..., tuple[str, list[str]]]


def test_claim_all_takes_every_free_node_and_leaves_another_runs_alone(kube: Kube, kwok_nodes: NodeFactory) -> None:
    _, names = kwok_nodes(6)
    lease = time.time() + 600
    first = read_node(kube.api, names[0])
    assert first is not None and claim(kube.api, first, "other-run", lease, namespace="other-team")
    fresh = [n for n in (read_node(kube.api, name) for name in names) if n is not None]
    assert len(fresh) == 6

    won = claim_all(kube.api, fresh, "this-run", lease, namespace="ml-team",
                    protect=lambda node: name_of(node) == names[1])

    assert won == [False, True, True, True, True, True]
    after = {n: read_node(kube.api, n) or {} for n in names}
    assert labels_of(after[names[0]])[LABEL_RUN_ID] == label_safe("other-run")
    for n in names[1:]:
        assert labels_of(after[n])[LABEL_RUN_ID] == label_safe("this-run")
        taints = (after[n].get("spec") or {}).get("taints", [])
        assert [t for t in taints if is_claim_taint(t)] == [run_taint("this-run", "ml-team")]
    assert [t for t in (after[names[0]].get("spec") or {}).get("taints", []) if is_claim_taint(t)] == [
        run_taint("other-run", "other-team")]
    assert annotations_of(after[names[1]]).get(SCALE_DOWN_DISABLED) == "true"
    assert SCALE_DOWN_DISABLED not in annotations_of(after[names[2]])
