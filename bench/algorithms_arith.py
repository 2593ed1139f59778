"""Each algorithm's example config on the arith task, end to end: greedy held-out accuracy before and after, wall time, s/step.

    .venv/bin/python bench/algorithms_arith.py [--only grpo rloo reinforce_pp ppo] [--out bench/algorithms_arith.json] [overrides...]

Each run is `cohort train examples/<name>_arith.yaml` in its own process (its own
vLLM engine), one after the other, from the same starting model (tiny:arith). It
prints one JSON object per algorithm on stdout and writes them all to `--out`.
`wall_s` is the whole `cohort train` run (model build or cache load, engine
start, both evals, training, saving); `train_s` is the sum of the step times;
`median_step_s` excludes the first step. The 1-minute load average before and
after each run is recorded and `idle` is false when either was at or above
`_common.IDLE_LOAD`: such timings are not comparable (accuracy still is).

Not part of `make bench` (`run_all.py`): the four runs take about half an hour.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _common as common
import yaml

ALGORITHMS = ("grpo", "rloo", "reinforce_pp", "ppo")


def run_one(name: str, overrides: list[str], work: Path) -> dict:
    run_dir = work / f"run-{name}"
    cmd = [str(common.REPO / ".venv" / "bin" / "cohort"), "train", str(common.REPO / "examples" / f"{name}_arith.yaml"),
           f"run.output_dir={run_dir}", "run.progress=false", "run.loggers=[jsonl]", *overrides]
    load_before, start = common.load_average(), time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall_s, load_after = time.perf_counter() - start, common.load_average()
    if proc.returncode != 0:
        return {"algorithm": name, "error": proc.stderr[-2000:], "returncode": proc.returncode}
    summary = json.loads((run_dir / "summary.json").read_text())
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    before, after = summary.get("eval/accuracy_before"), summary.get("eval/accuracy_after")
    resolved = yaml.safe_load((run_dir / "config.yaml").read_text())["algorithm"]
    rewards = [s["reward"] for s in steps if "reward" in s]
    return {
        "algorithm": name, "ran": {k: resolved[k] for k in ("name", "beta", "kl_controller")},
        "accuracy_before": before, "accuracy_after": after,
        "train_reward_first_last_20": [round(sum(rewards[:20]) / 20, 3), round(sum(rewards[-20:]) / 20, 3)],
        "gain_points": None if before is None or after is None else round(100 * (after - before), 1),
        "wall_s": round(wall_s, 1), "train_s": round(sum(s["timing/step_s"] for s in steps), 1),
        "steps": summary["steps"], "median_step_s": round(summary["median_step_s"], 3),
        "phase_s_per_step": {k[len("timing/"):-2]: round(sum(s.get(k, 0.0) for s in steps) / len(steps), 3)
                             for k in sorted({k for s in steps for k in s if k.startswith("timing/") and k.count("/") == 1})},
        "load_before": load_before, "load_after": load_after,
        "idle": load_before < common.IDLE_LOAD and load_after < common.IDLE_LOAD,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="*", default=list(ALGORITHMS), choices=ALGORITHMS)
    parser.add_argument("--out", default=str(common.BENCH_DIR / "algorithms_arith.json"))
    parser.add_argument("overrides", nargs="*", help="dotted overrides applied to every run (e.g. train.max_steps=20)")
    args = parser.parse_args()
    results = []
    with tempfile.TemporaryDirectory(prefix="cohort-algorithms-") as tmp:
        for name in args.only:
            result = run_one(name, args.overrides, Path(tmp))
            print(json.dumps(result), flush=True)
            results.append(result)
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    return 0 if all("error" not in r for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
