"""Run the kfp-gpu benchmarks against the local control plane.

    python -m bench.run --quick    # < 60 s: fewer N and one repeat (make bench-quick)
    python -m bench.run --full     # every N, >= 5 repeats (make bench)

Writes ``bench/results/latest.json`` (one object per scenario) and the results table in
``docs/benchmarks.md`` (between the BEGIN/END RESULTS markers). Every ratio is computed from numbers
measured in this same invocation. A baseline that fails is reported as failed, never skipped silently.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common import RESULTS, ROOT, Result, new_api

DOC = ROOT / "docs" / "benchmarks.md"
BEGIN, END = "<!-- BEGIN RESULTS -->", "<!-- END RESULTS -->"
NAMESPACE = "kfp-gpu-bench"


@dataclass(frozen=True)
class Mode:
    name: str
    burst_ns: tuple[int, ...]
    seq_ns: tuple[int, ...]
    ca_ns: tuple[int, ...]
    rss: bool
    repeats: int
    preflight_repeats: int
    overhead_repeats: int
    critical_path: bool
    recovery_repeats: int = 1


QUICK = Mode("quick", (4, 16), (4,), (), False, 1, 1, 1, False, 1)  # CA only in --full: >= 30 s a run
FULL = Mode("full", (4, 16, 64, 128), (4, 16, 64, 128), (4, 16, 64, 128), True, 5, 5, 5, True, 5)


def _ensure_namespace() -> None:
    from kubernetes import client

    api = new_api()
    try:
        client.CoreV1Api(api).create_namespace({"metadata": {"name": NAMESPACE, "labels": {"kfp-gpu.io/bench": "true"}}})
    except client.ApiException as exc:
        if exc.status != 409:
            raise
    finally:
        api.close()


def _not_measured(name: str, title: str, why: str) -> Result:
    r = Result(name, title)
    r.errors["ours"] = why
    return r


def run(mode: Mode, log: Callable[[str], None] = print) -> dict[str, Any]:
    from bench import burst, overhead, preflight_bench, recovery

    _ensure_namespace()
    started = time.time()
    results: dict[str, Result] = {}

    def stage(name: str, fn: Callable[[], dict[str, Result]]) -> None:
        t = time.time()
        log(f"[bench] {name} ...")
        try:
            results.update(fn())
        except Exception as exc:  # noqa: BLE001 - one broken scenario must not hide the others
            results[name] = _not_measured(name, name, f"FAILED: {type(exc).__name__}: {exc}")
            log(f"[bench] {name} FAILED: {exc}")
        log(f"[bench] {name} done in {time.time() - t:.1f}s")

    stage("burst", lambda: burst.run(list(mode.burst_ns), mode.repeats, list(mode.seq_ns), NAMESPACE, log=log,
                                     rss_n=max(mode.burst_ns) if mode.rss else None, ca_ns=list(mode.ca_ns)))
    stage("control_plane_overhead_512",
          lambda: {"control_plane_overhead_512": overhead.run(mode.overhead_repeats, NAMESPACE, log=log)})
    stage("preflight_6x3", lambda: {"preflight_6x3": preflight_bench.run(mode.preflight_repeats, log=log)})
    if mode.critical_path:
        from bench import critical_path

        stage("critical_path", lambda: {"critical_path": critical_path.run(log=log)})
    else:
        results["critical_path"] = _not_measured(
            "critical_path", "Critical path under kfp.local", "not measured in --quick (kfp.local runs take "
            "minutes); run --full")
    stage("recovery", lambda: recovery.run(mode.recovery_repeats, NAMESPACE, log=log, quick=mode.name == "quick"))
    _check_targets(results)
    out = {
        "mode": mode.name,
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "wall_s": round(time.time() - started, 1),
        "machine": {"python": platform.python_version(), "cpus": _cpus(), "platform": platform.platform()},
        "command": f"python -m bench.run --{mode.name}",
        "scenarios": {k: v.to_json() for k, v in results.items()},
    }
    return out


def _cpus() -> int:
    import os

    return len(os.sched_getaffinity(0))


def _check_targets(results: dict[str, Result]) -> None:
    for k, r in results.items():
        if not k.startswith("burst_n"):
            continue
        n = int(k[len("burst_n"):])
        ours, ca = r.median("ours"), r.median("cluster_autoscaler")
        ahead = None if ca is None or ours is None else ours < ca
        ol = r.median("ours_over_limit")
        r.extra["ahead_of_cluster_autoscaler"] = ahead
        if n == 128:
            r.met = bool(ol is not None and ol <= 1.10 and ahead)
        else:
            r.met = ahead


# ---- table ---------------------------------------------------------------------------------------

def _fmt(v: Any, digits: int = 2) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


def _range(sc: dict[str, Any], side: str) -> str:
    st = sc.get("stats", {}).get(side)
    if not st:
        return "-"
    if st["n"] == 1:
        return _fmt(st["median"])
    return f"{_fmt(st['median'])} ({_fmt(st['min'])}-{_fmt(st['max'])})"


def _recovery_lines(sc: dict[str, Any]) -> list[str]:
    """Section 4: ours vs a plain Training Operator restart, one preempted node of a 4x8 gang."""
    r, d, sl = sc.get("recovery", {}), sc.get("recovery_detect", {}), sc.get("recovery_steps_lost", {})
    op = "training_operator"
    if "ours" not in r.get("stats", {}) and op not in r.get("stats", {}):
        return [str(r.get("errors", {}).get("ours", "-"))]

    def cell(s: dict[str, Any], side: str) -> str:
        if side in s.get("stats", {}):
            return _range(s, side)
        err = s.get("errors", {}).get(side)
        return f"**FAILED**: {err[:120]}" if err else "-"

    lines = ["| metric | ours | Training Operator restart | ours/operator |", "|---|---|---|---|",
             f"| detection latency (s) | {cell(d, 'ours')} | {cell(d, op)} | {_fmt(d.get('ratio_vs_' + op))} |",
             f"| preemption -> all replicas Running again, excl. injected boot (s) | {cell(r, 'ours')} | "
             f"{cell(r, op)} | {_fmt(r.get('ratio_vs_' + op))} |",
             f"| same, incl. boot (s) | {cell(r, 'ours_incl_boot')} | {cell(r, op + '_incl_boot')} | - |",
             f"| steps lost, trainer restarts from step 0 under the operator | {cell(sl, 'ours')} | "
             f"{cell(sl, op + '_from_scratch')} | {_fmt(sl.get('ratio_vs_' + op + '_from_scratch'))} |",
             f"| steps lost, trainer resumes its own latest checkpoint | {cell(sl, 'ours')} | "
             f"{cell(sl, op + '_own_checkpoint')} | {_fmt(sl.get('ratio_vs_' + op + '_own_checkpoint'))} |"]
    if sl.get("checkpoint_every"):
        lines += ["", f"Checkpoint interval {sl['checkpoint_every']} steps; detection max: ours "
                  f"{_fmt((d.get('stats', {}).get('ours') or {}).get('max'), 3)} s, operator "
                  f"{_fmt((d.get('stats', {}).get(op) or {}).get('max'), 3)} s. Method and caveats: see Recovery "
                  "above and `notes` in the JSON."]
    return lines


def table(out: dict[str, Any]) -> str:
    sc = out["scenarios"]
    lines = [f"Mode `{out['mode']}`, started {out['started']}, wall {out['wall_s']} s, "
             f"{out['machine']['cpus']} CPUs. Reproduce: `make bench{'-quick' if out['mode'] == 'quick' else ''}` "
             f"(= `{out['command']}` after `make cluster-up`). Cells: median (min-max) over the repeats.", ""]
    lines += ["### 1. Burst scale-up (s, until all N Ready)", "",
              "| N | ours | cluster-autoscaler | sequential | limit (max boot) | ours/limit | ours/CA | ours/seq |"
              " target met |", "|---|---|---|---|---|---|---|---|---|"]
    for k in sorted((k for k in sc if k.startswith("burst_n")), key=lambda x: int(x[7:])):
        s = sc[k]
        err = s.get("errors", {})
        ca = _range(s, "cluster_autoscaler") if "cluster_autoscaler" in s.get("stats", {}) else \
            f"**FAILED/NOT RUN**: {err.get('cluster_autoscaler', '')[:120]}"
        seq = _range(s, "sequential") if "sequential" in s.get("stats", {}) else "not run"
        lines.append(f"| {k[7:]} | {_range(s, 'ours')} | {ca} | {seq} | {_range(s, 'limit')} | "
                     f"{_fmt(s.get('ours_over_limit'))} | {_fmt(s.get('ratio_vs_cluster_autoscaler'))} | "
                     f"{_fmt(s.get('ratio_vs_sequential'))} | {_fmt(s.get('target_met'))} |")
    rss = [(k, sc[k].get("peak_rss_mib_ours_step_process")) for k in sc if k.startswith("burst_n")]
    for k, v in rss:
        if v is not None:
            lines += ["", f"Peak RSS of a fresh process running `provision()` at N={k[7:]}: {v} MiB."]
    o = sc.get("control_plane_overhead_512", {})
    lines += ["", "### 2. Control-plane overhead, 64x8 GPUs, zero boot (s)", "",
              "| total | preflight | warm pool | scale-up | job launch | target < 2 s met |", "|---|---|---|---|---|---|",
              f"| {_range(o, 'ours')} | {_range(o, 'ours_preflight')} | {_range(o, 'ours_warm_pool')} | "
              f"{_range(o, 'ours_scale_up')} | {_range(o, 'ours_job_launch')} | {_fmt(o.get('target_met'))} |"]
    p = sc.get("preflight_6x3", {})
    lines += ["", "### 3. Preflight, 6 regions x 3 accelerators, 200 ms round trip", "",
              "| ours (s) | ours (round trips) | sequential (s) | ours/sequential | target <= 1.5 RT met |",
              "|---|---|---|---|---|",
              f"| {_range(p, 'ours')} | {_range(p, 'ours_round_trips')} | {_range(p, 'sequential')} | "
              f"{_fmt(p.get('ratio_vs_sequential'), 3)} | {_fmt(p.get('target_met'))} |"]
    lines += ["", "### 4. Recovery", ""] + _recovery_lines(sc)
    cp = sc.get("critical_path", {})
    lines += ["", "### 5. Critical path (kfp.local)", ""]
    if "ours" in cp.get("stats", {}):
        lines += ["| D (s) | P (s) | max(D,P) | decorated (ours) | provision-first | ours/provision-first |"
                  " ours/max(D,P) |", "|---|---|---|---|---|---|---|",
                  f"| {_fmt(cp.get('D_s'))} | {_fmt(cp.get('P_s'))} | {_fmt(cp.get('limit'))} | {_range(cp, 'ours')} | "
                  f"{_range(cp, 'provision_first')} | {_fmt(cp.get('ratio_vs_provision_first'))} | "
                  f"{_fmt(cp.get('ratio_vs_limit'))} |"]
    else:
        lines.append(cp.get("errors", {}).get("ours", "-"))
    lines += ["", "### 6. Idle GPU-minutes per run", "",
              "| N | ours | cluster-autoscaler (incl. 10 min scale-down delay, as configured) |"
              " CA before training only | sequential |", "|---|---|---|---|---|"]
    for k in sorted((k for k in sc if k.startswith("idle_n")), key=lambda x: int(x[6:])):
        s = sc[k]
        lines.append(f"| {k[6:]} | {_range(s, 'ours')} | {_range(s, 'cluster_autoscaler')} | "
                     f"{_range(s, 'cluster_autoscaler_before_training')} | {_range(s, 'sequential')} |")
    lines += ["", "### 7. API requests per provisioned node (cloud stand-in + Kubernetes API)", "",
              "| N | ours (cloud + kube) | sequential (cloud + kube) | ours/sequential |", "|---|---|---|---|"]
    for k in sorted((k for k in sc if k.startswith("api_n")), key=lambda x: int(x[5:])):
        s = sc[k]
        lines.append(f"| {k[5:]} | {_range(s, 'ours')} ({_range(s, 'ours_cloud')} + {_range(s, 'ours_kube')}) | "
                     f"{_range(s, 'sequential')} ({_range(s, 'sequential_cloud')} + {_range(s, 'sequential_kube')}) | "
                     f"{_fmt(s.get('ratio_vs_sequential'))} |")
    return "\n".join(lines) + "\n"


def write(out: dict[str, Any], json_path: Path, doc: Path = DOC) -> None:
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(out, indent=2, sort_keys=False) + "\n")
    if doc.exists():
        text = doc.read_text()
        if BEGIN in text and END in text:
            head, rest = text.split(BEGIN, 1)
            _, tail = rest.split(END, 1)
            doc.write_text(f"{head}{BEGIN}\n{table(out)}{END}{tail}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--quick", action="store_true")
    g.add_argument("--full", action="store_true")
    ap.add_argument("--out", type=Path, default=None,
                    help="default: bench/results/latest.json for --full, bench/results/quick.json for --quick")
    ap.add_argument("--no-doc", action="store_true", help="do not rewrite the table in docs/benchmarks.md")
    args = ap.parse_args(argv)
    mode = QUICK if args.quick else FULL
    out = run(mode)
    # --quick is a smoke run: it never overwrites the full run's JSON or the table in docs/benchmarks.md.
    json_path = args.out or RESULTS / ("quick.json" if args.quick else "latest.json")
    write(out, json_path, doc=Path("/nonexistent") if (args.no_doc or args.quick) else DOC)
    print(table(out))
    print(f"[bench] wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
