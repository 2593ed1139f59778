"""cohort against TRL on a real pretrained model (SmolLM2-135M-Instruct): learning, speed and the step's phases, one JSON.

The workload (issue 35), identical on both sides: chat prompts "What is a + b?" for a, b in 1..30 (900; 200 held out,
700 to train on; bench/_common.py `sum_question_rows`), reward 1 when the completion's last integer is the sum
(`last_integer_reward`), G = 8, 8 prompts a step (64 completions), 48-token completions, temperature 0.7, lr 1e-5,
beta 0, 20 steps, the seed given. Everything else is each tool's default:
- cohort: `python -m cohort.cli train` with only those fields (model.dtype=auto: bf16 mixed on a CPU with bf16 units,
  float32 on one without, as the 2-core development VM and CI; the CLI's environment, colocated vLLM);
- TRL 1.16 `GRPOTrainer` (bench/trl_grpo_step.py in bench/.trl-venv, `make bench-env`): its defaults (bf16 autocast
  over float32 weights, gradient checkpointing, dapo loss, transformers generate) with `use_cpu=True`, the step's 64
  completions as 16 × 4 gradient accumulation, and no environment variable that changes speed (compare.SPEED_VARS
  are removed from its environment, as bench/compare.py does).
The variant `cohort_async` adds `pipeline.max_staleness=1 engine.mode=local_server` (one step off-policy; reported,
never a default); `cohort_keep_heap` adds `train.release_host_memory=false` (what the heap trims cost: docs/runs.md,
"Memory on the CPU"). The variant `trl_float32` is TRL with `bf16=False`, NOT its default: on a CPU without bf16 units
TRL's default autocast is emulated and a step takes minutes, so this is the TRL side a learning comparison can afford
there; it is labelled wherever it is quoted.

Both final models (cohort's final/, in model.dtype as cohort delivers it; TRL's save_model) and the base model are
scored by ONE evaluator (`--evaluate DIR`, in a fresh process of this venv): float32 transformers, the chat template
with its generation prompt, greedy, 48 new tokens, the same reward, on the 200 held-out prompts.

Speed per run: median s/step over steps 2..N, the phases (`timing/*`: cohort's own metrics, TRL's from wrapping its
methods, bench/trl_grpo_step.py) and their shares, per step then the median: `other_share` (the step outside its named
phases) and `outside_generate_update_share` (outside generation and the update: pushes, checks, log-prob passes), trained
completion tokens/s (completion tokens of a step / its time). `uptime` load before and after each run is recorded:
on a shared machine the timings are only as good as that load.

    .venv/bin/python bench/real_model_trl.py --model-dir DIR [--variants cohort trl cohort_async] [--seeds 0 1]
                                             [--steps 20] [--out bench/real_model_trl.json]
    .venv/bin/python bench/real_model_trl.py --evaluate MODEL_DIR   # the evaluator alone (prints its JSON)

DIR: a transformers checkpoint of SmolLM2-135M-Instruct (or any chat model).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import _common as common
from compare import SPEED_VARS, TRL_PYTHON, read_metrics

STEPS = 20
PROMPTS_PER_STEP, GROUP, MAX_TOKENS, TEMPERATURE, LR = 8, 8, 48, 0.7, 1e-5
WORK = common.CACHE / "real_model"
VARIANTS = {
    "cohort": (),
    "cohort_async": ("pipeline.max_staleness=1", "engine.mode=local_server"),
    "cohort_keep_heap": ("train.release_host_memory=false",),
    "trl": (),
    "trl_float32": (),
}


def data_files() -> tuple[Path, Path]:
    """The train and held-out jsonl files (written once)."""
    WORK.mkdir(parents=True, exist_ok=True)
    train, held_out = common.sum_question_rows()
    paths = (WORK / "sums-train.jsonl", WORK / "sums-heldout.jsonl")
    for path, rows in zip(paths, (train, held_out)):
        if not path.is_file():
            path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return paths


def command(variant: str, model_dir: Path, train_file: Path, seed: int, steps: int, run_dir: Path,
            trl_python: str = str(TRL_PYTHON), trl_device: str = "cpu") -> list[str]:
    """The command line a user would type: the workload's fields only (module docstring)."""
    if variant.startswith("trl"):
        precision = ["--bf16"] if variant == "trl" else []  # TRL's default bf16=True; trl_float32 is labelled non-default
        return [trl_python, str(common.BENCH_DIR / "trl_grpo_step.py"), *precision, "--device", trl_device,
                "--model-dir", str(model_dir),
                "--data-file", str(train_file), "--reward", "last_integer", "--steps", str(steps),
                "--prompts-per-step", str(PROMPTS_PER_STEP), "--num-generations", str(GROUP),
                "--max-completion-length", str(MAX_TOKENS), "--temperature", str(TEMPERATURE), "--learning-rate", str(LR),
                "--gradient-accumulation-steps", "4", "--seed", str(seed), "--metrics-file", str(run_dir / "metrics.jsonl"),
                "--save-dir", str(run_dir / "final")]
    return [sys.executable, "-m", "cohort.cli", "train", f"model.path={model_dir}", f"data.train_files=[{train_file}]",
            f"rollout.num_generations={GROUP}", f"rollout.max_completion_length={MAX_TOKENS}",
            f"rollout.temperature={TEMPERATURE}", "algorithm.beta=0.0", f"train.prompts_per_step={PROMPTS_PER_STEP}",
            f"train.learning_rate={LR}", f"train.max_steps={steps}", f"train.seed={seed}", f"rollout.seed={seed}",
            "rewards=[{name: 'bench._common:last_integer_reward'}]", f"run.output_dir={run_dir}", *VARIANTS[variant]]


def child_pythonpath() -> str:
    """The checkout first, then whatever PYTHONPATH already holds (a lent GPU machine's carried packages)."""
    return os.pathsep.join(filter(None, [str(common.REPO), os.environ.get("PYTHONPATH")]))


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def run_one(variant: str, model_dir: Path, train_file: Path, seed: int, steps: int, timeout_s: float, **trl) -> dict:
    """One training run in a fresh process; its speed summary and where its final model is. `trl`: `command`'s
    trl_python and trl_device."""
    run_dir = WORK / f"{variant}-seed{seed}-{int(time.time())}"
    run_dir.mkdir(parents=True)
    cmd = command(variant, model_dir, train_file, seed, steps, run_dir, **trl)
    env = {k: v for k, v in os.environ.items() if k not in SPEED_VARS}  # each side sets its own, as its users get it
    env["PYTHONPATH"] = child_pythonpath()
    head = {"variant": variant, "seed": seed, "command": " ".join(cmd), "uptime_before": uptime(),
            "load_before": common.load_average(), "run_dir": str(run_dir)}
    start = time.perf_counter()
    with open(run_dir / "stdout.log", "w") as log:
        try:
            rc = subprocess.run(cmd, env=env, cwd=common.REPO, stdout=log, stderr=subprocess.STDOUT, timeout=timeout_s).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    head |= {"rc": rc, "wall_s": time.perf_counter() - start, "uptime_after": uptime(), "load_after": common.load_average()}
    records = read_metrics(run_dir / "metrics.jsonl")
    if rc != 0 or not records:
        return head | {"error": f"exit {rc}, {len(records)} steps logged",
                       "log_tail": (run_dir / "stdout.log").read_text()[-3000:]}
    return head | speed(records) | {"final_dir": str(run_dir / "final")}


def speed(records: list[dict]) -> dict:
    """Median step and phases over steps 2..N, the step outside its phases, completion tokens per second."""
    steady = records[1:] or records
    step_s = common.median([r["timing/step_s"] for r in steady])
    names = sorted({k[len("timing/"):-2] for r in steady for k in r if k.startswith("timing/") and k.endswith("_s")
                    and "/" not in k[len("timing/"):] and k != "timing/step_s"})
    phases = {n: common.median([r.get(f"timing/{n}_s", 0.0) for r in steady]) for n in names}
    tokens = [r.get("tokens/generated", r.get("completion_tokens", 0)) for r in steady]
    # per step, then the median (medians of phases do not add up to the median step)
    outside = [1 - (r.get("timing/generate_s", 0.0) + r.get("timing/update_s", 0.0)) / r["timing/step_s"] for r in steady]
    unnamed = [1 - sum(r.get(f"timing/{n}_s", 0.0) for n in names) / r["timing/step_s"] for r in steady]
    return {"steps": len(records), "median_step_s": step_s, "step_s_all": [round(r["timing/step_s"], 3) for r in records],
            "phases_median_s": phases, "phases_share": {n: v / step_s for n, v in phases.items()},
            "other_share": common.median(unnamed), "outside_generate_update_share": common.median(outside),
            "trained_tokens_per_s": sum(tokens) / sum(r["timing/step_s"] for r in steady),
            "mismatch": {k: common.median([r[k] for r in steady if k in r]) for k in sorted(steady[-1]) if k.startswith("mismatch/")},
            "reward_mean_last": records[-1].get("reward", records[-1].get("rewards/mean"))}


def evaluate(model_dir: str, held_out_file: Path, batch_size: int = 50) -> dict:
    """The one evaluator: float32 transformers, chat template + generation prompt, greedy, 48 new tokens, left padding."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    rows = common.read_rows(held_out_file)
    tokenizer = AutoTokenizer.from_pretrained(model_dir, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    texts = []
    for start in range(0, len(rows), batch_size):
        chunk = rows[start:start + batch_size]
        prompts = [tokenizer.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=False) for r in chunk]
        enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.no_grad():
            out = model.generate(**enc, do_sample=False, max_new_tokens=MAX_TOKENS, pad_token_id=tokenizer.pad_token_id)
        texts += tokenizer.batch_decode(out[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
    scores = common.last_integer_reward(texts, [r["answer"] for r in rows])
    return {"model_dir": model_dir, "accuracy": sum(scores) / len(scores), "n": len(scores), "examples": texts[:3]}


def evaluate_in_child(model_dir: str) -> dict:
    out = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--evaluate", model_dir], capture_output=True,
                         text=True, cwd=common.REPO, env=os.environ | {"PYTHONPATH": child_pythonpath()})
    if out.returncode != 0:
        return {"model_dir": model_dir, "error": out.stderr[-2000:]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def base_score(args) -> dict:
    """The base model's score: none with --no-eval, read from --base-json, else evaluated now."""
    if args.no_eval:
        return {}
    if args.base_json:
        return json.loads(Path(args.base_json).read_text())
    return evaluate_in_child(args.model_dir)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-dir", help="the real model's transformers checkpoint")
    ap.add_argument("--variants", nargs="+", default=["cohort", "trl"], choices=list(VARIANTS))
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    ap.add_argument("--steps", type=int, default=STEPS)
    ap.add_argument("--timeout-s", type=float, default=4 * 3600, help="per training run")
    ap.add_argument("--out", default=None, help="also write the JSON here (rewritten after every run)")
    ap.add_argument("--evaluate", metavar="MODEL_DIR", help="only score MODEL_DIR on the held-out prompts")
    ap.add_argument("--no-eval", action="store_true", help="speed only: score no model (a short run's gain means nothing)")
    ap.add_argument("--base-json", default=None, help="the base model's score from an earlier `--evaluate` (not scored again)")
    ap.add_argument("--trl-python", default=str(TRL_PYTHON), help="the Python with TRL installed (default: bench/.trl-venv's)")
    ap.add_argument("--trl-device", default="cpu", choices=["cpu", "auto"],
                    help="TRL's device: cpu (use_cpu=True) or auto (TRL's default: a GPU where there is one; "
                         "bench/gpu_trl_learning.sh)")
    args = ap.parse_args(argv)
    train_file, held_out_file = data_files()
    if args.evaluate:
        result = evaluate(args.evaluate, held_out_file)
        common.emit(result)
        return result
    if not args.model_dir:
        ap.error("--model-dir is required (or --evaluate)")
    doc = {"generated": time.strftime("%Y-%m-%d %H:%M:%S"), "command": " ".join([sys.executable, *sys.argv]),
           "workload": {"prompts_per_step": PROMPTS_PER_STEP, "num_generations": GROUP, "max_completion_length": MAX_TOKENS,
                        "temperature": TEMPERATURE, "learning_rate": LR, "steps": args.steps, "held_out": 200},
           "base": base_score(args), "runs": []}
    for seed in args.seeds:
        for variant in args.variants:
            run = run_one(variant, Path(args.model_dir), train_file, seed, args.steps, args.timeout_s,
                          trl_python=args.trl_python, trl_device=args.trl_device)
            if "final_dir" in run and not args.no_eval:
                run["eval"] = evaluate_in_child(run["final_dir"])
                run["gain_points"] = 100 * (run["eval"].get("accuracy", float("nan")) - doc["base"].get("accuracy", float("nan")))
            doc["runs"].append(run)
            print(f"{variant} seed {seed}: {run.get('median_step_s', run.get('error'))} s/step, "
                  f"gain {run.get('gain_points')}", file=sys.stderr, flush=True)
            if args.out:
                Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    common.emit(doc)
    return doc


if __name__ == "__main__":
    main()
