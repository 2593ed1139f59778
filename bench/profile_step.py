"""Where one `cohort train` step goes: cProfile over steady steps of a bench/compare.py workload, as shares of the step.

The trainer is built from the same command line bench/compare.py gives the CLI for `--variant` (default
cohort_default), in the CLI's environment. `--warmup` steps run first, unprofiled (the first step holds one-time
costs: vLLM's first shapes, the sync check's calibration); then `run_training` (what `cohort train` runs: the step,
the metrics logger, diagnostics, sample completions, the progress bar) continues to train.max_steps under cProfile.
Relative shares are meaningful even on a loaded machine; absolute seconds are not.

Prints one JSON object: the profiled steps' wall time; for each fixed per-step cost (FIXED_COSTS: name → the
functions whose cumulative time it is) seconds per step and share of the profiled time; and the functions in
cohort/ by cumulative time. Functions nest, so shares of different rows overlap (generation contains the engine
call; the update contains forward, backward and the optimizer).

    .venv/bin/python bench/profile_step.py [--workload tiny] [--variant cohort_default] [--steps 10] [--warmup 2]
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import pstats
import sys
import time

import _common as common

common.cohort_cli_environment()  # as `cohort train` runs, before torch loads

from compare import VARIANTS, WORKLOADS, command, model_dirs  # noqa: E402

# name → (file suffix, function name): cumulative time per step of each (nested rows overlap)
FIXED_COSTS = {
    "step (Trainer.step)": ("cohort/trainer/trainer.py", "step"),
    "generation (Trainer.generate_batch)": ("cohort/trainer/trainer.py", "generate_batch"),
    "engine call (VLLMEngine._sample)": ("cohort/rollout/engines/vllm.py", "_sample"),
    "vLLM LLM.generate": ("vllm/entrypoints/llm.py", "generate"),
    "rewards (RewardSet.score: hand-off to its event-loop thread and back)": ("cohort/rewards/reward_set.py", "score"),
    "update (Trainer.update)": ("cohort/trainer/trainer.py", "update"),
    "backward": ("torch/_tensor.py", "backward"),
    "optimizer + clip (Trainer._clip_and_step)": ("cohort/trainer/trainer.py", "_clip_and_step"),
    "optimizer.step": ("torch/optim/optimizer.py", "wrapper"),
    "weight sync (WeightSync.push)": ("cohort/trainer/weight_sync.py", "push"),
    "reload (VLLMEngine.update_weights)": ("cohort/rollout/engines/vllm.py", "update_weights"),
    "canary log-probs (WeightSync.canary_logprobs)": ("cohort/trainer/weight_sync.py", "canary_logprobs"),
    "canary engine score (VLLMEngine.score)": ("cohort/rollout/engines/vllm.py", "score"),
    "metrics logger (MetricsLogger.log)": ("cohort/runs/loggers.py", "log"),
    "diagnostics (Diagnostics.observe)": ("cohort/trainer/diagnostics.py", "observe"),
    "sample completions (_log_completions)": ("cohort/trainer/run.py", "_log_completions"),
}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", default="tiny", choices=list(WORKLOADS))
    ap.add_argument("--variant", default="cohort_default", choices=[n for n, v in VARIANTS.items() if v.side == "cohort"])
    ap.add_argument("--steps", type=int, default=10, help="profiled steps")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--stats-out", default=None, help="also dump the raw cProfile stats here (for pstats / snakeviz)")
    args = ap.parse_args(argv)

    from cohort.config.resolve import load_config
    from cohort.trainer.trainer import Trainer
    from cohort.trainer.run import run_training

    workload = WORKLOADS[args.workload]
    run_dir = common.CACHE / "profile" / f"{args.workload}-{args.variant}-{int(time.time())}"
    cmd = command(VARIANTS[args.variant], workload, model_dirs([args.workload])[workload.model], args.warmup + args.steps, run_dir)
    overrides = cmd[cmd.index("train") + 1:]
    with contextlib.redirect_stdout(sys.stderr):  # the console logger prints as in `cohort train`; stdout: JSON only
        trainer = Trainer(load_config(None, overrides), run_dir=run_dir)
        try:
            for _ in range(args.warmup):
                trainer.step()
            profile = cProfile.Profile()
            start = time.perf_counter()
            profile.enable()
            run_training(trainer)
            profile.disable()
            total = time.perf_counter() - start
        finally:
            trainer.close()
    if args.stats_out:
        profile.dump_stats(args.stats_out)
    stats = pstats.Stats(profile).stats  # (file, line, name) → (calls, primitive, tottime, cumtime, callers)
    steps = args.steps

    def cumulative(suffix: str, name: str) -> float:
        return sum(v[3] for (f, _, n), v in stats.items() if f.endswith(suffix) and n == name)

    # the loop's time: train() without what runs once after the last step (final model, reward plot, evals)
    wall = total - sum(cumulative("cohort/trainer/run.py", n) for n in ("save_model", "_plot_rewards", "run_eval", "_summary"))
    per_step = wall / steps

    fixed = {label: {"s_per_step": cumulative(*key) / steps, "share": cumulative(*key) / wall} for label, key in FIXED_COSTS.items()}
    ours = sorted(((v[3], f"{f.split('cohort/', 1)[-1]}:{n}", v[0]) for (f, _, n), v in stats.items() if "/cohort/" in f),
                  reverse=True)[: args.top]
    result = {"workload": args.workload, "variant": args.variant, "profiled_steps": steps, "wall_s": wall,
              "s_per_step_profiled": per_step, "note": "cProfile slows Python-heavy code; compare shares, not seconds",
              "fixed_costs": fixed,
              "cohort_functions_by_cumtime": [{"function": name, "share": cum / wall, "calls_per_step": calls / steps}
                                              for cum, name, calls in ours]}
    common.emit(result)
    return result


if __name__ == "__main__":
    main()
