"""One row of the fault-detection table (docs/faults.md), recorded by the integration test that measured it.

Each fault test (names contain stall, hang, straggler, health or notice) runs one fault under one side and calls
``record``. Rows go to ``$KFP_GPU_FAULT_ROWS/<fault>.<side>.json`` when that variable names a directory (``make
faults`` sets it to bench/results/faults and then renders the doc with ``python -m bench.report_faults``); otherwise
to a temporary directory, so a plain ``make test`` leaves the tree clean. The row carries the commit it was measured
on. Times are world seconds (the world's clock, docs/sim.md), GPU-minutes are world GPU-minutes.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path

FAULTS = ("hang", "slow_node", "bad_gpu_launch", "xid_midrun", "preemption_notice")
SIDES = ("kfp_gpu", "training_operator", "jobset")


def rows_dir() -> Path:
    target = os.environ.get("KFP_GPU_FAULT_ROWS")
    path = Path(target) if target else Path(tempfile.gettempdir()) / "kfp-gpu-fault-rows"
    path.mkdir(parents=True, exist_ok=True)
    return path


def _commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10,
                             cwd=Path(__file__).resolve().parents[2], check=False)
        return out.stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def record(fault: str, side: str, *, test: str, detection_s: float | None, action: str,
           steps_lost: float | None, gpu_minutes_wasted: float | None, note: str = "") -> Path:
    """Write one measured row. ``None`` means "never" (e.g. the fault was not detected before the test's horizon);
    ``note`` says what the horizon was. Raises ValueError on an unknown fault or side (a typo must not make a row
    that the doc silently drops)."""
    if fault not in FAULTS:
        raise ValueError(f"fault {fault!r} is not one of {FAULTS}")
    if side not in SIDES:
        raise ValueError(f"side {side!r} is not one of {SIDES}")
    row = {"fault": fault, "side": side, "test": test, "detection_s": detection_s, "action": action,
           "steps_lost": steps_lost, "gpu_minutes_wasted": gpu_minutes_wasted, "note": note, "commit": _commit()}
    path = rows_dir() / f"{fault}.{side}.json"
    path.write_text(json.dumps(row, indent=2, sort_keys=True) + "\n")
    return path
