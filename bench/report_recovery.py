"""The recovery part of docs/benchmarks.md and of the targets, generated from the bench JSON.

The recovery scenario has its own result file, ``bench/results/recovery.json`` (``python -m bench.run --full --only
recovery --repeats 5 --out bench/results/recovery.json``), written only by a run of >= 5 repeats. The main JSON's
own recovery wins when it has the three sides (``best_realistic_baseline`` recorded: a full run measured it in the
same world and session as every other figure). Otherwise, when recovery.json exists with the three sides, the doc's
recovery section and recovery targets come from it, with its own command and commit; else from the main JSON (older
runs: ours vs the operator alone).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench.common import RESULTS, ROOT

RECOVERY_JSON = RESULTS / "recovery.json"
SIDES = (("ours", "ours"), ("training_operator", "Training Operator alone"),
         ("training_operator_elastic", "Training Operator + elastic torchrun"))
METRICS = (("recovery_detect", "detection: first reaction the watch sees (s)", 2),
           ("recovery", "preemption -> training again (s)", 2),
           ("recovery_full", "preemption -> all 4 ranks training (s)", 2),
           ("recovery_steps_lost", "steps lost", 1),
           ("recovery_idle_gpu", "GPUs held idle (GPU-min, world)", 1))
KINDS = (("recovery", "", "One preemption"), ("recovery_overlap", "_2x", "Two overlapping preemptions (0.1 s apart)"))


def three_sided(data: dict[str, Any]) -> bool:
    return "best_realistic_baseline" in ((data.get("recovery") or {}).get("recovery") or {})


def source(out: dict[str, Any], path: Path | None = None) -> tuple[dict[str, Any], str]:
    """The data the recovery section is rendered from, and its path relative to the repo ("" = the main JSON)."""
    path = RECOVERY_JSON if path is None else path
    if three_sided(out):
        return out, ""
    if path.exists():
        data = json.loads(path.read_text())
        if data.get("schema") == 2 and three_sided(data):
            try:
                rel = str(path.relative_to(ROOT))
            except ValueError:
                rel = str(path)
            return data, rel
    return out, ""


def cell(s: dict[str, Any] | None, key: str, digits: int = 2) -> str:
    """A stats cell: median (min-max), or the median alone for one run, or '-'."""
    st = (s or {}).get(key) or {}
    if not st:
        return "-"
    if st.get("n", 1) == 1:
        return f"{st['median']:.{digits}f}"
    return f"{st['median']:.{digits}f} ({st['min']:.{digits}f}-{st['max']:.{digits}f})"


def targets(out: dict[str, Any], t: Any) -> list[dict[str, Any]]:
    """Recovery rows of the targets table (``t``: report_targets.row)."""
    rows = []
    for key, suffix, what in KINDS:
        rec = (out.get(key) or {}).get(f"recovery{suffix}") or {}
        name = f"recovery{suffix}_vs_best_peer"
        why = (out.get(key) or {}).get("not_run") or "; ".join((rec.get("errors") or {}).values()) or "not run"
        if "best_realistic_baseline" in rec:
            r, best = rec.get("ratio_vs_best_realistic_baseline"), rec.get("best_realistic_baseline")
            rows.append(t(name, f"{what.lower()}: preemption -> training again <= 1.2 x the best realistic baseline",
                          why[:200] if r is None else f"{r:.2f} x {best}", None if r is None else r <= 1.2,
                          "" if r is None or r <= 1.2 else f"ours' phases after the preemption (median, s): "
                          f"{rec.get('phases_ours_median_from_t0_s')}; ours recreates the whole gang on a replacement "
                          "node, the elastic job trains on at N-1 ranks after a re-rendezvous"))
            continue
        r = rec.get("ratio_vs_training_operator")  # a run from before the three sides, described as it was run
        old_what = what.split(" (")[0].lower()
        rows.append(t(name, f"recovery from {old_what} (-> gang running again, excl. boot) <= 1.2 x best peer",
                      why[:200] if r is None else f"{r:.2f} x Training Operator restart", None if r is None else r <= 1.2,
                      "" if r is None or r <= 1.2 else f"ours' phases after the preemption (median, s): "
                      f"{rec.get('phases_ours_median_from_t0_s')}; ours recreates the whole gang from its checkpoint, "
                      "the operator only the evicted pods (KWOK survivors keep Running)"))
    return rows


def lines(data: dict[str, Any], src: str) -> list[str]:
    """The doc's recovery section."""
    g = data.get("git", {})
    out = ["", "## Recovery from preemptions", "",
           f"From `{src or 'the bench JSON'}`: `{data.get('command')}`, commit `{g.get('commit')}`"
           f"{' (dirty)' if g.get('dirty') else ''}, started {data.get('started')}. A 4 x 8-GPU spot gang "
           "(`bench/recovery.py`), one node preempted mid-run; three sides in one world, repeats interleaved, every "
           "number from the same pod watch and harness clock. Median (min-max) over the repeats.", ""]
    notes: list[str] = []
    for key, suffix, what in KINDS:
        sec = data.get(key) or {}
        head = sec.get(f"recovery{suffix}")
        if not head:
            out += [f"{what}: {sec.get('not_run') or sec.get('error') or 'not run'}", ""]
            continue
        out += [f"{what} ({head.get('repeats')} repeats):", "",
                "| metric | " + " | ".join(n for _, n in SIDES) + " | ours / best realistic |",
                "|---|" + "---|" * (len(SIDES) + 1)]
        for name, label, digits in METRICS:
            m = sec.get(f"{name}{suffix}") or {}
            r = m.get("ratio_vs_best_realistic_baseline")
            out.append(f"| {label} | " + " | ".join(cell(m.get("stats"), s, digits) for s, _ in SIDES)
                       + f" | {'-' if r is None else f'{r:.2f}'} |")
        if "best_realistic_baseline" not in head:
            out += ["", "A run from before the three sides (ours vs the operator alone): see the JSON.", ""]
            continue
        best = head.get("best_realistic_baseline")
        low = head.get("lowest_non_overlapping")
        out += ["", f"Best realistic baseline (lowest median time to training again): `{best}`. Recovery ratio "
                f"(ours / `{best}`, medians): **{head.get('ratio_vs_best_realistic_baseline')}**. Lowest time to "
                f"training again without overlapping min-max ranges: "
                f"{'`' + low + '`' if low else 'no side (ranges overlap)'}."]
        for side, e in (head.get("errors") or {}).items():
            out.append(f"\nFAILED {side}: {e[:300]}")
        out.append("")
        notes = notes or head.get("notes", [])[:1]
    return out + [*(f"* {n}" for n in notes), ""]
