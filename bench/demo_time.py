"""Benchmark: `make demo` from command to printed result, as a newcomer runs it on a fresh machine (issue 46).

Each run is `make demo` (`cohort train`, no config) in a fresh process with an empty cohort cache and an empty vLLM
cache (`COHORT_CACHE`, `VLLM_CACHE_ROOT` pointed at new temporary directories: what a fresh machine has), the
console's progress on. Prints one JSON object: per run the command's wall seconds, the training seconds
(summary.json's `wall_s`), the held-out accuracy before and after, the seconds before the first step (the model's
install, vLLM's start, the first evaluation), the machine's load around it; then the medians.

    .venv/bin/python bench/demo_time.py [--runs 3] [--seed 0] [--warm]

`--warm` keeps the caches between runs (a second `make demo` on the same machine). Nothing else is set: the
demo runs with the environment `make demo` gives it (the Makefile's exports).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from _common import REPO, LoadWatch, emit, load_average

from cohort.models.devices import cpu_model, has_bf16_units


def one_run(seed: int, caches: Path, run_dir: Path) -> dict:
    env = {**os.environ, "COHORT_CACHE": str(caches / "cohort"), "VLLM_CACHE_ROOT": str(caches / "vllm")}
    # `make demo` is `cohort train` with nothing else; the run directory (and a seed other than the default) go in as
    # command-line overrides, which `make demo` does not take: the same command line it runs, plus those
    command = [str(Path(sys.executable).parent / "cohort"), "train", f"run.output_dir={run_dir}"]
    command += [f"train.seed={seed}"] if seed else []
    with LoadWatch() as load:
        start = time.perf_counter()
        proc = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"the demo failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    summary = json.loads((run_dir / "summary.json").read_text())
    return {"wall_s": round(wall, 1), "train_s": round(summary["wall_s"], 1),
            "before_training_s": round(wall - summary["wall_s"], 1),
            "accuracy_before": summary["eval/accuracy_before"], "accuracy_after": summary["eval/accuracy_after"],
            "gain_points": round(100 * (summary["eval/accuracy_after"] - summary["eval/accuracy_before"]), 1),
            "median_step_s": round(summary.get("median_step_s", float("nan")), 3), **load.record()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--warm", action="store_true", help="keep the caches between runs")
    args = parser.parse_args()
    runs = []
    with tempfile.TemporaryDirectory(prefix="cohort-demo-bench-") as scratch:
        for i in range(args.runs):
            caches = Path(scratch) / ("caches" if args.warm else f"caches-{i}")
            runs.append(one_run(args.seed, caches, Path(scratch) / f"run-{i}"))
            print(f"run {i + 1}/{args.runs}: {runs[-1]}", file=sys.stderr, flush=True)
    emit({"benchmark": "demo_time", "command": "cohort train (make demo), fresh caches" + (" once" if args.warm else " each run"),
          "seed": args.seed, "cpu": _cpu(), "cores": os.cpu_count(), "runs": runs,
          "median_wall_s": statistics.median(r["wall_s"] for r in runs),
          "median_train_s": statistics.median(r["train_s"] for r in runs),
          "load_at_end": load_average()})


def _cpu() -> str:
    return cpu_model() + (" (AVX512-BF16)" if has_bf16_units(torch.device("cpu")) else " (no bf16 units)")


if __name__ == "__main__":
    main()
