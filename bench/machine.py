"""Where a window's CPU went on this machine: the control-plane scenario's profile of its job launch (a profile,
never a measurement of a side).

:func:`snapshot` reads ``/proc/stat`` (the machine's busy and total CPU time) and every process's ``utime + stime``
(``/proc/<pid>/stat`` fields 14 to 17, clock ticks: with the CPU of the children it reaped), grouped by what the process is: the control plane's own
processes by their binary (etcd, kube-apiserver, the scheduler, the controller-manager, KWOK, the Training
Operator, Kueue, JobSet, the Trainer, the cluster-autoscaler, Karpenter), the kfp-gpu controller with every process below it (its work
units), the cloud stand-ins (``kfp_gpu_rehearsal.sim``) and this bench process with its children. :func:`cpu_used`
is the difference of two snapshots in CPU seconds: ``cpu_capacity`` (wall x cores), ``cpu_busy`` (the whole
machine), one ``cpu_<group>`` per group. A window whose ``cpu_busy`` is near ``cpu_capacity`` is set by the
machine: every process on it waits for a core. A process that exited inside the window is counted in the machine's
``cpu_busy`` only, unless its parent reaped it.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

PROC = Path("/proc")
TICK = float(os.sysconf("SC_CLK_TCK"))
BIN_VERSION = re.compile(r"-v\d[^/]*$")  # the dev cluster's binaries: ~/.cache/kfp-gpu/bin/<name>-v<version>


@dataclass(frozen=True)
class Snapshot:
    busy: float  # the machine's busy CPU seconds since boot (user, nice, system, irq, softirq, steal)
    total: float  # busy + idle + iowait
    groups: dict[str, float] = field(default_factory=dict)  # CPU seconds of the live processes, by group


def _stat(pid: str) -> tuple[str, int, float] | None:
    """(comm, ppid, CPU seconds) of one process; None when it exited while being read."""
    try:
        raw = (PROC / pid / "stat").read_text()
    except OSError:
        return None
    comm, rest = raw[raw.index("(") + 1:raw.rindex(")")], raw[raw.rindex(")") + 2:].split()
    # fields 4 (ppid) and 14-17 of proc(5): its own CPU and that of its children it reaped (a work unit that exited
    # inside the window stays counted, in its forkserver's)
    return comm, int(rest[1]), sum(int(x) for x in rest[11:15]) / TICK


def _cmdline(pid: str) -> str:
    try:
        return (PROC / pid / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def group_of(cmdline: str) -> str:
    """The group of one process from its command line (no parent): "" when none of ours. The dev cluster's
    binaries (etcd, kube-apiserver, the scheduler, the controller-manager, KWOK, the Training Operator, Kueue,
    JobSet, the Trainer, the cluster-autoscaler, Karpenter) by their name without the version."""
    argv0 = cmdline.split(" ", 1)[0]
    if "/.cache/kfp-gpu/bin/" in argv0:
        return BIN_VERSION.sub("", argv0.rsplit("/", 1)[-1])
    if "kfp_gpu_rehearsal.sim" in cmdline:
        return "stand-in"
    if " controller" in cmdline and ("kfp-gpu" in cmdline or "kfp_gpu" in cmdline):
        return "kfp-gpu-controller"
    return ""


def snapshot(bench_pid: int | None = None) -> Snapshot:
    """The machine's CPU counters now; ``bench_pid`` (default: this process) and its descendants are "bench"."""
    me = os.getpid() if bench_pid is None else bench_pid
    cpu = (PROC / "stat").read_text().splitlines()[0].split()[1:]
    ticks = [int(x) for x in cpu[:8]]  # user nice system idle iowait irq softirq steal
    busy = sum(ticks) - ticks[3] - ticks[4]
    procs: dict[str, tuple[str, int, float]] = {}
    for entry in PROC.iterdir():
        if entry.name.isdigit() and (st := _stat(entry.name)) is not None:
            procs[entry.name] = st
    own: dict[str, str] = {}
    for pid in procs:
        g = "bench" if int(pid) == me else group_of(_cmdline(pid))
        if g:
            own[pid] = g
    groups: dict[str, float] = {}
    for pid, (_, ppid, secs) in procs.items():
        g, up, seen = own.get(pid, ""), str(ppid), 0
        while not g and up in procs and seen < 64:  # a work unit, a forkserver: its nearest grouped ancestor's
            g, up, seen = own.get(up, ""), str(procs[up][1]), seen + 1
        groups[g or "other"] = groups.get(g or "other", 0.0) + secs
    return Snapshot(busy / TICK, sum(ticks) / TICK, groups)


def cpu_used(before: Snapshot, after: Snapshot) -> dict[str, float]:
    """CPU seconds spent between two snapshots: ``cpu_capacity`` (the window's wall x the machine's cores),
    ``cpu_busy`` (the machine) and ``cpu_<group>`` per group (a group whose process exited unreaped can go down:
    it counts 0)."""
    out = {"cpu_capacity": round(after.total - before.total, 3),
           "cpu_busy": round(after.busy - before.busy, 3)}
    for g in sorted(set(before.groups) | set(after.groups)):
        out[f"cpu_{g}"] = round(max(0.0, after.groups.get(g, 0.0) - before.groups.get(g, 0.0)), 3)
    return out


# The API server's own request latency (its /metrics, read by the admin): the time the job's pod and Service
# creates spent inside the API server (admission, etcd), summed; beside the launch's wall it says whether the
# job's controller waited on the API server or on itself.
API_SERIES = {"api_post_pods": ('verb="POST"', 'resource="pods"'),
              "api_post_services": ('verb="POST"', 'resource="services"')}


def api_seconds(metrics_text: str) -> dict[str, float]:
    """From the API server's Prometheus text: per :data:`API_SERIES` key, ``<key>_s`` (the summed seconds of
    ``apiserver_request_duration_seconds``) and ``<key>_n`` (its count), over every matching label set."""
    out = {f"{k}_{x}": 0.0 for k in API_SERIES for x in ("s", "n")}
    for line in metrics_text.splitlines():
        if not line.startswith("apiserver_request_duration_seconds_"):
            continue
        name, _, value = line.rpartition(" ")
        kind = "s" if name.startswith("apiserver_request_duration_seconds_sum{") else \
            "n" if name.startswith("apiserver_request_duration_seconds_count{") else ""
        if not kind:
            continue
        for key, needles in API_SERIES.items():
            if all(n in name for n in needles) and 'subresource=""' in name:
                out[f"{key}_{kind}"] += float(value)
    return out


def api_diff(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """``after - before`` per key, rounded (counters: a restarted API server would go negative; counted 0)."""
    return {k: round(max(0.0, after.get(k, 0.0) - before.get(k, 0.0)), 4) for k in after}
