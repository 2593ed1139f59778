"""Does pipeline.max_staleness=1 (generating through the update) change what is learned? The same short run with overlap off and on, per step and per second.

Three arms: `off` (on-policy, vLLM in the trainer), `on` (overlap with vLLM in
the trainer's process) and `local` (overlap with vLLM in a private child
process on its own core: engine.mode=local_server, the trainer's threads
left to the split).

Workload: the tiny benchmark model, 64 addition prompts, 4 prompts × G=8,
16 tokens, lr 3e-3, and a dense reward (the share of digits in the completion),
so a working loop climbs from about 0.05 to near 1 within ~40 steps. Each
(arm, seed) pair runs in a fresh process; the JSON gives the reward curve,
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

common.cohort_cli_environment()  # cohort runs here as `cohort train` would: the CLI's environment, before torch loads


def digit_share(completions, **kwargs) -> list[float]:
    return [sum(ch.isdigit() for ch in c) / max(1, len(c)) for c in completions]


ARMS = {"off": ["pipeline.max_staleness=0"], "on": ["pipeline.max_staleness=1"],
        "local": ["pipeline.max_staleness=1", "engine.mode=local_server", "train.num_threads=null"]}


def child(arm: str, seed: int, steps: int) -> dict:
    common.set_threads(2)
    from _cohort_run import cohort_overrides, default_run_dir

    from cohort.config.resolve import load_config
    from cohort.trainer.trainer import Trainer

    overrides = cohort_overrides(common.tiny_model_dir(), common.addition_file(64), prompts_per_step=4, num_generations=8,
                                 max_completion_length=16, steps=steps, engine="vllm", threads=2,
                                 run_dir=default_run_dir("overlap-learning"),
                                 extra=[*ARMS[arm], "train.learning_rate=3e-3",
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
    return {"arm": arm, "seed": seed, "wall_s": wall, "reward_curve": [round(r, 3) for r in rewards],
            "last10_mean": sum(rewards[-10:]) / len(rewards[-10:]), "steps_to_0.5": reach, **load.record()}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        result = child(args.child[0], int(args.child[1]), args.steps)
        common.emit(result)
        return result
    runs = []
    for seed in args.seeds:
        for arm in ARMS:
            cmd = [sys.executable, __file__, "--child", arm, str(seed), "--steps", str(args.steps)]
            proc = subprocess.run(cmd, capture_output=True, text=True, cwd=common.REPO)
            lines = [l for l in proc.stdout.splitlines() if l.startswith("{\"")]
            runs.append(json.loads(lines[-1]) if lines else {"arm": arm, "seed": seed, "error": proc.stderr[-2000:]})

    def mean(key, arm):
        values = [r[key] for r in runs if r.get("arm") == arm and r.get(key) is not None]
        return sum(values) / len(values) if values else None

    result = {"benchmark": "overlap_learning", "steps": args.steps,
              "summary": {arm: {"last10_mean": mean("last10_mean", arm), "steps_to_0.5": mean("steps_to_0.5", arm),
                                "wall_s": mean("wall_s", arm)} for arm in ARMS},
              "runs": runs, "idle": all(r.get("idle", False) for r in runs)}
    common.emit(result)
    return result


if __name__ == "__main__":
    main()
