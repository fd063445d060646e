"""The issue's targets for docs/benchmarks.md, evaluated from the bench JSON (bench/report.py renders them).

Contract: :func:`targets` is pure over the JSON ``bench.run`` wrote: one :func:`row` per target (name, target,
value, ``met`` True/False, or None with the reason it was not measured, and for a miss the profile that explains
it); "ours has the lowest overhead" is claimed only where the ranges do not overlap (:func:`lowest`). The
recovery rows come from :mod:`bench.report_recovery`.
"""

from __future__ import annotations

from typing import Any

from bench import report_recovery

__all__ = ["ABOVE_WORLD_TARGETS", "OURS", "PEERS", "lowest", "med", "row", "stage_error", "targets"]

OURS = ("ours_node_pool", "ours_provisioning_request", "ours_karpenter", "ours_compute_class")
ABOVE_WORLD_TARGETS = ((512, 0.5), (4096, 2.0))  # total - world_nodes_ready, seconds
PEERS = ("naive", "sequential", "cluster_autoscaler", "cluster_autoscaler_provreq", "karpenter")


def med(s: dict[str, Any] | None, key: str) -> float | None:
    st = (s or {}).get(key) or {}
    return st.get("median")


def row(name: str, target: str, value: str, met: bool | None, profile: str = "") -> dict[str, Any]:
    return {"name": name, "target": target, "value": value, "met": met, "profile": profile}


def _ours_profile(burst_n: dict[str, Any], side: str) -> str:
    runs = [r for r in burst_n.get("runs", []) if r["side"] == side and r.get("profile_ours_s")]
    if not runs:
        return ""
    p = runs[0]["profile_ours_s"]
    parts = [f"{k} {v:.2f} s" for k, v in sorted(p.items(), key=lambda kv: kv[1])]
    calls = runs[0].get("cloud_calls_ours_s") or []
    first_resize = next((c for c in calls if ":setSize" in c[2]), None)
    before = [c for c in calls if first_resize is None or c[0] < first_resize[0]]
    call_text = ""
    if first_resize is not None:
        call_text = (f"; the first resize (setSize) left at {first_resize[0]:.2f} s, after {len(before)} cloud "
                     f"call(s) ({', '.join(f'{c[2]} {c[0]:.2f}-{c[1]:.2f} s' for c in before)})")
    return (f"ours' own step timeline, seconds after t0 (repeat 0): {', '.join(parts)}; gang Running at "
            f"{runs[0]['total_s']:.2f} s, largest boot {runs[0]['limit_s']:.2f} s{call_text}")


def stage_error(stage: dict[str, Any]) -> str:
    """A failed stage's error as bench.run stored it, without its own "FAILED: " (the caller says it failed)."""
    return str(stage["error"]).removeprefix("FAILED: ")


def _all_failed(side_summary: dict[str, Any]) -> str:
    errs = side_summary.get("failed") or []
    return f"every run failed ({len(errs)}): {errs[0][:160]}" if errs else "no measurement"


def _rng(st: dict[str, Any]) -> str:
    return f"{st['median']:.2f} s ({st['min']:.2f}-{st['max']:.2f}, {st.get('n', 1)} runs)"


def lowest(n: int, ours: str, o: dict[str, Any], peers: dict[str, dict[str, Any]], b: dict[str, Any]) -> dict[str, Any]:
    """"ours has the lowest overhead", claimed only where the ranges do not overlap: met when ours' max is below
    every peer's min and each has >= 2 runs; missed when some peer's max is below ours' min; else ``met`` None
    with ``undecided`` (the ranges overlap, or a single run has no range): no claim either way.
    ``o``/``peers``: overhead stats (median, min, max, n)."""
    name, what = f"burst_n{n}_{ours}_lowest_overhead", f"{ours} has the lowest overhead of every side, N={n}"
    if not peers:
        return row(name, what, f"{_rng(o)}, no peer ran", None)
    best = min(peers.items(), key=lambda kv: kv[1]["median"])
    below = [p for p, st in peers.items() if st["max"] < o["min"]]
    value = f"{_rng(o)} vs best peer {best[0]} {_rng(best[1])}"
    if below:
        return row(name, what, value + f"; below ours' whole range: {', '.join(below)}", False, _ours_profile(b, ours))
    over = [p for p, st in peers.items() if st["min"] <= o["max"]]
    single = [p for p, st in [(ours, o), *peers.items()] if st.get("n", 1) < 2]
    if not over and not single:
        return row(name, what, value, True)
    why = "ranges overlap" if over else "one run: no range"
    undecided = row(name, what, value + f"; {why} ({', '.join(over or single)}): no claim", None)
    undecided["undecided"] = why
    return undecided


def targets(out: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's targets, evaluated from the JSON; ``met`` None = not measured in this run (says why)."""
    rows: list[dict[str, Any]] = []
    burst = out.get("burst") or {}
    for n, b in sorted(((int(k), v) for k, v in burst.items() if isinstance(v, dict) and "summary" in v)):
        summ = b["summary"]
        ran = {p: summ[p]["overhead_s"] for p in PEERS if (summ.get(p) or {}).get("overhead_s")}
        for ours in OURS:
            s = summ.get(ours) or {}
            if not s.get("overhead_s"):
                if s.get("failed"):
                    rows.append(row(f"burst_n{n}_{ours}_lowest_overhead",
                                   f"{ours} has the lowest overhead of every side, N={n}", _all_failed(s), False))
                continue
            rows.append(lowest(n, ours, s["overhead_s"], ran, b))
    for n, lim in ((128, 1.0), (512, 2.5)):
        s = ((burst.get(str(n)) or {}).get("summary") or {}).get("ours_node_pool") or {}
        o = med(s, "overhead_s")
        name, what = f"burst_n{n}_overhead", f"ours overhead <= {lim} s at N={n} (100 ms API latency)"
        if o is None and s.get("failed"):
            rows.append(row(name, what, _all_failed(s), False))
            continue
        rows.append(row(name, what, "not run in this mode" if o is None else f"{o:.2f} s", None if o is None else o <= lim,
                       "" if o is None or o <= lim else _ours_profile(burst[str(n)], "ours_node_pool")))
    cp = out.get("control_plane") or {}
    for gpus, lim in ((512, 2.0), (4096, 6.0)):
        st = ((cp.get(str(gpus)) or {}).get("stats") or {})
        v = med(st, "total")
        name, what = f"control_plane_{gpus}", f"control-plane overhead < {lim:g} s at {gpus} GPUs, zero boot"
        if v is None and "error" in cp:
            rows.append(row(name, what, f"the stage failed: {stage_error(cp)[:200]}", False))
            continue
        prof = ", ".join(f"{k} {med(st, k):.2f} s" for k in ("preflight", "warm_pool", "scale_up", "job_launch")
                         if med(st, k) is not None)
        if med(st, "world_nodes_ready") is not None:
            prof += (f"; the world's last node was Ready {med(st, 'world_nodes_ready'):.2f} s after warm pool began "
                     "(external watch: the floor under warm pool + scale-up on this control plane)")
        rows.append(row(name, what, "not run in this mode" if v is None else f"{v:.2f} s", None if v is None else v < lim,
                       "" if v is None or v < lim else f"per step (median): {prof}"))
    for gpus, lim in ABOVE_WORLD_TARGETS:
        st = ((cp.get(str(gpus)) or {}).get("stats") or {})
        v = med(st, "above_world")
        if v is None:  # a run from before above_world was recorded: no such target in its JSON
            continue
        prof = ", ".join(f"{k} {med(st, k):.2f} s" for k in ("preflight", "warm_pool", "scale_up", "job_launch",
                                                               "world_nodes_ready") if med(st, k) is not None)
        ps = (cp.get(str(gpus)) or {}).get("profile_stats") or {}
        if ps:
            prof += "; controller profile (median): " + ", ".join(f"{k} {med(ps, k):.2f} s" for k in sorted(ps))
        rows.append(row(f"control_plane_{gpus}_above_world", f"control-plane time above the world's own node-Ready "
                       f"time <= {lim:g} s at {gpus} GPUs, zero boot", f"{v:.2f} s", v <= lim,
                       "" if v <= lim else f"per step (median): {prof}"))
    pf = out.get("preflight") or {}
    rt = pf.get("ours_round_trips")
    rows.append(row("preflight_round_trips", "preflight <= 1.5 round trips (6 regions x 3 accelerators, 100 ms)",
                   "not run" if rt is None else f"{rt:.2f} round trips", None if rt is None else rt <= 1.5,
                   "" if rt is None or rt <= 1.5 else f"cloud requests per run: {pf.get('ours_cloud_requests')}"))
    rows += report_recovery.targets(out, row)
    return rows
