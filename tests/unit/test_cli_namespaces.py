"""Commands that take a namespace refuse a name Kubernetes would refuse, in one line, before reading any credentials
(KUBECONFIG points at a file that does not exist: reaching it would be a different error)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kfp_gpu import cli


@pytest.mark.parametrize("argv,flag", [
    (["gc", "--namespace", "Team_A"], "--namespace"),
    (["gc", "--namespace", "ok", "--lock-namespace", "x" * 64], "--lock-namespace"),
    (["controller", "--namespace", "Team_A"], "--namespace"),
    (["controller", "--leader-elect-resource-namespace", "a.b"], "--leader-elect-resource-namespace"),
    (["tenant", "add", "Team_A"], "namespace"),
    (["tenant", "remove", "Team_A"], "namespace"),
])
def test_a_bad_namespace_is_refused_before_the_cluster_is_reached(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        argv: list[str], flag: str) -> None:
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "absent"))
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith(f"kfp-gpu: invalid {flag}='") and "must be a namespace name, a DNS-1123 label" in err[0]
    assert err[0].endswith("(fix: use a name such as ml-team)")
