"""Partial rollouts where the long tail exists: synchronous vs `pipeline.over_provision` on examples/long_tail.yaml
(the built-in long_tail task with tiny:long_tail, 256-token completions), through `cohort train` as a user runs it.

Per mode and seed (`train.seed` and `rollout.seed` both set to it; modes run in alternating order, seed by seed, so
drift in the machine's load does not favour one mode):
- `step_s`: the mean of `timing/step_s` over steps 2..N (the first carries one-time warm-up; the mean, not the median,
  because with over-provisioning a step that trains buffered groups alone can be much shorter than one that
  generates), its median beside it, and `steps_wall_s`, the sum over every step;
- `trained_tokens_per_s`: the completion tokens the batches trained (`tokens/generated`) over the same steps'
  time (steps 2..N);
- where a step's time goes (means over steps 2..N): `generate_s`, of which `tail_s` (`rollout/tail_s`: the trainer
  polled the engine while fewer than half the batch's completions were still decoding) and the rest at full batch
  (`full_batch_s`), and the update, reward, sync phases;
- what partial rollouts did (sums): `partial/aborted`, `partial/resumed`, and the mean `partial/ratio` (the share of
  trained completions holding tokens from an earlier batch: the off-policy part);
- learning: the held-out greedy accuracy before and after the run (`summary.json`), the training reward of the
  first and last 5 steps, and the completion lengths the policy sampled (`completions/mean_length`, `max_length`);
- the load average before and after, and the CPU other processes used meanwhile (`foreign_cores`, bench/_common).

Ratios against the synchronous run of the same seed, and their means, close the output.

    .venv/bin/python bench/long_tail_partial.py [--steps 30] [--seeds 0 1 2] [--only NAME ...] > bench/long_tail_partial.json
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

MODES: dict[str, list[str]] = {
    "synchronous": [],
    "over_provision=1.5": ["pipeline.over_provision=1.5"],
    "over_provision=2": ["pipeline.over_provision=2"],
}
PHASES = ("generate", "reward", "logprob", "update", "sync")
COUNTED = ("partial/aborted", "partial/resumed", "partial/pinned")


def run_once(name: str, seed: int, steps: int, root: Path) -> dict:
    out = root / f"{name.replace('=', '')}-seed{seed}"
    command = [str(Path(sys.executable).parent / "cohort"), "train", "examples/long_tail.yaml", *MODES[name],
               f"train.max_steps={steps}", f"train.seed={seed}", f"rollout.seed={seed}", f"run.output_dir={out}",
               "run.progress=false", "run.eval_every=0", "run.log_completions_every=0"]
    with common.LoadWatch() as load:
        start = time.perf_counter()
        done = subprocess.run(command, cwd=common.REPO, capture_output=True, text=True)
        seconds = time.perf_counter() - start
    result = {"mode": name, "seed": seed, "returncode": done.returncode, "wall_s": round(seconds, 1), **load.record()}
    if done.returncode:
        return result | {"stderr_tail": done.stderr[-2000:]}
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    summary = json.loads((out / "summary.json").read_text())
    return result | summarise([r for r in rows if "reward" in r], summary)


def summarise(rows: list[dict], summary: dict) -> dict:
    """The figures of one run (module docstring) from its metrics rows and summary.json."""
    steady = rows[1:]
    mean = lambda key: statistics.mean(r.get(key, 0.0) for r in steady)  # noqa: E731
    steady_s = sum(r["timing/step_s"] for r in steady)
    phases = {p: round(mean(f"timing/{p}_s"), 4) for p in PHASES}
    tail = mean("rollout/tail_s")
    return {
        "steps": len(rows),
        "step_s": round(mean("timing/step_s"), 4),
        "step_s_median": round(statistics.median(r["timing/step_s"] for r in steady), 4),
        "steps_wall_s": round(sum(r["timing/step_s"] for r in rows), 2),
        "trained_tokens_per_s": round(sum(r["tokens/generated"] for r in steady) / steady_s, 1),
        "trained_tokens_per_step": round(statistics.mean(r["tokens/generated"] for r in steady), 1),
        "phases_s": phases,
        "tail_s": round(tail, 4),
        "full_batch_s": round(phases["generate"] - tail, 4),
        "completion_mean_length": round(statistics.mean(r["completions/mean_length"] for r in rows), 2),
        "completion_max_length": max(r["completions/max_length"] for r in rows),
        **{key: sum(r.get(key, 0.0) for r in rows) for key in COUNTED if any(key in r for r in rows)},
        **({"partial/ratio_mean": round(statistics.mean(r.get("partial/ratio", 0.0) for r in rows), 4)}
           if any("partial/ratio" in r for r in rows) else {}),
        "reward_first5": round(statistics.mean(r["reward"] for r in rows[:5]), 4),
        "reward_last5": round(statistics.mean(r["reward"] for r in rows[-5:]), 4),
        "accuracy_before": summary.get("eval/accuracy_before"),
        "accuracy_after": summary.get("eval/accuracy_after"),
    }


def ratios(runs: list[dict]) -> dict:
    """Each mode against the synchronous run of the same seed: speed-ups (higher is better) and the accuracy gap."""
    sync = {r["seed"]: r for r in runs if r["mode"] == "synchronous" and not r["returncode"]}
    out: dict[str, dict] = {}
    for run in runs:
        base = sync.get(run["seed"])
        if run["mode"] == "synchronous" or base is None or run["returncode"]:
            continue
        entry = out.setdefault(run["mode"], {"step_s_speedup": [], "tokens_per_s_speedup": [], "accuracy_gap_points": []})
        entry["step_s_speedup"].append(round(base["step_s"] / run["step_s"], 3))
        entry["tokens_per_s_speedup"].append(round(run["trained_tokens_per_s"] / base["trained_tokens_per_s"], 3))
        entry["accuracy_gap_points"].append(round(100 * (run["accuracy_after"] - base["accuracy_after"]), 1))
    for entry in out.values():
        entry.update({f"{key}_mean": round(statistics.mean(values), 3) for key, values in list(entry.items())})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--only", nargs="*", default=None, help="mode names (default: all)")
    args = parser.parse_args()
    names = [n for n in MODES if args.only is None or n in args.only]
    load_before, runs = common.load_average(), []
    with tempfile.TemporaryDirectory(prefix="cohort-long-tail-") as tmp:
        for i, seed in enumerate(args.seeds):
            for name in names if i % 2 == 0 else names[::-1]:
                runs.append(run_once(name, seed, args.steps, Path(tmp)))
                print(f"{name} seed {seed}: rc {runs[-1]['returncode']}, step {runs[-1].get('step_s')} s, "
                      f"{runs[-1].get('trained_tokens_per_s')} tok/s, accuracy {runs[-1].get('accuracy_after')}", file=sys.stderr)
    result = {"steps": args.steps, "seeds": args.seeds, "load_before": load_before, "load_after": common.load_average(),
              "runs": runs, "against_synchronous": ratios(runs)}
    (common.BENCH_DIR / "long_tail_partial.json").write_text(json.dumps(result, indent=1) + "\n")
    common.emit(result)


if __name__ == "__main__":
    main()
