"""kfp_gpu.progress: a running step's reports reach its supervisor newest-first and only once; without a supervisor a
report is only logged (a step run by hand must not fail for want of one)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kfp_gpu import progress


def test_reports_replace_each_other_and_carry_their_fields(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "progress.json"
    monkeypatch.setenv(progress.ENV, str(path))
    progress.report(progress.DEGRADED, "Recovering", "node n1 lost", preemptions=1)
    first = progress.read(str(path))
    progress.report(progress.HEALTHY, "Recovered", "whole again", preemptions=1)
    second = progress.read(str(path))
    assert first is not None and second is not None
    assert (first["state"], first["reason"], first["preemptions"]) == ("Degraded", "Recovering", 1)
    assert (second["state"], second["reason"]) == ("Healthy", "Recovered")
    assert second["seq"] > first["seq"]
    assert sorted(os.listdir(tmp_path)) == ["progress.json"]  # no temporary file left behind


def test_without_a_supervisor_a_report_is_only_logged(monkeypatch: pytest.MonkeyPatch,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.delenv(progress.ENV, raising=False)
    with caplog.at_level("INFO"):
        progress.report(progress.DEGRADED, "Recovering", "node n1 lost")
    assert "Degraded (Recovering): node n1 lost" in caplog.text


def test_an_unwritable_sink_never_raises(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(progress.ENV, str(tmp_path / "missing-dir" / "progress.json"))
    progress.report(progress.HEALTHY, "Recovered", "whole again")  # logged as a warning, not raised
    assert progress.read(str(tmp_path / "missing-dir" / "progress.json")) is None
