"""The one component runner of the dev cluster (kfp_gpu_rehearsal/devcluster/runner.py), on a fake table of trivial
processes (``sleep``) in a private state dir: start, re-use, restart on a changed fingerprint, status, cleanup and
stop. The shared cluster is never touched (no real component starts here)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from kfp_gpu_rehearsal.devcluster import procs, runner
from kfp_gpu_rehearsal.devcluster.procs import BootError
from kfp_gpu_rehearsal.devcluster.runner import Component, Ctx, Unit
from kfp_gpu_rehearsal.devcluster.versions import Versions

SLEEP = Path(shutil.which("sleep") or "/bin/sleep")


def _ctx(tmp_path: Path) -> Ctx:
    bins = {"a": tmp_path / "bin" / "a", "b": tmp_path / "bin" / "b"}
    (tmp_path / "bin").mkdir()
    for b in bins.values():
        b.symlink_to(SLEEP)  # a binary of its own name, so the pid check tells them apart
    state = tmp_path / "state"
    state.mkdir()
    return Ctx(state=state, pki=state / "pki", bins=bins, ports={}, versions=Versions.load())


def _comp(name: str, seconds: str = "300", **kw: object) -> Component:
    """A ``sleep`` that is healthy once it has exec'd (a real probe answers only from the running binary)."""
    return Component(name, (), lambda c: [str(c.bins[name]), seconds],
                     lambda c: procs.running_pid(c.state, name, c.bins[name]) is not None, timeout=5.0,
                     stop_timeout=5.0, **kw)  # type: ignore[arg-type]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0] != "Z"


def test_a_unit_starts_in_order_is_reused_and_stops_in_reverse(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    c = _ctx(tmp_path)
    seen: list[str] = []
    unit = Unit("pair", (_comp("a", after=lambda c: seen.append("a") or ""),
                         _comp("b", before=lambda c: seen.append("before b"), after=lambda c: seen.append("b") or " ok")),
                off_hint="up --with pair starts it", cleanup=lambda c: seen.append("cleanup") or ["hook"])
    assert runner.status(c, unit) == {"pair": "stopped (profile off; up --with pair starts it)"}
    status: dict[str, str] = {}
    try:
        runner.up(c, unit, True, status, 0.0)
        assert status == {"a": "started", "b": "started"} and seen == ["a", "before b", "b"]
        pids = runner.pids(c, unit)
        assert set(pids) == {"a", "b"} and all(_alive(p) for p in pids.values())
        assert runner.status(c, unit) == {n: f"running pid={p} healthy" for n, p in pids.items()}
        runner.up(c, unit, True, status, 0.0)  # same fingerprint, healthy: re-used
        assert status == {"a": "running", "b": "running"} and runner.pids(c, unit) == pids
        runner.up(c, unit, False, status, 0.0)  # not wanted but running: left alone, no cleanup
        assert runner.pids(c, unit) == pids and "cleanup" not in seen
        assert "left running" in capsys.readouterr().out
    finally:
        assert runner.stop(c, unit)
    assert seen[-1] == "cleanup" and not any(_alive(p) for p in pids.values())
    assert runner.pids(c, unit) == {} and not runner.stop(c, unit)
    runner.up(c, unit, False, status, 0.0)  # not wanted, not running: what it left behind is cleaned up
    assert "removed its stale webhook configurations" in capsys.readouterr().out


def test_a_changed_fingerprint_restarts_the_process(tmp_path: Path) -> None:
    c = _ctx(tmp_path)
    first = Unit("one", (_comp("a", "300"),))
    try:
        runner.up(c, first, True, {}, 0.0)
        old = runner.pids(c, first)["a"]
        assert runner.recorded_fingerprint(c, first.processes[0]) == runner.component_fingerprint(c, first.processes[0])
        changed = Unit("one", (_comp("a", "301"),))
        assert runner.component_fingerprint(c, changed.processes[0]) != runner.recorded_fingerprint(c, changed.processes[0])
        status: dict[str, str] = {}
        runner.up(c, changed, True, status, 0.0)
        new = runner.pids(c, changed)["a"]
        assert status == {"a": "started"} and new != old and not _alive(old)
    finally:
        runner.stop(c, first)


def test_the_fingerprint_counts_config_files_by_name_and_content(tmp_path: Path) -> None:
    one, two = tmp_path / "x", tmp_path / "y"
    one.mkdir(), two.mkdir()
    for d in (one, two):
        (d / "stages.yaml").write_text("a: 1\n")
    assert runner.fingerprint([f"--config={one / 'stages.yaml'}"]) == runner.fingerprint([f"--config={two / 'stages.yaml'}"])
    (two / "stages.yaml").write_text("a: 2\n")
    assert runner.fingerprint([f"--config={one / 'stages.yaml'}"]) != runner.fingerprint([f"--config={two / 'stages.yaml'}"])
    assert runner.fingerprint(["x"], {"K": "1"}) != runner.fingerprint(["x"], {"K": "2"})


def test_an_unhealthy_process_fails_the_start_with_its_log(tmp_path: Path) -> None:
    c = _ctx(tmp_path)
    unit = Unit("dead", (Component("a", (), lambda c: [str(c.bins["a"]), "0"], lambda c: False, timeout=5.0),))
    with pytest.raises(BootError, match="a: process exited during startup"):
        runner.up(c, unit, True, {}, 0.0)


def test_the_table_has_one_row_per_unit_and_every_process_once() -> None:
    from kfp_gpu_rehearsal.devcluster import extras
    from kfp_gpu_rehearsal.devcluster.table import UNITS

    names = [u.name for u in UNITS]
    processes = [p.name for u in UNITS for p in u.processes]
    assert len(set(names)) == len(names) and len(set(processes)) == len(processes)
    assert names[0] == "core" and not UNITS[0].optional and all(u.optional for u in UNITS[1:])
    assert set(extras.names()) | {"core", "cluster-autoscaler"} == set(names)
    assert names.index("trainer") < names.index("kueue")  # Kueue reads the Trainer's CRDs at its start


def test_down_only_names_an_optional_unit_or_says_which_exist() -> None:
    from kfp_gpu_rehearsal.devcluster import boot

    with pytest.raises(BootError, match="unknown local-cluster component 'core': choose from cluster-autoscaler, "
                                        "trainer, kueue, gcs, karpenter"):
        boot.down(only=("core",))  # refused before anything is read or stopped
