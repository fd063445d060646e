"""A step's progress while it runs, for whoever supervises it: the one channel from a running step to its owner.

A long step (training supervision) reports state changes here, e.g. a gang degraded by a preemption and whole
again after recovery. The controller's work unit (:mod:`kfp_gpu.controller.work`) points ``KFP_GPU_PROGRESS_FILE``
at a file it polls and turns each report into the gang's ``Degraded`` condition and an Event; without that
variable (a step run by hand, a test) a report is only logged. Reports are small JSON objects, replaced atomically,
newest wins: a supervisor that polls late sees the current state, never a torn one.
"""

from __future__ import annotations

import json
import logging
import os
import time
from typing import Any

ENV = "KFP_GPU_PROGRESS_FILE"
DEGRADED = "Degraded"
HEALTHY = "Healthy"
log = logging.getLogger(__name__)
_seq = 0


def report(state: str, reason: str, message: str, **fields: Any) -> None:
    """Publish the step's current state (``DEGRADED`` or ``HEALTHY``) with a CamelCase ``reason`` and a one-line
    ``message``. Never raises: progress is advisory and must not stop the work."""
    global _seq
    _seq += 1
    log.info("progress: %s (%s): %s", state, reason, message)
    path = os.environ.get(ENV, "")
    if not path:
        return
    body = {"seq": _seq, "t": time.time(), "state": state, "reason": reason, "message": message, **fields}
    try:
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(body, f)
        os.replace(tmp, path)
    except OSError as exc:
        log.warning("progress not published to %s: %s", path, exc)


def read(path: str) -> dict[str, Any] | None:
    """The newest report at ``path``, or None when there is none (or it cannot be read yet)."""
    try:
        with open(path, encoding="utf-8") as f:
            return dict(json.load(f))
    except (OSError, ValueError):
        return None
