"""Asynchronous training (pipeline.max_staleness) against the synchronous trainer on the arith demo, as users run it.

    .venv/bin/python bench/async_arith.py [--arms sync async2 local_async2] [--seeds 0 1 2] [--out bench/async_arith.json]
                                          [overrides...]

Each run is `cohort train examples/arith.yaml` (the demo's preset, 300 steps) in its own process with `train.seed` and
`rollout.seed` set to the seed and a greedy held-out eval every 25 steps (`run.eval_every=25`). Arms: `sync` (as is),
`async2` (pipeline.max_staleness=2, vLLM in the trainer's process), `local_async2` (the same with engine.mode=local_server:
vLLM in a child process on its own core). Per run: the accuracy curve against the cumulative step time (evals and
start-up left out: `train_s`), the final accuracy, and the whole run's wall time. The summary per arm: mean and spread
of the final accuracy and of train_s, and `time_to_sync_final`: the train_s at the first eval whose accuracy reaches the
synchronous arm's mean final accuracy (None when never reached), as a fraction of the synchronous arm's mean train_s.
The 1-minute load average before and after each run is recorded; `idle` is false when either was at or above
`_common.IDLE_LOAD`. Not part of `make bench`: nine runs take about half an hour.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _common as common

ARMS = {"sync": [], "async2": ["pipeline.max_staleness=2"],
        "local_async2": ["pipeline.max_staleness=2", "engine.mode=local_server"]}


def run_one(arm: str, seed: int, overrides: list[str], work: Path) -> dict:
    run_dir = work / f"{arm}-{seed}"
    cmd = [str(common.REPO / ".venv" / "bin" / "cohort"), "train", str(common.REPO / "examples" / "arith.yaml"),
           f"run.output_dir={run_dir}", "run.progress=false", "run.loggers=[jsonl]", "run.eval_every=25",
           f"train.seed={seed}", f"rollout.seed={seed}", *ARMS[arm], *overrides]
    load_before, start = common.load_average(), time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall_s, load_after = time.perf_counter() - start, common.load_average()
    if proc.returncode != 0:
        return {"arm": arm, "seed": seed, "error": proc.stderr[-2000:]}
    steps = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    steps = [s for s in steps if "timing/step_s" in s]
    evals = [json.loads(x) for x in (run_dir / "eval.jsonl").read_text().splitlines() if x.strip()]
    elapsed, total = {}, 0.0
    for s in steps:
        total += s["timing/step_s"]
        elapsed[s["step"]] = total
    curve = [(e["step"], round(elapsed.get(e["step"], 0.0), 2), e["accuracy"]) for e in evals if "accuracy" in e]
    return {"arm": arm, "seed": seed, "curve_step_train_s_accuracy": curve, "final_accuracy": curve[-1][2] if curve else None,
            "train_s": round(total, 1), "wall_s": round(wall_s, 1),
            "staleness_max": max((s.get("staleness/max", 0.0) for s in steps), default=0.0),
            "load_before": load_before, "load_after": load_after,
            "idle": load_before < common.IDLE_LOAD and load_after < common.IDLE_LOAD, "command": " ".join(cmd)}


def summarise(runs: list[dict]) -> dict:
    ok = [r for r in runs if "error" not in r]
    arms = sorted({r["arm"] for r in ok})
    sync = [r for r in ok if r["arm"] == "sync"]
    target = statistics.mean(r["final_accuracy"] for r in sync) if sync else None
    sync_s = statistics.mean(r["train_s"] for r in sync) if sync else None
    out = {}
    for arm in arms:
        mine = [r for r in ok if r["arm"] == arm]
        reach = [next((t for _, t, acc in r["curve_step_train_s_accuracy"] if target is not None and acc >= target), None)
                 for r in mine]
        out[arm] = {"final_accuracy_mean": statistics.mean(r["final_accuracy"] for r in mine),
                    "final_accuracy_spread": [min(r["final_accuracy"] for r in mine), max(r["final_accuracy"] for r in mine)],
                    "train_s_mean": statistics.mean(r["train_s"] for r in mine),
                    "time_to_sync_final_s": reach,
                    "time_to_sync_final_fraction": [None if t is None or not sync_s else round(t / sync_s, 3) for t in reach],
                    "staleness_max": max(r["staleness_max"] for r in mine), "all_idle": all(r["idle"] for r in mine)}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--out", default=str(common.BENCH_DIR / "async_arith.json"))
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    runs = []
    with tempfile.TemporaryDirectory(prefix="cohort-async-") as tmp:
        for seed in args.seeds:
            for arm in args.arms:
                runs.append(run_one(arm, seed, args.overrides, Path(tmp)))
                print(json.dumps(runs[-1]), flush=True)
    result = {"machine": common.machine() if hasattr(common, "machine") else None, "runs": runs, "summary": summarise(runs)}
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["summary"], indent=2))
    return 0 if all("error" not in r for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
