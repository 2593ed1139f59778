"""Markdown tables from bench/compare.py's JSON: every run per workload and load, and the default candidates ranked.

    .venv/bin/python bench/compare_table.py bench/compare.json

Speed-up = TRL's median s/step / this run's (above 1: faster than TRL); "vs TRL" uses `trl_default` (TRL as its users
run it), "vs best TRL" the fastest TRL variant measured under the same load. The ranking table scores each cohort
variant that could be a default (on-policy, `candidate`) by the geometric mean over workloads of its speed-up against
`trl_default`, idle and busy, beside issue 13's targets (tiny ≥ 1.0×, long128 ≥ 1.5×, long256 ≥ 2×, m31 ≥ 2×) and its
busy / idle slowdown (target ≤ 2×). Runs whose `foreign_cores` reached 0.2 (not alone on the machine) are marked `*`.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

TARGETS = {"tiny": 1.0, "long128": 1.5, "long256": 2.0, "m31": 2.0}
BUSY_SLOWDOWN_TARGET = 2.0


def index(doc: dict) -> dict[tuple[str, str, str], dict]:
    """(workload, load, variant) → run, measured runs only."""
    return {(r["workload"], r["load"], r["variant"]): r for r in doc.get("runs", []) if r.get("median_step_s")}


def best_trl(runs: dict, workload: str, load: str) -> tuple[str, float] | None:
    found = [(v, r["median_step_s"]) for (w, l, v), r in runs.items() if w == workload and l == load and r["side"] == "trl"]
    return min(found, key=lambda item: item[1]) if found else None


def _fmt(x, digits: int = 3) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    return f"{x:.{digits}g}" if isinstance(x, float) else str(x)


def _share(run: dict, phase: str) -> str:
    p = run.get("phases", {}).get(phase)
    return f"{p['share']:.0%}" if p and p.get("share") is not None else "–"


def run_tables(doc: dict) -> list[str]:
    """One table per (workload, load): every run, fastest first."""
    runs, lines = index(doc), []
    keys = sorted({(w, l) for (w, l, _) in runs}, key=lambda k: (list(TARGETS).index(k[0]) if k[0] in TARGETS else 9, k[1]))
    for workload, load in keys:
        trl = runs.get((workload, load, "trl_default"))
        best = best_trl(runs, workload, load)
        lines += [f"### {workload}, {load}", "",
                  "| variant | s/step | vs TRL | vs best TRL | generate | update | sync | trainer idle | engine idle (cpu) | engine idle (phase) |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        rows = sorted(((v, r) for (w, l, v), r in runs.items() if w == workload and l == load), key=lambda vr: vr[1]["median_step_s"])
        for variant, run in rows:
            s = run["median_step_s"]
            mark = "" if run.get("clean", True) else " *"
            lines.append(f"| {variant}{'' if run['candidate'] else ' (off-policy)'}{mark} | {s:.3f} | "
                         f"{_fmt(trl['median_step_s'] / s if trl else None)} | {_fmt(best[1] / s if best else None)} | "
                         f"{_share(run, 'generate')} | {_share(run, 'update')} | {_share(run, 'sync')} | "
                         f"{_fmt(run.get('trainer_idle_fraction'), 2)} | {_fmt(run.get('engine_idle_fraction'), 2)} | "
                         f"{_fmt(run.get('engine_idle_fraction_phase'), 2)} |")
        lines.append("")
    return lines


def speedups(runs: dict, variant: str, load: str) -> dict[str, float]:
    """workload → trl_default's s/step / variant's, where both were measured under `load`."""
    out = {}
    for workload in TARGETS:
        ours, theirs = runs.get((workload, load, variant)), runs.get((workload, load, "trl_default"))
        if ours and theirs:
            out[workload] = theirs["median_step_s"] / ours["median_step_s"]
    return out


def geometric_mean(values: list[float]) -> float | None:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def ranking_table(doc: dict) -> list[str]:
    """The default candidates, best idle geometric-mean speed-up first."""
    runs = index(doc)
    candidates = sorted({v for (_, _, v), r in runs.items() if r["side"] == "cohort" and r["candidate"]})
    rows = []
    for variant in candidates:
        idle, busy = speedups(runs, variant, "idle"), speedups(runs, variant, "busy")
        slowdown = [runs[(w, "busy", variant)]["median_step_s"] / runs[(w, "idle", variant)]["median_step_s"]
                    for w in TARGETS if (w, "busy", variant) in runs and (w, "idle", variant) in runs]
        met = [w for w, x in idle.items() if x >= TARGETS[w]]
        rows.append((geometric_mean(list(idle.values())) or 0.0, variant, idle, busy, max(slowdown) if slowdown else None, met))
    head = " | ".join(f"{w} (≥{t}×) idle / busy" for w, t in TARGETS.items())
    lines = ["### default candidates (speed-up vs trl_default; on-policy cohort variants)", "",
             f"| variant | {head} | geo-mean idle | geo-mean busy | worst busy/idle slowdown (≤{BUSY_SLOWDOWN_TARGET}×) | targets met idle |",
             "|---|" + "---|" * (len(TARGETS) + 4)]
    for gm_idle, variant, idle, busy, slowdown, met in sorted(rows, key=lambda row: -row[0]):
        cells = " | ".join(f"{_fmt(idle.get(w))} / {_fmt(busy.get(w))}" for w in TARGETS)
        lines.append(f"| {variant} | {cells} | {_fmt(gm_idle or None)} | {_fmt(geometric_mean(list(busy.values())))} | "
                     f"{_fmt(slowdown)} | {', '.join(met) or '–'} |")
    return lines + [""]


def markdown_tables(doc: dict) -> str:
    quick = ["**--quick run: these numbers only show that each run works; they measure nothing.**", ""] if doc.get("quick") else []
    return "\n".join(quick + ranking_table(doc) + run_tables(doc))


if __name__ == "__main__":
    print(markdown_tables(json.loads(Path(sys.argv[1]).read_text())))
