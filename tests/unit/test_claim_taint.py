"""The claim taint names the run's namespace (``<namespace>.claims.kfp-gpu.io/run``), and claim/unclaim use it."""

from __future__ import annotations

import copy
import json
import re
from typing import Any

import pytest
from kubernetes import client

from kfp_gpu.cluster import nodes
from kfp_gpu.cluster.nodes import (
    claim,
    claim_all,
    claim_namespace,
    claim_taint_key,
    is_claim_taint,
    run_taint,
    run_toleration,
    unclaim,
)
from kfp_gpu.ownership import LABEL_RUN_ID, LEGACY_RUN_TAINT_KEY, label_safe
from kfp_gpu.steps.capacity import Capacity, Placement

RUN = "Llm-Finetune/2024 run #7"

# k8s.io/apimachinery/pkg/util/validation IsQualifiedName: [DNS-1123 subdomain '/'] name
_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def _qualified(key: str) -> bool:
    prefix, _, name = key.rpartition("/")
    return (bool(_NAME.match(name)) and len(name) <= 63
            and (not prefix or (bool(_SUBDOMAIN.match(prefix)) and len(prefix) <= 253)))


@pytest.mark.parametrize("namespace", ["default", "ml-team", "a", "n" * 63, "team-2-prod"])
def test_the_key_names_the_namespace_and_is_a_qualified_name(namespace: str) -> None:
    key = claim_taint_key(namespace)
    assert key == f"{namespace}.claims.kfp-gpu.io/run"
    assert _qualified(key)
    assert run_taint(RUN, namespace) == {"key": key, "value": label_safe(RUN), "effect": "NoSchedule"}
    assert run_toleration(RUN, namespace) == {"key": key, "operator": "Equal", "value": label_safe(RUN),
                                              "effect": "NoSchedule"}
    assert claim_namespace(run_taint(RUN, namespace)) == namespace


def test_an_empty_namespace_is_refused() -> None:
    with pytest.raises(ValueError):
        claim_taint_key("")
    with pytest.raises(ValueError):
        run_taint(RUN, "")
    with pytest.raises(ValueError):
        run_toleration(RUN, "")


def test_claim_taints_of_any_namespace_and_of_older_versions_are_claim_taints() -> None:
    assert is_claim_taint(run_taint(RUN, "ml-team"))
    assert is_claim_taint(run_taint("another-run", "other-team"))  # another namespace's claim is a claim too
    assert is_claim_taint({"key": LEGACY_RUN_TAINT_KEY, "value": "r1", "effect": "NoSchedule"})  # older versions
    assert LEGACY_RUN_TAINT_KEY == "kfp-gpu.io/run"
    assert is_claim_taint(client.V1Taint(key="ml-team.claims.kfp-gpu.io/run", value="r", effect="NoSchedule"))
    assert is_claim_taint(client.V1Toleration(key="kfp-gpu.io/run", operator="Equal", value="r"))
    assert claim_namespace({"key": LEGACY_RUN_TAINT_KEY}) == ""
    assert claim_namespace(run_taint("r", "other-team")) == "other-team"


@pytest.mark.parametrize("key", ["nvidia.com/gpu", "kfp-gpu.io/run-id", "kfp-gpu.io/dedicated", "kfp-gpu.io/runs",
                                 "cloud.google.com/impending-node-termination", ".claims.kfp-gpu.io/run",
                                 "ml-team.claims.kfp-gpu.io/run-id", "ml-team.claims.kfp-gpu.io/other", ""])
def test_other_taints_are_not_claim_taints(key: str) -> None:
    assert not is_claim_taint({"key": key, "value": "x", "effect": "NoSchedule"})
    assert claim_namespace({"key": key}) == ""
    assert not is_claim_taint({})


def test_the_capacity_carries_the_namespace_through_json_and_tolerates_that_namespaces_claim() -> None:
    cap = Capacity(RUN, (Placement("p", "us-central1-a", ("n1",)),), 8, "nvidia-h100-80gb", spot=True,
                   namespace="ml-team")
    back = Capacity.from_json(cap.to_json())
    assert back == cap and back.namespace == "ml-team"
    assert run_toleration(RUN, "ml-team") in back.tolerations()
    assert not any(t.get("key") == claim_taint_key("default") for t in back.tolerations())
    old = json.loads(cap.to_json())
    del old["namespace"]  # written before the field existed: the spec's default namespace
    assert Capacity.from_json(json.dumps(old)).namespace == "default"


# ---- claim / unclaim on a fake API server -----------------------------------------------------------------

class _Resp:
    def __init__(self, obj: Any) -> None:
        self.data = json.dumps(obj).encode()


class _FakeCore:
    """CoreV1Api's node calls on one stored Node: a merge patch, conditional on resourceVersion."""

    store: dict[str, dict[str, Any]] = {}
    patches: list[dict[str, Any]] = []

    def __init__(self, _api: Any = None) -> None:
        pass

    def read_node(self, name: str, **_: Any) -> _Resp:
        return _Resp(self.store[name])

    def list_node(self, field_selector: str | None = None, **_: Any) -> _Resp:
        name = (field_selector or "").removeprefix("metadata.name=")
        return _Resp({"metadata": {"resourceVersion": "1"},
                      "items": [self.store[name]] if name in self.store else []})

    def patch_node(self, name: str, body: dict[str, Any], **_: Any) -> _Resp:
        type(self).patches.append(copy.deepcopy(body))
        node = self.store[name]
        meta = body.get("metadata", {})
        assert meta.get("resourceVersion") == node["metadata"]["resourceVersion"]
        for field in ("labels", "annotations"):
            cur = node["metadata"].setdefault(field, {})
            for k, v in (meta.get(field) or {}).items():
                if v is None:
                    cur.pop(k, None)
                else:
                    cur[k] = v
        if "taints" in body.get("spec", {}):
            node.setdefault("spec", {})["taints"] = body["spec"]["taints"]
        node["metadata"]["resourceVersion"] = str(int(node["metadata"]["resourceVersion"]) + 1)
        return _Resp(node)


GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}


@pytest.fixture
def core(monkeypatch: pytest.MonkeyPatch) -> type[_FakeCore]:
    monkeypatch.setattr(nodes.client, "CoreV1Api", _FakeCore)
    _FakeCore.store, _FakeCore.patches = {}, []
    return _FakeCore


def _node(core: type[_FakeCore], name: str, *, labels: dict[str, str] | None = None,
          taints: list[dict[str, str]] | None = None) -> dict[str, Any]:
    core.store[name] = {"metadata": {"name": name, "resourceVersion": "1", "labels": dict(labels or {})},
                        "spec": {"taints": [dict(GPU_TAINT), *(taints or [])]}}
    return copy.deepcopy(core.store[name])


def test_claim_taints_the_node_with_its_namespaces_key(core: type[_FakeCore]) -> None:
    node = _node(core, "n1")
    assert claim(None, node, RUN, 1e9, namespace="ml-team")  # type: ignore[arg-type]
    stored = core.store["n1"]
    assert stored["spec"]["taints"] == [GPU_TAINT, run_taint(RUN, "ml-team")]
    assert stored["metadata"]["labels"][LABEL_RUN_ID] == label_safe(RUN)
    # claiming again is a no-op (no second patch)
    assert claim(None, copy.deepcopy(stored), RUN, 1e9, namespace="ml-team")  # type: ignore[arg-type]
    assert len(core.patches) == 1


def test_a_claim_of_an_older_version_is_rekeyed_by_its_own_run(core: type[_FakeCore]) -> None:
    legacy = {"key": LEGACY_RUN_TAINT_KEY, "value": label_safe(RUN), "effect": "NoSchedule"}
    node = _node(core, "n1", labels={LABEL_RUN_ID: label_safe(RUN)}, taints=[legacy])
    assert claim(None, node, RUN, 1e9, namespace="ml-team")  # type: ignore[arg-type]
    assert core.store["n1"]["spec"]["taints"] == [GPU_TAINT, run_taint(RUN, "ml-team")]


def test_another_namespaces_claim_is_left_alone(core: type[_FakeCore]) -> None:
    # same label-safe run id, other namespace: not ours
    node = _node(core, "n1", labels={LABEL_RUN_ID: label_safe(RUN)}, taints=[run_taint(RUN, "other-team")])
    assert not claim(None, node, RUN, 1e9, namespace="ml-team")  # type: ignore[arg-type]
    node = _node(core, "n2", labels={LABEL_RUN_ID: "another-run"}, taints=[run_taint("another-run", "ml-team")])
    assert not claim(None, node, RUN, 1e9, namespace="ml-team")  # type: ignore[arg-type]
    assert core.patches == []


def test_claim_all_refuses_an_empty_namespace_before_any_write(core: type[_FakeCore]) -> None:
    node = _node(core, "n1")
    with pytest.raises(ValueError):
        claim_all(None, [node], RUN, 1e9, namespace="")  # type: ignore[arg-type]
    assert core.patches == []


@pytest.mark.parametrize("claim_taint", [run_taint(RUN, "ml-team"), run_taint(RUN, "other-team"),
                                         {"key": LEGACY_RUN_TAINT_KEY, "value": label_safe(RUN),
                                          "effect": "NoSchedule"}])
def test_unclaim_releases_new_and_old_claims_and_keeps_other_taints(core: type[_FakeCore],
                                                                     claim_taint: dict[str, str]) -> None:
    notice = {"key": "cloud.google.com/impending-node-termination", "value": "true", "effect": "NoSchedule"}
    _node(core, "n1", labels={LABEL_RUN_ID: label_safe(RUN)}, taints=[claim_taint, notice])
    assert unclaim(None, "n1")  # type: ignore[arg-type]
    assert core.store["n1"]["spec"]["taints"] == [GPU_TAINT, notice]
    assert LABEL_RUN_ID not in core.store["n1"]["metadata"]["labels"]
