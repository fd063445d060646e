"""The platform admin's NodePool template additions ($KFP_GPU_KARPENTER_TEMPLATE): parsed, refused in one line."""

from __future__ import annotations

import json

import pytest

from kfp_gpu.errors import KfpGpuError
from kfp_gpu.plan import karpenter as k
from kfp_gpu.plan.nodepool_template import template_extras

ENV = "KFP_GPU_KARPENTER_TEMPLATE"


def _body(**extras: object) -> dict[str, object]:
    return k.nodepool_body("np", labels={}, annotations={}, instance_types=["p4d.24xlarge"],
                           cand=k.Candidate("us-east-1b", "spot"), limit_nodes=2, gpus_per_node=8, run_label="r1",
                           namespace="team-a", node_class={"group": "g", "kind": "K", "name": "n"},
                           **extras)  # type: ignore[arg-type]


def test_labels_and_startup_taints_go_into_the_nodepools_template_beside_the_runs_taint() -> None:
    raw = json.dumps({"labels": {"example.com/team": "ml"},
                      "startupTaints": [{"key": "example.com/agent-not-ready", "effect": "NoExecute"}]})
    template = _body(**template_extras(ENV, raw))["spec"]["template"]  # type: ignore[index]
    assert template["metadata"] == {"labels": {"example.com/team": "ml"}}
    assert template["spec"]["startupTaints"] == [{"key": "example.com/agent-not-ready", "effect": "NoExecute"}]
    assert template["spec"]["taints"] == [{"key": "team-a.nodepools.kfp-gpu.io/run", "value": "r1",
                                           "effect": "NoSchedule"}]


def test_unset_leaves_the_template_as_before() -> None:
    assert template_extras(ENV, "") == {} and template_extras(ENV, "  ") == {}
    template = _body(**template_extras(ENV, ""))["spec"]["template"]  # type: ignore[index]
    assert "metadata" not in template and "startupTaints" not in template["spec"]


@pytest.mark.parametrize(("raw", "names"), [
    ("{labels: 1}", "not JSON"),
    ('{"taints": []}', "keys among labels, startupTaints"),
    ('{"labels": ["a"]}', "labels must be an object"),
    ('{"labels": {"bad key!": "x"}}', "not a valid label"),
    ('{"labels": {"a": "v" }, "startupTaints": {"key": "a"}}', "startupTaints must be a list"),
    ('{"labels": {"kfp-gpu.io/run-id": "r9"}}', "kfp-gpu sets this node label itself"),
    ('{"startupTaints": [{"key": "a", "effect": "Never"}]}', "effect among NoSchedule"),
    ('{"startupTaints": [{"key": "team-b.claims.kfp-gpu.io/run", "effect": "NoSchedule"}]}',
     "kfp-gpu sets and removes this taint itself"),
])
def test_a_bad_value_is_one_line_naming_the_variable_the_value_and_the_fix(raw: str, names: str) -> None:
    with pytest.raises(KfpGpuError) as err:
        template_extras(ENV, raw)
    text = str(err.value)
    assert text.startswith(f"{ENV}: ") and names in text and "(fix: set KFP_GPU_KARPENTER_TEMPLATE to JSON" in text
    assert "\n" not in text


def test_the_controller_refuses_a_bad_template_before_any_cluster_call(monkeypatch: pytest.MonkeyPatch,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    from kfp_gpu.cli import main

    monkeypatch.setenv(ENV, '{"labels": {"kfp-gpu.io/run-id": "r9"}}')
    monkeypatch.setenv("KUBECONFIG", "/nonexistent/kubeconfig")
    code = main(["controller", "--standalone", "--metrics-port", "0"])
    err = capsys.readouterr().err
    assert code != 0 and err.count("\n") == 1, err
    assert "KFP_GPU_KARPENTER_TEMPLATE" in err and "kfp-gpu.io/run-id" in err
