"""GPU health decisions: the pre-launch probe gate and mid-run node health conditions. Pure, virtual time.

**The gate.** Before a job starts, every gang node that has not passed a probe yet (new, or a replacement) runs one
probe pod (:mod:`kfp_gpu.cluster.probe`; image ``images/gpu-probe``). The probe's exit code is its verdict
(:data:`PROBE_EXIT_REASONS`): 0 healthy; :data:`EXIT_DEVICE_COUNT` ``nvidia-smi`` lists fewer GPUs than the node's
allocatable ``nvidia.com/gpu``; :data:`EXIT_DCGM_DIAG` ``dcgmi diag -r <level>`` failed; :data:`EXIT_NCCL` the
gang's short all-reduce failed. :func:`gate` turns the results of one round into an action: pass, wait, replace
the bad nodes (another round probes their replacements), or give up after ``max_rounds`` rounds or once the gate's
time bound (``timeout_s``, from the gate's start) passed. A node whose probe has not answered when the round's
deadline comes is bad too ("no probe result").

**Node conditions.** A node problem detector or a vendor agent publishes GPU faults as Node conditions
(:data:`GPU_CONDITIONS`, each with its source). :func:`unhealthy` reads them; a gang node with one is bad at the
gate (no probe needed) and, mid-run, is replaced proactively at the next checkpoint boundary
(:func:`boundary_due`): the job keeps training until a checkpoint newer than the step at which the condition was
seen exists, so no completed step is lost to the swap.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from kfp_gpu.ownership import UNHEALTHY_TAINT as UNHEALTHY_TAINT

EXIT_DEVICE_COUNT = 2
EXIT_DCGM_DIAG = 3
EXIT_NCCL = 4
PROBE_EXIT_REASONS: Mapping[int, str] = {
    EXIT_DEVICE_COUNT: "nvidia-smi lists fewer GPUs than the node's allocatable nvidia.com/gpu",
    EXIT_DCGM_DIAG: "dcgmi diag failed",
    EXIT_NCCL: "the gang's NCCL all-reduce failed",
}


@dataclass(frozen=True)
class HealthCondition:
    """A Node condition type that reports a GPU fault when its status is ``bad_status``; ``source`` cites who
    publishes it."""

    type: str
    bad_status: str
    source: str


GPU_CONDITIONS: tuple[HealthCondition, ...] = (
    # AKS's node-problem-detector GPU checks (learn.microsoft.com/azure/aks/gpu-health-monitoring): "GPUMissing"
    # (nvidia-smi count vs the VM size) and "GPUXIDErrors" (Xid errors in the kernel log); NPD's convention is a
    # problem condition that is True while the problem lasts
    HealthCondition("GPUMissing", "True", "AKS node-problem-detector GPU health monitoring"),
    HealthCondition("GPUXIDErrors", "True", "AKS node-problem-detector GPU health monitoring"),
    # EKS node monitoring agent (docs.aws.amazon.com/eks/latest/userguide/node-health.html): the
    # AcceleratedHardwareReady condition turns False on NVIDIA Xid / DCGM / NVLink faults; EKS node auto repair
    # replaces such a node only 10 minutes later (docs.aws.amazon.com/eks/latest/userguide/node-repair.html)
    HealthCondition("AcceleratedHardwareReady", "False", "EKS node monitoring agent"),
)


def unhealthy(conditions: Mapping[str, str], extra: Iterable[str] = ()) -> str:
    """The first GPU fault the Node ``conditions`` (type -> status) report, as ``"<type>=<status>"``, or "" when
    none. ``extra`` condition types (the spec's ``health.conditions``) count as faults when ``"True"``."""
    for c in GPU_CONDITIONS:
        if conditions.get(c.type) == c.bad_status:
            return f"{c.type}={c.bad_status}"
    for t in extra:
        if conditions.get(t) == "True":
            return f"{t}=True"
    return ""


@dataclass(frozen=True)
class ProbeResult:
    """One probe pod's answer: ``exit_code`` None while it runs (or has not started)."""

    node: str
    exit_code: int | None = None
    at: float = 0.0


class GateAction(str, enum.Enum):
    PASS = "pass"  # every node healthy: start the job
    WAIT = "wait"  # probes still running
    REPLACE = "replace"  # release and replace ``bad``, then probe the replacements (next round)
    GIVE_UP = "give-up"  # bad nodes after the last round, or the time bound passed


@dataclass(frozen=True)
class GateVerdict:
    action: GateAction
    bad: tuple[tuple[str, str], ...] = ()  # (node, why)
    next_deadline: float | None = None  # WAIT: look again by then
    message: str = ""


def probe_reason(exit_code: int) -> str:
    return PROBE_EXIT_REASONS.get(exit_code, f"the probe exited {exit_code}")


def gate(nodes: Iterable[str], results: Mapping[str, ProbeResult], conditions: Mapping[str, str], *, now: float,
         gate_started: float, round_started: float, round_no: int, probe_timeout_s: float, timeout_s: float,
         max_rounds: int) -> GateVerdict:
    """The gate's action for round ``round_no`` (1-based) over ``nodes`` (the nodes probed in this round).

    ``results`` holds the probes' answers by node; ``conditions`` the fault :func:`unhealthy` found on a node (by
    node; absent = none). A node with a condition is bad at once; the others are judged once every probe answered
    or the round's deadline (``round_started + probe_timeout_s``, never past ``gate_started + timeout_s``) passed.
    """
    names = tuple(nodes)
    end = gate_started + timeout_s
    deadline = min(round_started + probe_timeout_s, end)
    bad: list[tuple[str, str]] = []
    pending: list[str] = []
    for n in names:
        if conditions.get(n):
            bad.append((n, f"node condition {conditions[n]}"))
            continue
        r = results.get(n)
        if r is None or r.exit_code is None:
            pending.append(n)
        elif r.exit_code != 0:
            bad.append((n, probe_reason(r.exit_code)))
    if pending and now < deadline:
        return GateVerdict(GateAction.WAIT, tuple(bad), next_deadline=deadline)
    bad += [(n, f"no probe result within {deadline - round_started:g}s") for n in pending]
    if not bad:
        return GateVerdict(GateAction.PASS, message=f"{len(names)} node(s) passed the GPU health probe")
    listing = ", ".join(f"{n} ({why})" for n, why in bad)
    if round_no >= max_rounds:
        return GateVerdict(GateAction.GIVE_UP, tuple(bad), message=(
            f"GPU health gate: bad node(s) after {round_no} round(s) (health.max_rounds={max_rounds}): {listing}"))
    if now >= end:
        return GateVerdict(GateAction.GIVE_UP, tuple(bad), message=(
            f"GPU health gate: bad node(s) when its {timeout_s:g}s bound (health.timeout_s) passed: {listing}"))
    return GateVerdict(GateAction.REPLACE, tuple(bad), message=f"GPU health gate round {round_no}: replacing {listing}")


def boundary_due(*, flagged_at_step: int, newest_checkpoint_step: int, flagged_at: float, now: float,
                 max_wait_s: float) -> bool:
    """Mid-run: is it time to replace a node flagged unhealthy when the newest checkpoint was ``flagged_at_step``?

    At the next checkpoint boundary (a checkpoint newer than ``flagged_at_step`` exists), or once ``max_wait_s``
    passed since the flag (a trainer that stopped checkpointing must not keep a failing GPU forever).
    """
    return newest_checkpoint_step > flagged_at_step or now - flagged_at >= max_wait_s
