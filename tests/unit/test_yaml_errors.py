"""A user's YAML file that does not parse (a scenario, a quota schedule) is named with the line and column of the
problem, in one line, and a scenario is read before `kfp-gpu run` boots anything."""

from __future__ import annotations

from pathlib import Path

import pytest

from kfp_gpu import cli
from kfp_gpu.errors import InvalidSpec
from kfp_gpu.quota_plan import load_schedule
from kfp_gpu_rehearsal.devcluster import boot
from kfp_gpu_rehearsal.sim import scenario

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "tests/integration/pipelines/tiny_pipeline.py"
BAD = "runs:\n  - name: a\n    gpus: 8\n  nope: : x\n"  # line 4: a mapping value where none may be


def test_a_schedule_that_is_not_yaml_is_named_by_its_file_and_line(tmp_path: Path) -> None:
    f = tmp_path / "runs.yaml"
    f.write_text(BAD)
    with pytest.raises(InvalidSpec) as err:
        load_schedule(f)
    msg = cli.one_line(err.value)
    assert msg.startswith(f"kfp-gpu: invalid schedule='{f}': is not valid YAML (line 4, column "), msg
    assert "\n" not in msg and "(fix: fix the YAML at that line" in msg
    with pytest.raises(InvalidSpec, match="is a directory, not a file"):
        load_schedule(tmp_path)


def test_a_scenario_that_is_not_yaml_fails_run_before_the_cluster_boots(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    f = tmp_path / "world.yaml"
    f.write_text(BAD)
    booted: list[object] = []
    monkeypatch.setattr(boot, "up", lambda **kw: booted.append(kw) or pytest.fail("booted before the scenario was read"))
    assert cli.main(["run", str(TINY), "--scenario", str(f)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"kfp-gpu: invalid scenario='{f}': is not valid YAML (line 4, column ")
    assert booted == []
    assert cli.main(["run", str(TINY), "--scenario", str(tmp_path / "missing.yaml")]) == 2
    assert "cannot be read (No such file or directory)" in capsys.readouterr().err
    assert booted == []


def test_the_bundled_scenarios_still_load_by_name() -> None:
    assert scenario.load("topology").pools and scenario.load(None).pools
