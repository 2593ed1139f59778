"""Does rollout.overlap change what is learned? The same short run with overlap off and on, per step and per second.

Workload: the tiny benchmark model, 64 addition prompts, 4 prompts × G=8,
16 tokens, lr 3e-3, and a dense reward (the share of digits in the completion),
so a working loop climbs from about 0.05 to near 1 within ~40 steps. Each
(overlap, seed) pair runs in a fresh process; the JSON gives the reward curve,
the mean reward of the last 10 steps, the steps needed to first reach a mean
reward of 0.5 over 5 steps, and the wall seconds of the steps.

    .venv/bin/python bench/overlap_learning.py [--steps 40] [--seeds 0 1]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

import _common as common


def digit_share(completions, **kwargs) -> list[float]:
    return [sum(ch.isdigit() for ch in c) / max(1, len(c)) for c in completions]


def child(overlap: bool, seed: int, steps: int) -> dict:
    common.set_threads(2)
    from _cohort_run import cohort_overrides, default_run_dir

    from cohort.config import load_config
    from cohort.trainer.loop import Trainer

    overrides = cohort_overrides(common.tiny_model_dir(), common.addition_file(64), prompts_per_step=4, num_generations=8,
                                 max_completion_length=16, steps=steps, engine="vllm", threads=2,
                                 run_dir=default_run_dir("overlap-learning"),
                                 extra=[f"rollout.overlap={str(overlap).lower()}", "train.learning_rate=3e-3",
                                        f"train.seed={seed}", f"rollout.seed={seed}",
                                        "rewards=[{name: 'bench.overlap_learning:digit_share'}]"])
    trainer = Trainer(load_config(None, overrides), log=lambda *a, **k: None)
    rewards, start = [], time.perf_counter()
    with common.LoadWatch() as load:
        for _ in range(steps):
            rewards.append(trainer.step()["reward"])
    wall = time.perf_counter() - start
    trainer.close()
    smooth = [sum(rewards[max(0, i - 4): i + 1]) / len(rewards[max(0, i - 4): i + 1]) for i in range(len(rewards))]
    reach = next((i + 1 for i, r in enumerate(smooth) if r >= 0.5), None)
    return {"overlap": overlap, "seed": seed, "wall_s": wall, "reward_curve": [round(r, 3) for r in rewards],
            "last10_mean": sum(rewards[-10:]) / len(rewards[-10:]), "steps_to_0.5": reach, **load.record()}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        result = child(args.child[0] == "1", int(args.child[1]), args.steps)
        common.emit(result)
        return result
    runs = []
    for seed in args.seeds:
        for overlap in (False, True):
            cmd = [sys.executable, __file__, "--child", "1" if overlap else "0", str(seed), "--steps", str(args.steps)]
            proc = subprocess.run(cmd, capture_output=True, text=True, cwd=common.REPO)
            lines = [l for l in proc.stdout.splitlines() if l.startswith("{\"")]
            runs.append(json.loads(lines[-1]) if lines else {"overlap": overlap, "seed": seed, "error": proc.stderr[-2000:]})

    def mean(key, overlap):
        values = [r[key] for r in runs if r.get("overlap") == overlap and r.get(key) is not None]
        return sum(values) / len(values) if values else None

    result = {"benchmark": "overlap_learning", "steps": args.steps,
              "summary": {name: {"last10_mean": mean("last10_mean", flag), "steps_to_0.5": mean("steps_to_0.5", flag),
                                 "wall_s": mean("wall_s", flag)} for name, flag in (("off", False), ("on", True))},
              "runs": runs, "idle": all(r.get("idle", False) for r in runs)}
    common.emit(result)
    return result


if __name__ == "__main__":
    main()
