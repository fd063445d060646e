"""A controller work unit (kfp_gpu.controller.work) without a cluster: forked from the forkserver, it runs the
step function and hands back its outcome; a bad spec comes back as the step's one error, logged to its file."""

from __future__ import annotations

import json
from pathlib import Path

from kfp_gpu.controller.work import Work
from kfp_gpu.spec import ProvisioningSpec


def test_a_unit_returns_the_steps_error_and_logs_it(tmp_path: Path) -> None:
    spec = json.loads(ProvisioningSpec("a100-80gb", 2).to_json())
    spec["nodes"] = 0  # invalid: the step refuses it before any I/O
    log = tmp_path / "unit.log"
    w = Work("Preflighted", "preflight", json.dumps(spec), "run-1", "", log)
    out = w.wait(60)
    assert out.ok is False and out.error is not None
    assert out.error["type"] == "InvalidSpec" and out.error["fields"]["field"] == "nodes"
    assert w.proc.exitcode == 2  # InvalidSpec's exit code, as a step pod would exit
    assert "kfp-gpu preflight failed: invalid nodes=0" in log.read_text()
    w.cancel()  # after the end: nothing to signal, and no error
    assert w.poll() is out
