"""The tiny GRPO benchmark (issue 2): median seconds per optimizer step, with the per-phase breakdown.

Workload: a random tiny Qwen2 (hidden 128, 4 layers, 4 heads, 2 KV heads,
intermediate 512, tied embeddings, character tokenizer), 64 addition prompts,
4 prompts × G=8 per step, max_completion_length 16, temperature 1, beta 0,
lr 1e-4, 10 steps, 2 threads. Prints one JSON object: median s/step (first step
excluded), rollout tokens/s, training tokens/s, the phases, peak RSS, load
average before and after.

    .venv/bin/python bench/grpo_step.py [--engine vllm|hf] [--steps 10] [--set key=value ...]

`--set` passes extra config overrides (e.g. `--set train.max_tokens_per_microbatch=2048`),
which is how the fast-path options are compared before/after.
"""

from __future__ import annotations

import argparse

import _common as common

common.cohort_cli_environment()  # cohort runs here as `cohort train` would: the CLI's environment, before torch loads
from _cohort_run import cohort_overrides, default_run_dir, run_steps  # noqa: E402  (after the environment above)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", default="vllm", choices=["vllm", "hf"])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompts-per-step", type=int, default=4)
    ap.add_argument("--num-generations", type=int, default=8)
    ap.add_argument("--max-completion-length", type=int, default=16)
    ap.add_argument("--limits", action="store_true", help="also time each phase's limit on the last batch")
    ap.add_argument("--name", default="grpo_step")
    ap.add_argument("--set", dest="extra", action="append", default=[], help="extra cohort config override")
    args = ap.parse_args(argv)
    common.set_threads(args.threads)
    overrides = cohort_overrides(common.tiny_model_dir(), common.addition_file(64), prompts_per_step=args.prompts_per_step,
                                 num_generations=args.num_generations, max_completion_length=args.max_completion_length,
                                 steps=args.steps, engine=args.engine, threads=args.threads,
                                 run_dir=default_run_dir("grpo_step"), extra=args.extra)
    result = {"benchmark": args.name, "trainer": "cohort", "engine": args.engine, "threads": args.threads,
              "prompts_per_step": args.prompts_per_step, "num_generations": args.num_generations,
              "max_completion_length": args.max_completion_length, "overrides": args.extra}
    result |= run_steps(overrides, args.steps, limits=args.limits)
    common.emit(result)
    return result


if __name__ == "__main__":
    main()
