"""cohort against TRL 1.16 on Qwen2.5-Coder-0.5B-Instruct and a tool task: seconds per step, the phases, peak memory.

The workload (issue 63, item 5), identical on both sides: the `tool_calc` task's first train rows ("984*19=" as a
user message, the answer beside it), one TRL `environment_factory` class and one reward function (bench/calc_env.py,
imported unchanged by both), LoRA rank 16 on every linear layer (alpha 32), G = 4, 2 prompts a step (8 completions),
96 completion tokens over all turns, lr 1e-4, beta 0, dapo loss, temperature 1.0, the chat template's tools block.
Everything else is each tool's default:
- `cohort`: `python -m cohort.cli train` with only those fields (its default parser, hermes: the template's tags);
- `cohort_json`: the same plus `tools.parser=json`, which reads the calls this model writes (fenced or bare JSON, never
  the tags): more turns, more tokens per step. A different amount of work, so its s/step is quoted beside, never as the
  comparison;
- `trl`: bench/trl_grpo_step.py at TRL's defaults (bf16 autocast over float32 weights: emulated on a CPU without bf16
  units, gradient checkpointing, transformers generate, its tool parsing: the template's tags) with `use_cpu=True`,
  `peft_config` for the LoRA, and the 8 completions as 2 × 4 gradient accumulation (cohort's micro-batch 4 below);
- `trl_float32`: TRL with `bf16=False`, NOT its default (labelled wherever quoted): on a CPU without bf16 units, the
  side that matches cohort's float32.
Each run's peak RSS (`/usr/bin/time`'s maximum resident set, the run's whole process) and, for cohort, `cohort plan`'s
`process total` for the same fields; `uptime` before and after each run.

    .venv/bin/python bench/qwen_tool_trl.py --model-dir DIR [--variants cohort trl ...] [--steps 3] [--out F.json]

DIR: the converted checkpoint (`make qwen2.5-coder-0.5b`; `cohort.models.gguf`'s cache directory).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import _common as common
from compare import SPEED_VARS, TRL_PYTHON, read_metrics
from real_model_trl import child_pythonpath, speed, uptime

PROMPTS_PER_STEP, GROUP, MAX_TOKENS, LR, LORA_RANK, MICRO = 2, 4, 96, 1e-4, 16, 4
WORK = common.CACHE / "qwen_tool"
ENV, REWARD = common.BENCH_DIR / "calc_env.py", "last_number_reward"
VARIANTS = ("cohort", "cohort_json", "trl", "trl_float32")


def data_file(rows: int = 64) -> Path:
    """The task's first train rows as jsonl (prompt messages, answer), written once."""
    from cohort.data.tasks import get_task

    path = WORK / f"tool_calc-{rows}.jsonl"
    if not path.is_file():
        WORK.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps(r) + "\n" for r in get_task("tool_calc", seed=0).train_rows[:rows]))
    return path


def cohort_fields(model_dir: Path, train_file: Path, steps: int) -> list[str]:
    return [f"model.path={model_dir}", f"data.train_files={train_file}", "tools.environment=calc_env.CalcEnv",
            f"rewards=[{{name: calc_env.{REWARD}}}]", f"lora.rank={LORA_RANK}", f"rollout.num_generations={GROUP}",
            f"rollout.max_completion_length={MAX_TOKENS}", "algorithm.beta=0.0", "algorithm.loss_type=dapo",
            f"train.prompts_per_step={PROMPTS_PER_STEP}", f"train.micro_batch_size={MICRO}", f"train.learning_rate={LR}",
            f"train.max_steps={steps}", "run.eval_every=0"]


def command(variant: str, model_dir: Path, train_file: Path, steps: int, run_dir: Path) -> list[str]:
    """The command line a user would type: the workload's fields only (module docstring)."""
    if variant.startswith("trl"):
        return [str(TRL_PYTHON), str(common.BENCH_DIR / "trl_grpo_step.py"), *(["--bf16"] if variant == "trl" else []),
                "--model-dir", str(model_dir), "--data-file", str(train_file), "--environment", f"{ENV}:CalcEnv",
                "--reward-func", f"{ENV}:{REWARD}", "--lora-rank", str(LORA_RANK), "--steps", str(steps),
                "--prompts-per-step", str(PROMPTS_PER_STEP), "--num-generations", str(GROUP),
                "--max-completion-length", str(MAX_TOKENS), "--learning-rate", str(LR),
                "--gradient-accumulation-steps", str(PROMPTS_PER_STEP * GROUP // MICRO),
                "--metrics-file", str(run_dir / "metrics.jsonl")]
    json_parser = ["tools.parser=json"] if variant == "cohort_json" else []
    return [sys.executable, "-m", "cohort.cli", "train", *cohort_fields(model_dir, train_file, steps), *json_parser,
            f"run.output_dir={run_dir}"]


def planned_total(model_dir: Path, train_file: Path, steps: int, env: dict) -> str | None:
    """`cohort plan`'s `process total` line for the cohort side's fields."""
    out = subprocess.run([sys.executable, "-m", "cohort.cli", "plan", *cohort_fields(model_dir, train_file, steps)],
                         capture_output=True, text=True, env=env, cwd=common.REPO).stdout
    line = next((ln for ln in out.splitlines() if "process total" in ln), None)
    return " ".join(line.split()[2:4]) if line else None


def run_one(variant: str, model_dir: Path, train_file: Path, steps: int, timeout_s: float) -> dict:
    run_dir = WORK / f"{variant}-{int(time.time())}"
    run_dir.mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if k not in SPEED_VARS}  # each side as its users run it
    env["PYTHONPATH"] = os.pathsep.join([child_pythonpath(), str(common.BENCH_DIR)])
    cmd = command(variant, model_dir, train_file, steps, run_dir)
    head = {"variant": variant, "command": " ".join(cmd), "uptime_before": uptime(), "run_dir": str(run_dir)}
    if variant.startswith("cohort"):
        head["planned_process_total"] = planned_total(model_dir, train_file, steps, env)
    start = time.perf_counter()
    with open(run_dir / "stdout.log", "w") as log:
        try:
            rc = subprocess.run(["/usr/bin/time", "-f", "peak_rss_kib=%M", *cmd], env=env, cwd=common.REPO, stdout=log,
                                stderr=subprocess.STDOUT, timeout=timeout_s).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    text = (run_dir / "stdout.log").read_text()
    peak = re.findall(r"peak_rss_kib=(\d+)", text)
    head |= {"rc": rc, "wall_s": time.perf_counter() - start, "uptime_after": uptime(),
             "peak_rss_gib": round(int(peak[-1]) / 2**20, 2) if peak else None}
    records = read_metrics(run_dir / "metrics.jsonl")
    if not records:
        return head | {"error": f"exit {rc}, no step logged", "log_tail": text[-3000:]}
    calls = [r.get("tools/call_frequency", r.get("tools/call_frequency_mean")) for r in records]  # (TRL's: none logged)
    return head | speed(records) | {"calls_per_step": calls}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--variants", nargs="+", default=["cohort", "trl"], choices=VARIANTS)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--timeout-s", type=float, default=3600, help="per run; a run past it is reported with its steps")
    ap.add_argument("--out", default=None, help="also write the JSON here (rewritten after every run)")
    args = ap.parse_args(argv)
    train_file = data_file()
    import torch

    from cohort.models.devices import cpu_model, has_bf16_units

    result = {"benchmark": "qwen_tool_trl", "model_dir": args.model_dir, "cpu": cpu_model(), "bf16_units": has_bf16_units(torch.device("cpu")),
              "workload": {"prompts_per_step": PROMPTS_PER_STEP, "num_generations": GROUP, "max_tokens": MAX_TOKENS,
                           "lora_rank": LORA_RANK, "lr": LR, "micro_batch": MICRO, "steps": args.steps}, "runs": []}
    for variant in args.variants:
        result["runs"].append(run_one(variant, Path(args.model_dir), train_file, args.steps, args.timeout_s))
        if args.out:
            Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    common.emit(result)
    return result


if __name__ == "__main__":
    main()
