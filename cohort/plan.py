"""`cohort plan`: the batch schedule of a config, printed before anything loads."""

from __future__ import annotations

from cohort.config import BatchPlan, CohortConfig

BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def format_plan(cfg: CohortConfig, plan: BatchPlan) -> str:
    tokens_per_step = plan.completions_per_step * plan.max_tokens_per_sequence
    accumulation = plan.micro_batches_per_step
    lines = [
        "batch plan",
        f"  generation batch      {plan.prompts_per_generation} prompts × G={plan.num_generations} = {plan.generation_batch_size} completions",
        f"  optimizer step        {plan.prompts_per_step} prompts × G={plan.num_generations} = {plan.completions_per_step} completions",
        f"  micro-batches         {accumulation} of ≤{plan.micro_batch_size} completions (gradient accumulation over {accumulation})",
        f"  steps per generation  {plan.steps_per_generation} slices × {plan.num_iterations} iterations = {plan.optimizer_steps_per_generation}"
        + (" (off-policy: old log-probs computed once per generation batch)" if plan.off_policy else " (on-policy: no old-log-prob pass)"),
        f"  generation batches    {plan.num_generation_batches} for {plan.max_steps} steps",
        f"  tokens per step       ≤ {tokens_per_step:,} ({plan.completions_per_step} × (max_prompt_length {cfg.data.max_prompt_length} + max_completion_length {cfg.rollout.max_completion_length}))",
        f"  reference model       {'yes (beta = %g)' % cfg.algorithm.beta if cfg.algorithm.beta else 'none (beta = 0)'}",
        f"  rollout engine        {cfg.rollout.engine}",
    ]
    return "\n".join(lines)
