"""Benchmark: score 256 ``code_tests`` completions in parallel through a RewardSet.

The mix (by default): 70% correct, 20% wrong (wrong answer, exception, syntax error),
10% hostile (infinite loop, sleep, memory bomb, fork bomb, network attempt). Prints one
JSON object: completions/s, wall seconds, load average before/after, mean score per
kind, and whether any sandbox process was left behind.

    .venv/bin/python bench/rewards.py [--n 256] [--timeout-s 2] [--max-parallel N]
"""

from __future__ import annotations

import argparse
import json
import os
import time

from cohort.rewards import RewardSet
from cohort.rewards.sandbox import processes_of_uid

TESTS = [
    "assert running_max([3, 1, 4, 1, 5]) == [3, 3, 4, 4, 5]",
    "assert running_max([]) == []",
    "assert running_max([-2, -5, 0]) == [-2, -2, 0]",
]
CORRECT = [
    "```python\ndef running_max(xs):\n    out, best = [], None\n    for x in xs:\n"
    "        best = x if best is None else max(best, x)\n        out.append(best)\n    return out\n```",
    "Sure:\n```python\nfrom itertools import accumulate\n\ndef running_max(xs):\n"
    "    return list(accumulate(xs, max))\n```",
]
WRONG = [
    "```python\ndef running_max(xs):\n    return sorted(xs)\n```",  # passes 1 of 3
    "```python\ndef running_max(xs):\n    return [max(xs)] * len(xs)\n```",  # raises on []
    "```python\ndef running_max(xs)\n    return xs\n```",  # syntax error
]
HOSTILE = [
    "```python\nwhile True:\n    pass\n```",
    "```python\nimport time\ntime.sleep(600)\n```",
    "```python\nhog = []\nwhile True:\n    hog.append(bytearray(64 << 20))\n```",
    "```python\nimport os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n```",
    "```python\nimport socket\nsocket.create_connection(('1.1.1.1', 80), timeout=1)\n```",
]


def make_batch(n: int, hostile_frac: float, wrong_frac: float) -> tuple[list[str], list[str]]:
    n_hostile = round(n * hostile_frac)
    n_wrong = round(n * wrong_frac)
    kinds = ["hostile"] * n_hostile + ["wrong"] * n_wrong + ["correct"] * (n - n_hostile - n_wrong)
    pools = {"correct": CORRECT, "wrong": WRONG, "hostile": HOSTILE}
    completions = [pools[kind][i % len(pools[kind])] for i, kind in enumerate(kinds)]
    order = sorted(range(n), key=lambda i: (i * 7919) % n)  # deterministic shuffle
    return [completions[i] for i in order], [kinds[i] for i in order]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=256)
    parser.add_argument("--timeout-s", type=float, default=2.0, help="per-completion sandbox wall clock")
    parser.add_argument("--max-parallel", type=int, default=None, help="default: twice the CPUs")
    parser.add_argument("--hostile-frac", type=float, default=0.1)
    parser.add_argument("--wrong-frac", type=float, default=0.2)
    args = parser.parse_args()

    completions, kinds = make_batch(args.n, args.hostile_frac, args.wrong_frac)
    spec = {"name": "code_tests", "run_timeout_s": args.timeout_s, "max_processes": 8, "memory_mb": 512}
    if args.max_parallel:
        spec["max_parallel"] = args.max_parallel
    rs = RewardSet.from_specs([spec], timeout_s=3600.0)
    function = rs.functions[0]
    load_before = os.getloadavg()
    start = time.perf_counter()
    out = rs.score(
        prompts=[""] * args.n,
        completions=completions,
        completion_ids=[[0]] * args.n,
        columns={"tests": [TESTS] * args.n},
    )
    wall_s = time.perf_counter() - start
    load_after = os.getloadavg()
    rs.close()
    scores = out.per_function[:, 0]
    by_kind = {k: round(float(scores[[i for i, kk in enumerate(kinds) if kk == k]].mean()), 4) for k in set(kinds)}
    print(
        json.dumps(
            {
                "bench": "rewards.code_tests",
                "completions": args.n,
                "wall_s": round(wall_s, 3),
                "completions_per_s": round(args.n / wall_s, 2),
                "load_avg_before": [round(x, 2) for x in load_before],
                "load_avg_after": [round(x, 2) for x in load_after],
                "cpus": os.cpu_count(),
                "isolation": function.sandbox.mode,
                "max_parallel": function.max_parallel,
                "run_timeout_s": args.timeout_s,
                "mean_score_by_kind": by_kind,
                "sandbox_processes_left": len(processes_of_uid(range(1_900_000_000, 1_900_000_256))),
            }
        )
    )


if __name__ == "__main__":
    main()
