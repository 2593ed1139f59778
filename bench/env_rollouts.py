"""Benchmark: what an environment connector adds per episode, beside generation. reasoning-gym only, for now.

An episode of a reasoning-gym task and one of a plain dataset with the same prompts cost the same to generate (the
same chat messages reach the engine); what differs is the connector's own work: building the rows (the entries are
generated, split and deduplicated) and scoring (the reward rebuilds each entry from its cached dataset and calls the
task's score_answer) against a plain dataset's rows read from a list and scored by numeric_match. So this times
those two parts on N completions, no engine, and prints one JSON object: per-episode microseconds for each side and
the connector's overhead, with the machine's load (bench/_common.py's LoadWatch).

    .venv/bin/python bench/env_rollouts.py [--task products] [--n 2048] [--size 1000]

Left out: generation itself (identical on both sides) and the other connectors (verifiers, OpenEnv, TRL's
environment_factory classes): bench/env_rollouts_engine.py times every connector's rollouts with the engine, on the
real model, against a plain dataset.
"""

from __future__ import annotations

import argparse
import json
import random
import time

from _common import LoadWatch, emit

from cohort.data.reasoning_gym import PREFIX, _dataset, build_task, task_names
from cohort.rewards import reward_registry


def completions_for(rows: list[dict], n: int, seed: int = 0) -> tuple[list[str], list[dict]]:
    """``n`` completions over the rows, cycling: half end in the right answer, half in a wrong number."""
    rng = random.Random(seed)
    picked = [rows[i % len(rows)] for i in range(n)]
    texts = [f"Let me compute.\nThe answer is {r['answer'] if rng.random() < 0.5 else 'zz 0'}." for r in picked]
    return texts, picked


def time_side(reward, texts: list[str], rows: list[dict], columns: tuple[str, ...]) -> tuple[float, float]:
    """(seconds, mean score) of one reward call over every completion."""
    start = time.perf_counter()
    scores = reward(completions=texts, **{c: [r[c] for r in rows] for c in columns})
    return time.perf_counter() - start, sum(scores) / len(scores)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", default="products")
    parser.add_argument("--config", default='{"max_digits": 2}', help="the task's config fields as JSON")
    parser.add_argument("--n", type=int, default=2048, help="completions scored")
    parser.add_argument("--size", type=int, default=1000, help="data.task_size")
    args = parser.parse_args()
    config = json.loads(args.config)
    task_names()  # reasoning-gym's import (~1 s, every task module) outside the timing
    with LoadWatch() as load:
        _dataset.cache_clear()
        start = time.perf_counter()
        task = build_task(PREFIX + args.task, config, seed=0, size=args.size, eval_size=200, answer_format="last_number")
        build_s = time.perf_counter() - start
        texts, rows = completions_for(task.train_rows, args.n)
        spec = {k: v for k, v in task.reward_specs[0].items() if k not in ("name", "weight")}
        rg_reward = reward_registry.get("reasoning_gym", **spec)
        first_s, _ = time_side(rg_reward, texts[:1], rows[:1], ("rg_index",))  # the dataset is built on first use
        rg_s, rg_mean = time_side(rg_reward, texts, rows, ("rg_index",))
        plain_rows = [{"prompt": r["prompt"], "answer": r["answer"]} for r in rows]
        plain_s, plain_mean = time_side(reward_registry.get("numeric_match"), texts, plain_rows, ("answer",))
    entries = args.size + 200  # generated, then split and deduplicated into rows_built rows
    rows_built = len(task.train_rows) + len(task.eval_rows)
    emit({
        "bench": "env_rollouts.reasoning_gym", "task": args.task, "config": config, "completions": args.n,
        "entries": entries, "rows_built": rows_built, "build_s": round(build_s, 3),
        "build_us_per_entry": round(1e6 * build_s / entries, 1),
        "first_reward_call_s": round(first_s, 4),
        "reasoning_gym_score_us_per_episode": round(1e6 * rg_s / args.n, 1),
        "plain_numeric_match_us_per_episode": round(1e6 * plain_s / args.n, 1),
        "overhead_us_per_episode": round(1e6 * (rg_s - plain_s) / args.n, 1),
        "mean_score": {"reasoning_gym": round(rg_mean, 4), "numeric_match": round(plain_mean, 4)},
        **load.record(),
    })


if __name__ == "__main__":
    main()
