"""docs/benchmarks.md, the control-plane section: the full run's table, where its job launch went, and the
development re-runs of that scenario alone (``bench/results/control_plane*.json``, written by ``python -m bench.run
--full --only control-plane ... --out``), each with the commit it ran on. A re-run is shown beside the full run,
never instead of it: the full run is the one every side shares."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench import report_recovery
from bench.report_targets import med, stage_error

NOTE = ("Seconds, median of the repeats. *world: last node Ready* is not a step: the bench's external watch saw the "
        "last Node Ready with GPUs that long after the warm pool step began (zero boot still means the stand-in "
        "registering the Nodes and KWOK readying them on this 2-core control plane): the floor under warm pool + "
        "scale-up.")
PATH = ("Each step is a `kfp_gpu.gang.client.request` call with the tenant's token (the bench's kfp-gpu controller "
        "does the work, `bench/overhead.py`); *job launch* = the train request -> the job's pods all bound to nodes "
        "(the bench's pod watch); *above world* = total - world: last node Ready, per repeat (the control plane's "
        "time above the world's own node-Ready time).")


def _cell(s: dict[str, Any] | None, key: str) -> str:
    return report_recovery.cell(s, key, 2)


TITLES = {"pytorchjob": "PyTorchJob", "trainjob": "TrainJob"}  # kfp_gpu.jobkinds NAME -> the kind users know


def _kind(cp: dict[str, Any], g: int) -> str:
    name = str(cp[str(g)].get("job_kind") or "pytorchjob")
    return TITLES.get(name, name)


def table(cp: dict[str, Any]) -> list[str]:
    """The per-size table of one control-plane result (a full run's ``control_plane`` or a re-run's)."""
    sizes = sorted(int(k) for k in cp if k.isdigit())
    recorded = [k for k in ("above_world", "launch_alone", "above_world_and_operator")  # later columns: when recorded
                if any(k in (cp[str(g)].get("stats") or {}) for g in sizes)]
    lines = ["| GPUs | job kind | total | preflight | warm pool | scale-up | job launch | world: last node Ready |"
             + "".join(f" {EXTRA[k]} |" for k in recorded), "|---|---|---|---|---|---|---|---|" + "---|" * len(recorded)]
    if "error" in cp:
        lines.append(f"| FAILED: {stage_error(cp)} | | | | | | | |" + " |" * len(recorded))
    for g in sizes:
        st = cp[str(g)]["stats"]
        lines.append(f"| {g} | {_kind(cp, g)} | {_cell(st, 'total')} | {_cell(st, 'preflight')} | "
                     f"{_cell(st, 'warm_pool')} | {_cell(st, 'scale_up')} | {_cell(st, 'job_launch')} | "
                     f"{_cell(st, 'world_nodes_ready')} |" + "".join(f" {_cell(st, k)} |" for k in recorded))
    return lines


EXTRA = {"above_world": "above world", "launch_alone": "job launch, Training Operator alone",
         "above_world_and_operator": "above world and the operator alone"}
ALONE = ("*job launch, Training Operator alone*: once ours has run, the bench creates the same PyTorchJob (the pod "
         "templates kfp-gpu rendered) on the same claimed nodes with no kfp-gpu step, timed by the same watch "
         "(create -> all pods bound): the upstream operator's own launch of this job on this machine (the dev cluster runs it "
         "with `--controller-threads=4 --kube-api-qps=100 --kube-api-burst=200`; one job's pods are created by one "
         "reconcile); *above world and the operator "
         "alone* = above world - that, per repeat: what kfp-gpu adds above both.")


def _alone_note(cp: dict[str, Any]) -> list[str]:
    return ["", ALONE] if any("launch_alone" in (v.get("stats") or {}) for k, v in cp.items() if k.isdigit()) else []


def _where(ps: dict[str, Any], prefix: str) -> str | None:
    """Busy CPU against capacity, the busiest process groups and the API server's time on the creates, of the
    window whose profile keys start with ``prefix`` (``launch_`` or ``alone_``); None when not recorded."""
    cap, busy = med(ps, f"{prefix}cpu_capacity"), med(ps, f"{prefix}cpu_busy")
    if cap is None or busy is None:
        return None  # a run from before the profile was recorded
    procs = sorted(((med(ps, k) or 0.0, k.removeprefix(f"{prefix}cpu_")) for k in ps
                    if k.startswith(f"{prefix}cpu_") and k not in (f"{prefix}cpu_capacity", f"{prefix}cpu_busy")),
                   reverse=True)
    api = ", ".join(f"{what}: {med(ps, f'{prefix}api_post_{what}_s') or 0:.2f} s over "
                    f"{med(ps, f'{prefix}api_post_{what}_n') or 0:.0f} creates" for what in ("pods", "services"))
    return (f"the machine was busy {busy:.1f} of {cap:.1f} CPU-seconds ({100 * busy / cap:.0f}%); by process: "
            + ", ".join(f"{name} {v:.1f}" for v, name in procs if v >= 0.05)
            + f". The API server's own time on the job's creates (its request-duration metric, summed): {api}.")


def launch_profile(cp: dict[str, Any]) -> list[str]:
    """Where the job launch's wall went on this machine (bench/machine.py), median per size: the machine's busy CPU
    against its capacity, the busiest process groups, and the API server's own time on the job's creates; the same
    for the Training Operator alone where it was run."""
    out = []
    for g in sorted(int(k) for k in cp if k.isdigit()):
        ps, st = cp[str(g)].get("profile_stats") or {}, cp[str(g)]["stats"]
        ours = _where(ps, "launch_")
        if ours is None:
            continue
        out.append(f"* {g} GPUs ({_kind(cp, g)}), job launch {_cell(st, 'job_launch')} s: {ours}")
        alone = _where(ps, "alone_")
        if alone is not None:
            out.append(f"* {g} GPUs, the Training Operator alone, job launch {_cell(st, 'launch_alone')} s: {alone}")
    if not out:
        return []
    return ["", "Where the job launch's wall goes (median of the repeats, CPU-seconds; `bench/machine.py`: /proc over "
            "the launch window, the API server's /metrics):", "", *out]


def reruns(results: Path, full_commit: str) -> list[str]:
    """The development re-runs of the scenario alone, newest first by start time, each with its commit."""
    found = []
    for path in sorted(results.glob("control_plane*.json")):
        data = json.loads(path.read_text())
        found.append((str(data.get("started", "")), path.name, data))
    lines: list[str] = []
    for started, name, data in sorted(found, reverse=True):
        git = data.get("git") or {}
        cp = data.get("control_plane") or {}
        lines += ["", f"### Re-run `{name}`: commit `{str(git.get('commit', '?'))[:12]}`"
                  f"{' with uncommitted changes (' + ', '.join(git.get('dirty_paths', [])[:8]) + ')' if git.get('dirty') else ''}"
                  f", started {started}", "",
                  f"`{data.get('command')}`" + ("" if git.get("commit") != full_commit else
                                                 " (the full run's commit)") + ".", "", *table(cp),
                  *_alone_note(cp), *launch_profile(cp)]
    if not lines:
        return []
    return ["", "The scenario alone, re-run on later code (development runs: the same harness and world, fewer "
            "repeats; the full run above stays the one every side shares):", *lines]


def section(out: dict[str, Any], results: Path | None) -> list[str]:
    """The control-plane section of docs/benchmarks.md for the full (or quick) run ``out``, with the re-runs in
    ``results`` (None: none)."""
    cp = out.get("control_plane") or {}
    above = any("above_world" in (v.get("stats") or {}) for k, v in cp.items() if k.isdigit())
    return ["## Control-plane overhead at zero boot (ours only, timed by the harness around each step call)", "",
            *table(cp), "", NOTE, *(["", PATH] if above else []), *_alone_note(cp), *launch_profile(cp),
            *(reruns(results, str((out.get("git") or {}).get("commit", ""))) if results is not None else [])]
