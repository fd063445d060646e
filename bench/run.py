"""Run the kfp-gpu benchmarks: every peer run on one world (bench/world.py), one external watch (bench/observe.py).

    python -m bench.run --quick    # make bench-quick: every side at N=4, one repeat, small scenarios (< 2 min)
    python -m bench.run --full     # make bench: N = 4..512, 5 interleaved repeats (3 at N >= 128), every scenario

Writes ``bench/results/quick.json`` / ``latest.json`` (with the git commit and dirty flag) and regenerates
``docs/benchmarks.md`` from the JSON (bench/report.py; --quick never touches the doc: the doc is the full run's).

Ours runs as the product does (bench/ours.py): the bench namespace is made a tenant and one kfp-gpu controller
(``kfp-gpu controller --standalone``, its own process under its ServiceAccount token) serves it for the whole run;
every ours side calls the steps through the run's GpuGang with the tenant's token. The peers are not ours and run
as they are.

Development runs (``--out`` required, so a partial run never becomes latest.json/quick.json or the doc)::

    python -m bench.run --full --only control-plane --control-plane-gpus 512,4096 --repeats 3 \
        --out bench/results/control_plane.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common import RESULTS, ROOT, new_api, stats, uid
from bench.world import description, git_state

LEFTOVER = "kfp-gpu.io/bench"  # every node and namespace the bench makes carries it


@dataclass(frozen=True)
class Mode:
    name: str
    burst_ns: tuple[int, ...]
    repeats: int  # burst at N <= 64, and the other scenarios' default
    sides: tuple[str, ...]
    after_cap_s: float  # how long idle-after-job is watched before it is reported as capped
    control_plane_gpus: tuple[int, ...]
    preflight_repeats: int
    recovery_repeats: int  # 0 = not run
    stockout_n: int
    repeats_large: int = 0  # burst repeats at N >= LARGE_N (0: as ``repeats``)
    sequential_max: int = 16  # the one-at-a-time loop runs up to this N (it cannot matter at large N)
    control_plane_kind: str = "pytorchjob"  # the job kind the control-plane scenario launches (kfp_gpu.jobkinds)

    def burst_repeats(self, n: int) -> int:
        return self.repeats_large if n >= LARGE_N and self.repeats_large else self.repeats


LARGE_N = 128


def _modes() -> dict[str, Mode]:
    from bench.sides import SIDES

    return {
        "quick": Mode("quick", (4,), 1, SIDES, 2.0, (64,), 1, 0, 4),
        # issue 28: >= 5 interleaved repeats at N <= 64, 3 at N = 128 and 512; the whole make bench < 120 min
        # forces one cut, the sequential loop above N=4 (estimate in docs/benchmarks.md, "Wall time")
        "full": Mode("full", (4, 16, 64, 128, 512), 5, SIDES, 40.0, (512, 4096), 3, 5, 16, repeats_large=3,
                     sequential_max=4),
    }


SCENARIOS = {  # the full set, with what --full runs (docs/benchmarks.md lists these)
    "burst": "N = 4, 16, 64, 128, 512 nodes x 8 GPUs, every side (sequential at N = 4 only), 5 interleaved repeats "
             "(3 at N = 128 and 512)",
    "control_plane": "ours' steps at zero boot: 512 and 4,096 GPUs (64 and 512 nodes), 100 ms API latency",
    "preflight": "6 regions x 3 accelerators at 100 ms API latency",
    "recovery": "one preemption, and two overlapping ones: ours vs the Training Operator alone and with an "
                "elastic torchrun restart, 5 interleaved repeats",
    "stockout": "two of three zones dry: ours' failover vs the physical limit",
    "critical_path": "the decorated example's compiled DAG: a DAG property, no timed ratio",
}


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    keys = ("total_s", "limit_s", "overhead_s", "nodes_ready_s", "machine_lag_s", "idle_before_gpu_min", "idle_after_gpu_min",
            "api_requests_per_node", "peak_rss_mib")
    out: dict[str, Any] = {}
    for r in rows:
        s = out.setdefault(r["side"], {"runs": 0, "failed": []})
        if "total_s" in r and not r.get("error"):
            s["runs"] += 1
            for k in keys:
                if k in r:  # machine_lag_s: recorded since issue 28
                    s.setdefault("_" + k, []).append(float(r[k]))
            if r.get("idle_after_capped"):
                s["idle_after_capped"] = True
        else:
            s["failed"].append(r.get("error", "no measurement"))
    for s in out.values():
        for k in keys:
            xs = s.pop("_" + k, [])
            if xs:
                s[k] = stats(xs)
    return out


def run_burst(h: Any, mode: Mode, log: Callable[[str], None]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for n in mode.burst_ns:
        rows: list[dict[str, Any]] = []
        not_run: dict[str, str] = {}
        for rep in range(mode.burst_repeats(n)):  # interleaved: side A r1, side B r1, ..., side A r2, ...
            for side in mode.sides:
                why = h.availability(side, n, sequential_max=mode.sequential_max)
                if why:
                    not_run[side] = why
                    continue
                t = time.time()
                r = h.run(side, n, rep)
                rows.append(r.row())
                log(f"  burst N={n} r{rep} {side}: " + (f"FAILED {r.error}" if r.error or r.m is None else
                    f"total {r.m.total_s:.2f}s limit {r.m.limit_s:.2f}s overhead {r.m.overhead_s:.2f}s "
                    f"({time.time() - t:.0f}s wall)"))
        out[str(n)] = {"runs": rows, "summary": summarize(rows), "not_run": not_run, "repeats": mode.burst_repeats(n)}
    return out


def burst_matrix(mode: Mode) -> list[tuple[int, str, int]]:
    """``(N, side, repeats)`` for every side the burst runs in ``mode``: the sequential loop only up to
    ``sequential_max``. Sides the harness finds unavailable at run time (a profile not running) are not known
    here."""
    return [(n, side, mode.burst_repeats(n)) for n in mode.burst_ns for side in mode.sides
            if not (side == "sequential" and n > mode.sequential_max)]


def estimate_wall_s(mode: Mode, per_run_s: dict[tuple[str, int], float], other_s: float) -> tuple[float, list[str]]:
    """The full run's wall: the burst's side-runs (``per_run_s[(side, N)]``: one side-run's wall, all phases) times
    their repeats, plus ``other_s`` (every other scenario and the start/cleanup). Returns the estimate and the
    (side, N) the caller gave no figure for (counted as 0: the estimate is then a floor)."""
    total, missing = other_s, []
    for n, side, reps in burst_matrix(mode):
        if (side, n) in per_run_s:
            total += per_run_s[(side, n)] * reps
        else:
            missing.append(f"{side}@{n}")
    return total, missing


def run_stockout(h: Any, mode: Mode, log: Callable[[str], None]) -> dict[str, Any]:
    zones = ("us-central1-a", "us-central1-b", "us-central1-c")
    r = h.run("ours_node_pool", mode.stockout_n, 0, dry_zones=zones[:2], zones=zones)
    log(f"  stockout N={mode.stockout_n}: " + (f"FAILED {r.error}" if r.error or r.m is None else
        f"total {r.m.total_s:.2f}s limit {r.m.limit_s:.2f}s"))
    return {"n": mode.stockout_n, "dry_zones": list(zones[:2]), "runs": [r.row()], "summary": summarize([r.row()]),
            "not_run": {"naive": "a hand-written single resize has no failover: it waits on the dry zone forever",
                        "others": "not built this session (peers with their own zone failover: Karpenter)"}}


def _only(text: str) -> tuple[str, ...]:
    """``--only`` as scenario keys (``control-plane`` -> ``control_plane``). Raises: ValueError."""
    keys = tuple(x.strip().replace("-", "_") for x in text.split(",") if x.strip())
    bad = [k for k in keys if k not in SCENARIOS]
    if bad:
        raise ValueError(f"unknown scenario {bad[0]!r}; one of {', '.join(SCENARIOS)}")
    return keys


def sweep(api: Any, log: Callable[[str], None]) -> None:
    """Delete what a killed bench left (label ``kfp-gpu.io/bench``): its nodes, namespaces and KWOKNodeClass. A
    bench killed at N=512 left 350 KWOK nodes and its node class; the next bench (and CI's make test on the same
    cluster) ran beside them. Raises: ApiException other than 404."""
    from kubernetes import client

    from bench.sideprocs import delete_node_class

    core = client.CoreV1Api(api)
    nodes = [n.metadata.name for n in core.list_node(label_selector=LEFTOVER).items]
    spaces = [n.metadata.name for n in core.list_namespace(label_selector=LEFTOVER).items]
    for delete, names in ((core.delete_node, nodes), (core.delete_namespace, spaces)):
        for name in names:
            try:
                delete(name)
            except client.ApiException as exc:
                if exc.status != 404:
                    raise
    delete_node_class(api)  # the bench's KWOKNodeClass
    if nodes or spaces:
        log(f"swept a killed bench's leftovers: {len(nodes)} nodes, namespaces {spaces}")


def run(mode: Mode, log: Callable[[str], None] = print, only: tuple[str, ...] = (),
        command: str = "") -> dict[str, Any]:
    """Every scenario of ``mode`` (``only``: just these, by :data:`SCENARIOS` key)."""
    from kubernetes import client

    from bench import burst, critical_path, overhead, preflight_bench
    from bench.ours import Product

    started = time.time()
    ns = uid("kfp-gpu-bench-")
    api = new_api()
    core = client.CoreV1Api(api)
    sweep(api, log)
    core.create_namespace({"metadata": {"name": ns, "labels": {"kfp-gpu.io/bench": "true"}}})
    out: dict[str, Any] = {"schema": 2, "mode": mode.name, "git": git_state(ROOT),
                           "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
                           "command": command or f"python -m bench.run --{mode.name}", "world": description(),
                           "machine": {"python": platform.python_version(), "cpus": len(os.sched_getaffinity(0)),
                                       "platform": platform.platform(), "load_avg_start": list(os.getloadavg())},
                           "scenarios_defined": SCENARIOS, "sides": list(mode.sides), "repeats": mode.repeats,
                           "burst_repeats": {str(n): mode.burst_repeats(n) for n in mode.burst_ns},
                           "gang_running": "simultaneous"}  # bench/observe.py Observer.gang_running_at
    if only:
        out["only"] = list(only)
    wanted = lambda key: not only or key in only  # noqa: E731
    product = Product(api, ns, log=log)
    try:
        product.start()  # the tenant and its controller, before any side runs
    except BaseException:
        product.stop()
        core.delete_namespace(ns)
        raise
    out["controller"] = product.describe()
    assert product.step_kubeconfig is not None
    step_kc = product.step_kubeconfig
    h = burst.Harness(ns, after_cap_s=mode.after_cap_s, defer_cleanup=mode.name == "quick", log=log,
                      step_kubeconfig=str(step_kc))
    ca = threading.Thread(target=h.start_ca, daemon=True)
    if wanted("burst"):
        ca.start()  # the bench's cluster-autoscaler comes up while the first sides run

    def stage(name: str, fn: Callable[[], Any]) -> None:
        if not wanted(name.removesuffix("_overlap")):
            return
        t = time.time()
        log(f"[bench] {name} ...")
        try:
            out[name] = fn()
        except Exception as exc:  # noqa: BLE001 - one broken scenario must not hide the others
            out[name] = {"error": f"FAILED: {type(exc).__name__}: {exc}"[:800]}
            log(f"[bench] {name} FAILED: {exc}")
        out.setdefault("stage_wall_s", {})[name] = round(time.time() - t, 1)  # the wall budget, per scenario
        log(f"[bench] {name} done in {time.time() - t:.1f}s")

    try:
        if ca.is_alive():
            ca.join(120.0)
        stage("burst", lambda: run_burst(h, mode, log))
        stage("stockout", lambda: run_stockout(h, mode, log))
        stage("control_plane", lambda: {str(g): overhead.run(g // 8, mode.preflight_repeats, ns, step_kc, log=log,
                                                             obs=h.obs, kind=mode.control_plane_kind)
                                        for g in mode.control_plane_gpus})
        stage("preflight", lambda: preflight_bench.run(mode.preflight_repeats, log=log,
                                                     sequential=mode.name == "full").to_json())
        if mode.recovery_repeats:
            from bench import recovery

            stage("recovery", lambda: {k: v.to_json() for k, v in
                                       recovery.run(mode.recovery_repeats, ns, step_kc, log=log).items()})
            stage("recovery_overlap", lambda: {k: v.to_json() for k, v in
                                               recovery.run(mode.recovery_repeats, ns, step_kc, log=log,
                                                            k=2).items()})
        elif wanted("recovery"):
            for key in ("recovery", "recovery_overlap"):
                out[key] = {"not_run": "not run in --quick (about a minute per repeat); make bench runs it"}
        stage("critical_path", critical_path.dag_property)
    finally:
        t = time.time()
        out["cleanup_forced"] = h.finish()
        h.close()
        gangs_forced = product.stop()
        if gangs_forced:
            out["cleanup_forced"] = [*out["cleanup_forced"], *(f"GpuGang {g}" for g in gangs_forced)]
        core.delete_namespace(ns)
        api.close()
        log(f"[bench] cleanup done in {time.time() - t:.1f}s (forced: {out['cleanup_forced'] or 'nothing'})")
    from bench.report_targets import targets

    out["targets"] = targets(out)
    out["wall_s"] = round(time.time() - started, 1)
    out["machine"]["load_avg_end"] = list(os.getloadavg())
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--quick", action="store_true")
    g.add_argument("--full", action="store_true")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--sides", default="", help="comma list: run only these sides (development)")
    ap.add_argument("--n", default="", help="comma list of N (development)")
    ap.add_argument("--repeats", type=int, default=0, help="override the mode's repeats (development)")
    ap.add_argument("--control-plane-gpus", default="", help="comma list of GPU counts (development)")
    ap.add_argument("--control-plane-kind", default="", choices=("", "pytorchjob", "trainjob"),
                    help="the job kind the control-plane scenario launches (development; default pytorchjob)")
    ap.add_argument("--only", default="", help="comma list of scenarios to run, e.g. control-plane "
                    f"(development; one of {', '.join(k.replace('_', '-') for k in SCENARIOS)})")
    args = ap.parse_args(argv)
    if (args.sides or args.n or args.repeats or args.control_plane_gpus or args.control_plane_kind or args.only) \
            and args.out is None:
        ap.error("--sides/--n/--repeats/--control-plane-gpus/--control-plane-kind/--only are for development: give --out too, so a "
                 "partial run never becomes latest.json/quick.json or the doc")
    try:
        only = _only(args.only)
    except ValueError as exc:
        ap.error(f"--only: {exc}")
    mode = _modes()["quick" if args.quick else "full"]
    if args.sides:
        mode = Mode(**{**mode.__dict__, "sides": tuple(args.sides.split(","))})
    if args.n:
        mode = Mode(**{**mode.__dict__, "burst_ns": tuple(int(x) for x in args.n.split(","))})
    if args.repeats:
        mode = Mode(**{**mode.__dict__, "repeats": args.repeats, "repeats_large": args.repeats,
                       "preflight_repeats": args.repeats,
                       "recovery_repeats": min(mode.recovery_repeats, args.repeats)})
    if args.control_plane_gpus:
        mode = Mode(**{**mode.__dict__, "control_plane_gpus": tuple(int(x) for x in args.control_plane_gpus.split(","))})
    if args.control_plane_kind:
        mode = Mode(**{**mode.__dict__, "control_plane_kind": args.control_plane_kind})
    out = run(mode, only=only, command=" ".join(["python -m bench.run", *(sys.argv[1:] if argv is None else argv)]))
    path = args.out or RESULTS / ("quick.json" if args.quick else "latest.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1) + "\n")
    from bench import report

    print(report.render(out))
    if args.out is None and report.source() == path:  # quick writes the doc only until a full run exists
        report.write_doc(out)
    print(f"[bench] wrote {path} in {out['wall_s']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
