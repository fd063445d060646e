"""No credential value ever lands in compiled YAML, component YAML, manifests or reports."""

from pathlib import Path

import pytest

from kfp_gpu.compile import compile_pipeline
from kfp_gpu.report.html import render_html
from kfp_gpu.report.secrets import scan_for_secrets
from kfp_gpu.timeline import NodeState, Timeline

ROOT = Path(__file__).resolve().parents[2]


def test_scanner_catches_a_planted_key():
    assert scan_for_secrets("aws_access_key_id: AKIAIOSFODNN7EXAMPLE\n")


@pytest.mark.parametrize("target", ["kfp", "vertex"])
def test_compiled_pipeline_has_no_secrets(tmp_path, target):
    text = compile_pipeline(ROOT / "pipelines/llm_finetune.py", tmp_path / "p.yaml", target=target).read_text()
    assert scan_for_secrets(text) == []


def test_checked_in_yaml_and_manifests_have_no_secrets():
    paths = [*ROOT.glob("components/*/component.yaml"), *ROOT.glob("pipelines/*.yaml"), *ROOT.glob("deploy/*.yaml")]
    assert len(paths) >= 8
    for p in paths:
        assert scan_for_secrets(p.read_text()) == [], p


def test_report_has_no_secrets():
    tl = Timeline("run-1")
    n = tl.node("n0", pool="p", zone="us-central1-a", gpus=8)
    n.advance(NodeState.REGISTERED, 1.0)
    n.advance(NodeState.READY, 2.0)
    assert scan_for_secrets(render_html(title="t", timeline=tl)) == []
