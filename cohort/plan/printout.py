"""What `cohort plan` prints: the batch schedule, the token bound, the memory estimate, a GPU's split, the machine's memory.

`format_plan(cfg, plan, gpu, machine)` reads the batch plan (cohort/plan/batch.py) and the memory estimate
(cohort/plan/memory.py); it computes nothing of its own beyond the lines. Left out: every check (a config that
cannot work never reaches the printout: `cohort plan` validates first).
"""

from __future__ import annotations

from cohort.config import CohortConfig
from cohort.models.host_memory import MachineMemory
from cohort.plan.batch import BatchPlan, stream_update_blockers
from cohort.plan.machine_fit import host_rows, total
from cohort.plan.memory import (CUDA_CONTEXT_BYTES, GpuMemoryPlan, UnreadableWeights, cpu_engine_share, human_bytes,
                                kv_bytes_per_token, memory_estimate, model_facts)


def format_gpu_plan(gpu: GpuMemoryPlan) -> list[str]:
    """`cohort plan`'s lines for one GPU's split."""
    lines = [f"GPU memory ({human_bytes(gpu.total)} per GPU; an estimate, docs/gpu.md)"]
    if gpu.shared:
        lines.append(f"  trainer's peak (the update)  {human_bytes(gpu.trainer_peak):>10}   (the rows above); between updates "
                     f"{human_bytes(gpu.trainer_resident)} (weights, gradients, AdamW moments, reference)")
    lines += [f"  {name:<28}  {human_bytes(size):>10}   {how}" for name, size, how in gpu.engine]
    lines.append(f"  {'CUDA context':<28}  {human_bytes(CUDA_CONTEXT_BYTES):>10}   per process (fixed allowance)")
    source = "derived: vLLM's share + 10%, rounded up" if gpu.derived and gpu.shared else (
        "derived: vLLM alone on its GPU" if gpu.derived else "as set")
    lines.append(f"  engine.gpu_memory_utilization  {gpu.utilization:g} = {human_bytes(gpu.engine_bytes)} ({source})")
    sleep = f", vLLM asleep during the update (engine.sleep_mode = {gpu.sleep_mode})" if gpu.shared and gpu.sleep_mode else ""
    verdict = "fits" if gpu.fits else "does NOT fit"
    lines.append(f"  needed at the busier phase   {human_bytes(gpu.needed):>10}   of {human_bytes(gpu.total)}: {verdict}{sleep}")
    return lines


def _reference_line(cfg: CohortConfig) -> str:
    if not cfg.algorithm.beta:
        return "none (beta = 0)"
    return f"the policy with its LoRA adapter disabled (beta = {cfg.algorithm.beta:g})" if cfg.lora.rank else f"yes (beta = {cfg.algorithm.beta:g})"


def _tokens_per_step_line(cfg: CohortConfig, plan: BatchPlan) -> str:
    completion = cfg.rollout.max_completion_length
    if plan.max_tokens_per_sequence is None:
        return (f"  tokens per step       not bounded here: data.max_prompt_length is None and the prompts were "
                f"{plan.prompt_tokens_from}; each sequence is at most the model's positions")
    prompt = plan.max_tokens_per_sequence - completion
    bound = (f"max_prompt_length {prompt}" if plan.prompt_tokens_from == "data.max_prompt_length"
             else f"longest prompt {prompt}")
    line = (f"  tokens per step       ≤ {plan.completions_per_step * plan.max_tokens_per_sequence:,} "
            f"({plan.completions_per_step} × ({bound} + max_completion_length {completion}))")
    return line if plan.prompt_tokens_from == "data.max_prompt_length" else f"{line}; {plan.prompt_tokens_from}"


def _lag_line(cfg: CohortConfig, plan: BatchPlan) -> str:
    """How old the completions an update trains on may be: steps per generation batch, then the scheduler's rules (an
    agent's cut-off runs start over, so they hold no old tokens: agents/runs.py `AgentRun.resumable`)."""
    lag, rules, head = plan.optimizer_steps_per_generation - 1, plan.admission, "  off-policy lag        "
    if rules.generates_through_updates:
        return (head + f"up to {rules.max_staleness} policy version(s) per token (pipeline.max_staleness: generation runs "
                "through the update; older tokens: pipeline.stale_tokens)")
    if lag:
        return (head + f"{lag} optimizer step(s): the last update of a generation batch uses completions sampled "
                f"{lag} policy version(s) earlier")
    if rules.interrupts and cfg.agent.enabled:
        return head + "0: an agent's cut-off runs start over from their prompts, so no update trains an old token"
    if rules.interrupts:
        return head + (f"0 for new completions; resumed partial rollouts hold tokens up to {rules.max_aborts} "
                       "version(s) old (pipeline.max_aborts)")
    return head + "0: every update uses completions of the current policy"


def _stream_line(cfg: CohortConfig, plan: BatchPlan) -> str:
    """Whether groups are trained as they finish, and if not, what waits for the whole batch."""
    head = "  streamed update       "
    if plan.admission.generates_through_updates:
        line = head + "off (pipeline.max_staleness >= 1): each batch's groups are taken as they finish, then scored and trained"
    elif plan.stream_update:
        line = head + "on: each finished group's forward/backward runs while the rest generate; one optimizer step after the last"
    else:
        blockers = stream_update_blockers(cfg)
        why = ("pipeline.stream_update = off" if cfg.pipeline.stream_update == "off" else "; ".join(b.split(":")[0] for b in blockers)
               or f"engine.mode = {cfg.engine.mode}: the engine shares the trainer's cores")
        line = head + f"off ({why}): rewards per group as groups finish, the update after the whole batch"
    if cfg.pipeline.dynamic_sampling:
        line += (f"\n  dynamic sampling      on: groups with all-equal rewards are replaced, at most "
                 f"{cfg.pipeline.max_refill_rounds} refill rounds (pipeline.max_refill_rounds)")
    if cfg.pipeline.over_provision > 1 and cfg.pipeline.max_staleness:
        line += (f"\n  partial rollouts      on: {cfg.pipeline.over_provision:g}× the batch's groups kept in flight, the first to finish "
                 "trained, the rest generating on through the update (under the staleness bound)")
    elif cfg.pipeline.over_provision > 1:
        line += (f"\n  partial rollouts      on: {cfg.pipeline.over_provision:g}× the batch's groups requested, the first to finish "
                 + (f"trained, the rest's cut-off agent runs started over next step (an agent cannot be resumed; at most "
                    f"{cfg.pipeline.max_aborts} cuts per request)" if cfg.agent.enabled else
                    f"trained, the rest resumed next step (at most {cfg.pipeline.max_aborts} cuts per request); resumed tokens "
                    f"are off-policy ({cfg.algorithm.off_policy_objective})"))
    if cfg.pipeline.max_staleness:
        line += (f"\n  asynchronous          on: generation runs up to {cfg.pipeline.max_staleness} policy version(s) ahead; tokens "
                 f"staler when trained: {cfg.pipeline.stale_tokens}; off-policy tokens: {cfg.algorithm.off_policy_objective}")
    return line


def machine_line(estimate: int, machine: MachineMemory, check: bool) -> str:
    """The host's memory against the estimate (what validation refuses above the total; what is available now is only
    said: others' processes hold it, and may end)."""
    now = f"; {human_bytes(machine.available)} available now" if machine.available is not None else ""
    head = f"  {'machine memory':<20}  {human_bytes(machine.total):>10}   {machine.source}{now}: "
    if estimate > machine.total:
        return head + "the estimate does NOT fit" + ("" if check else " (train.check_memory = false: run anyway)")
    if machine.available is not None and estimate > machine.available:
        return head + f"the estimate fits, more than is available now (other processes hold {human_bytes(machine.total - machine.available)})"
    return head + "the estimate fits"


def format_plan(cfg: CohortConfig, plan: BatchPlan, gpu: GpuMemoryPlan | None = None,
                machine: MachineMemory | None = None) -> str:
    """The printout of `cohort plan`; `gpu`: a GPU's split between the trainer and vLLM, shown at the end; `machine`:
    the host's memory, for a run trained on the CPU."""
    accumulation = plan.micro_batches_per_step
    lines = [
        "batch plan",
        f"  generation batch      {plan.prompts_per_generation} prompts × G={plan.num_generations} = {plan.generation_batch_size} completions",
        f"  optimizer step        {plan.prompts_per_step} prompts × G={plan.num_generations} = {plan.completions_per_step} completions",
        f"  micro-batches         {accumulation} of ≤{plan.micro_batch_size} completions (gradient accumulation over {accumulation})",
        f"  steps per generation  {plan.steps_per_generation} slices × {plan.num_iterations} iterations = {plan.optimizer_steps_per_generation}"
        + (" (off-policy: old log-probs computed once per generation batch)" if plan.off_policy else " (on-policy: no old-log-prob pass)"),
        _lag_line(cfg, plan),
        f"  generation batches    {plan.num_generation_batches} for {plan.max_steps} steps",
        _tokens_per_step_line(cfg, plan),
        f"  tokens generated      ≤ {plan.generation_batch_size * cfg.rollout.max_completion_length:,} per generation batch",
        f"  reference model       {_reference_line(cfg)}",
        *([f"  teacher model         {cfg.teacher.path} ({cfg.teacher_dtype}); advantage per token = {cfg.teacher.kl_coef:g} × "
           f"(log π_teacher − log π_student) + {cfg.teacher.reward_weight:g} × the rewards' GRPO advantage"]
          if cfg.algorithm.name == "distill" else []),
        f"  rollout engine        {cfg.engine.name}",
        _stream_line(cfg, plan),
        f"  checkpoints           {'every %d steps, newest %d kept' % (cfg.run.save_every, cfg.run.keep_checkpoints) if cfg.run.save_every else 'only on a stop (run.save_every = 0)'}",
    ]
    try:
        facts = model_facts(cfg.model.path, cfg.model.revision)
    except UnreadableWeights:
        facts = None
    if facts is None:
        lines.append("memory                not estimated (no config.json and safetensors weights for model.path on disk yet, and "
                     "the Hub could not tell their size)")
        return "\n".join(lines)
    rows = memory_estimate(cfg, plan, facts)
    lines.append(f"memory of the training process (rough estimate; {facts.num_params:,} parameters)")
    lines += [f"  {name:<20}  {human_bytes(size):>10}   {how}" for name, size, how in rows]
    lines.append(f"  {'total':<20}  {human_bytes(sum(size for _, size, _ in rows)):>10}")
    if cfg.engine.name == "vllm" and cfg.engine.mode == "colocate" and gpu is None:  # vLLM in this process, on the CPU
        engine = cpu_engine_share(cfg, facts)
        lines += [f"  {name:<20}  {human_bytes(size):>10}   {how}" for name, size, how in engine]
        lines.append(f"  {'process total':<20}  {human_bytes(sum(size for _, size, _ in rows + engine)):>10}   the training process's "
                     "peak resident memory with vLLM inside it (bench/smollm2_memory.py measures it)")
    elif cfg.engine.name == "vllm":
        per_token = kv_bytes_per_token(cfg, facts)
        lines.append(f"  rollout engine (vLLM) on top: its weights and KV cache (engine.kv_cache_gib on CPU, "
                     f"engine.gpu_memory_utilization on GPU: `cohort plan --gpu-memory-gib N` shows the split); "
                     f"KV {human_bytes(per_token)} per token")
    if machine is not None and gpu is None:
        lines.append(machine_line(total(host_rows(cfg, plan, facts)), machine, cfg.train.check_memory))
    lines.append("  the loss value is not progress: docs/algorithms.md#what-the-loss-value-means")
    if gpu is not None:
        lines += format_gpu_plan(gpu)
    return "\n".join(lines)
