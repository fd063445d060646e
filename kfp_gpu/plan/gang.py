"""What the controller does next for one GpuGang: a pure function of the object and what is running.

The controller's per-gang loop (:mod:`kfp_gpu.controller.runner`) calls :func:`next_action` after every change it
sees and does what it says; nothing here does I/O, so the transition table is tested with plain dicts. The rows,
in priority order (the first that matches wins):

| observed                                              | action                                     |
|-------------------------------------------------------|--------------------------------------------|
| released already (condition Released=True)            | WAIT (nothing left to do)                  |
| release asked, never admitted, nothing running        | RELEASED (no work, no cloud call)          |
| release asked (spec.release, deletion, owner gone,    | CANCEL running work, then RELEASE          |
| the policy's maxRunSeconds passed)                    |                                            |
| no policy verdict yet                                 | ADMIT (evaluate the GpuPolicies)           |
| policy refused                                        | WAIT (the steps read the condition)        |
| a stage at or below spec.stage not True, none running | RUN_STAGE (the lowest such stage)          |
| a stage failed (condition False, reason Failed)       | WAIT for release (stages after it never run)|
| spec.jobs entry not done and not running              | RUN_JOB (after Provisioned=True)           |
| otherwise                                             | WAIT                                       |

A stage whose work was interrupted (the controller was killed) has no True condition and no running work, so it
runs again: the step functions re-attach through their ledgers, so a rerun converges instead of acting twice.
A job marked Running whose work is not running (the controller restarted) is run again the same way: the train
step re-attaches to the job it created.
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from kfp_gpu.gang import api


class Do(str, enum.Enum):
    WAIT = "wait"
    CANCEL = "cancel"
    RELEASE = "release"
    RELEASED = "released"  # mark Released: nothing was ever done (no admission), so nothing is called
    ADMIT = "admit"
    RUN_STAGE = "run-stage"
    RUN_JOB = "run-job"


@dataclass(frozen=True)
class Action:
    do: Do
    what: str = ""  # the stage or job name
    reason: str = ""


FAILED = "Failed"  # condition reason of a stage whose step raised
DENIED = "PolicyDenied"


def release_reason(obj: Mapping[str, Any], owner_gone: str = "", now: float | None = None) -> str:
    """Why the gang must be released now, or "" (``owner_gone``: the owner check's verdict, "" while alive;
    ``now``: unix seconds, checked against ``status.runDeadline``, the GpuPolicy's maxRunSeconds from admission)."""
    if (obj.get("metadata") or {}).get("deletionTimestamp"):
        return "the GpuGang is being deleted"
    if (obj.get("spec") or {}).get("release"):
        return "teardown asked for release"
    if owner_gone:
        return f"its owner is gone ({owner_gone})"
    deadline = float((obj.get("status") or {}).get("runDeadline") or 0.0)
    if now is not None and deadline and now >= deadline:
        return "the run reached its GpuPolicy's maxRunSeconds"
    return ""


def next_action(obj: Mapping[str, Any], running: Collection[str], owner_gone: str = "",
                now: float | None = None) -> Action:
    """The next thing to do for ``obj`` (a GpuGang as JSON) while ``running`` names the work in flight
    (stage names and ``job:<name>``); ``now`` (unix seconds) for the run's deadline."""
    o = dict(obj)
    if api.is_true(o, api.RELEASED):
        return Action(Do.WAIT, reason="released")
    why = release_reason(o, owner_gone, now)
    admitted = api.condition(o, api.POLICY_ADMITTED)
    if why and not running and (admitted is None or admitted.get("status") != "True"):
        return Action(Do.RELEASED, reason=f"{why}; nothing was provisioned (never admitted)")
    if why:
        return Action(Do.CANCEL, reason=why) if running else Action(Do.RELEASE, reason=why)
    if admitted is None:
        return Action(Do.ADMIT)
    if admitted.get("status") != "True":
        return Action(Do.WAIT, reason="policy refused")
    spec = o.get("spec") or {}
    want = api.stage_index(str(spec.get("stage") or ""))
    for stage in api.STAGES[: want + 1]:
        c = api.condition(o, stage)
        if c and c.get("status") == "True":
            continue
        if stage in running:
            return Action(Do.WAIT, stage, "running")
        if c and c.get("reason") == FAILED:
            return Action(Do.WAIT, stage, "failed")
        return Action(Do.RUN_STAGE, stage)
    if not api.is_true(o, api.PROVISIONED):
        return Action(Do.WAIT)
    done = (o.get("status") or {}).get("jobs") or {}
    for name in sorted(spec.get("jobs") or {}):
        if f"job:{name}" in running or (done.get(name) or {}).get("state") in api.JOB_DONE:
            continue
        return Action(Do.RUN_JOB, name)
    return Action(Do.WAIT)


def phase(obj: Mapping[str, Any], running: Collection[str]) -> str:
    """The one-word phase for ``kubectl get`` (see :mod:`kfp_gpu.gang.api`)."""
    o = dict(obj)
    if api.is_true(o, api.RELEASED):
        return "Released"
    if release_reason(o):
        return "Releasing"
    admitted = api.condition(o, api.POLICY_ADMITTED)
    if admitted is not None and admitted.get("status") != "True":
        return "Denied"
    if any((api.condition(o, s) or {}).get("reason") == FAILED for s in api.STAGES):
        return "Failed"
    if any(r.startswith("job:") for r in running):
        return "Recovering" if api.is_true(o, api.DEGRADED) else "Training"
    names = {api.PREFLIGHTED: "Preflighting", api.WARM_POOL_HELD: "WarmPool", api.PROVISIONED: "Provisioning"}
    for stage in api.STAGES:
        if stage in running:
            return names[stage]
    if api.is_true(o, api.PROVISIONED):
        jobs = ((o.get("status") or {}).get("jobs") or {}).values()
        if any(j.get("state") == api.JOB_FAILED for j in jobs):
            return "Failed"
        return "Ready"
    return "Pending"
