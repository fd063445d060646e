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
    above = any("above_world" in (cp[str(g)].get("stats") or {}) for g in sizes)  # recorded since the GpuGang path
    lines = ["| GPUs | job kind | total | preflight | warm pool | scale-up | job launch | world: last node Ready |"
             + (" above world |" if above else ""), "|---|---|---|---|---|---|---|---|" + ("---|" if above else "")]
    if "error" in cp:
        lines.append(f"| FAILED: {stage_error(cp)} | | | | | | | |" + (" |" if above else ""))
    for g in sizes:
        st = cp[str(g)]["stats"]
        lines.append(f"| {g} | {_kind(cp, g)} | {_cell(st, 'total')} | {_cell(st, 'preflight')} | "
                     f"{_cell(st, 'warm_pool')} | {_cell(st, 'scale_up')} | {_cell(st, 'job_launch')} | "
                     f"{_cell(st, 'world_nodes_ready')} |" + (f" {_cell(st, 'above_world')} |" if above else ""))
    return lines


def launch_profile(cp: dict[str, Any]) -> list[str]:
    """Where the job launch's wall went on this machine (bench/machine.py), median per size: the machine's busy CPU
    against its capacity, the busiest process groups, and the API server's own time on the job's creates."""
    out = []
    for g in sorted(int(k) for k in cp if k.isdigit()):
        ps = cp[str(g)].get("profile_stats") or {}
        cap, busy = med(ps, "launch_cpu_capacity"), med(ps, "launch_cpu_busy")
        if cap is None or busy is None:
            continue  # a run from before the launch profile was recorded
        procs = sorted(((med(ps, k) or 0.0, k.removeprefix("launch_cpu_")) for k in ps
                        if k.startswith("launch_cpu_") and k not in ("launch_cpu_capacity", "launch_cpu_busy")),
                       reverse=True)
        api = ", ".join(f"{what}: {med(ps, f'launch_api_post_{what}_s') or 0:.2f} s over "
                        f"{med(ps, f'launch_api_post_{what}_n') or 0:.0f} creates" for what in ("pods", "services"))
        out.append(f"* {g} GPUs ({_kind(cp, g)}), job launch {_cell(cp[str(g)]['stats'], 'job_launch')} s: the "
                   f"machine was busy {busy:.1f} of {cap:.1f} CPU-seconds ({100 * busy / cap:.0f}%); by process: "
                   + ", ".join(f"{name} {v:.1f}" for v, name in procs if v >= 0.05)
                   + f". The API server's own time on the job's creates (its request-duration metric, summed): {api}.")
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
                  *launch_profile(cp)]
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
            *table(cp), "", NOTE, *(["", PATH] if above else []), *launch_profile(cp),
            *(reruns(results, str((out.get("git") or {}).get("commit", ""))) if results is not None else [])]
