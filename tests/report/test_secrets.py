from __future__ import annotations

import json

from kfp_gpu.report import cost_report, render_html, scan_for_secrets
from kfp_gpu.report.terminal import gantt
from kfp_gpu.spec import ProvisioningSpec
from tests.report._timelines import make_timeline

SA_KEY = json.dumps({
    "type": "service_account", "project_id": "p", "private_key_id": "0123456789abcdef",
    "private_key": "-----BEGIN PRIVATE KEY-----\\nMIIEv...\\n-----END PRIVATE KEY-----\\n",
}, indent=1)


def test_detects_each_kind() -> None:
    cases = {
        "aws_access_key_id = AKIAIOSFODNN7EXAMPLE": "AWS access key id",
        "aws_secret_access_key: wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY": "AWS secret access key",
        "-----BEGIN RSA PRIVATE KEY-----": "private key block",
        '{"token": "eyJhbGciOiJSUzI1NiJ9.abc.def"}': "token field",
        "Authorization: Bearer ya29.a0AfH6SMBx3xyz1234567890": "bearer token",
        "GITHUB=ghp_abcdefghijklmnopqrstuvwxyz0123456789": "GitHub token",
    }
    for text, kind in cases.items():
        found = scan_for_secrets(text)
        assert any(kind in f for f in found), (text, found)
        assert all("EXAMPLEKEY" not in f and "eyJhbGciOiJSUzI1NiJ9" not in f for f in found)  # redacted
    sa = scan_for_secrets(SA_KEY)
    assert sum("GCP service-account key" in f for f in sa) >= 2
    assert any(f.startswith("line ") for f in sa)


def test_ignores_placeholders_and_ordinary_yaml() -> None:
    clean = """
    pipelineInfo: {name: train}
    token: '{{$.inputs.parameters['token']}}'
    "token": "$(KFP_TOKEN)"
    token: ${TOKEN}
    serviceAccountName: kfp-gpu-runner
    image: ghcr.io/kfp-gpu/kfp-gpu:0.1.0
    command: [python, -m, kfp_gpu]
    """
    assert scan_for_secrets(clean) == []


def test_reports_are_clean(spec: ProvisioningSpec) -> None:
    tl = make_timeline(8, preempt=2)
    cost = cost_report(spec, tl)
    for text in (render_html(title="r", timeline=tl, cost=cost), cost.to_markdown(), gantt(tl)):
        assert scan_for_secrets(text) == []


def test_write_run_report_bundle(tmp_path, spec: ProvisioningSpec) -> None:  # type: ignore[no-untyped-def]
    from kfp_gpu.report import write_run_report
    from kfp_gpu.timeline import Timeline

    tl = make_timeline(4)
    paths = write_run_report(tmp_path / "out", spec=spec, timeline=tl)
    assert set(paths) == {"report.html", "timeline.svg", "cost.md", "cost.json", "timeline.txt", "timeline.json"}
    assert Timeline.from_json(paths["timeline.json"].read_text()).nodes.keys() == tl.nodes.keys()
    assert json.loads(paths["cost.json"].read_text())["gpus"] == 32
