"""The batch plan of a run: the one place where the batch arithmetic lives, and the run's mode.

- `batch_plan(cfg, world_size)`: prompts and completions per generation batch and per optimizer step,
  micro-batches, optimizer steps per generation, the scheduler's admission rules (`cohort.config.admission`) and
  whether groups train as they finish (`stream_update_active`); the trainer, `cohort plan` and the validation
  all read it. `with_measured_prompts` replaces its token bound by the longest prompt actually kept, once
  `cohort.plan.validate` has measured the prompts.
- `stream_update_blockers(cfg)`: why the per-group update would not equal the batch update (the pipeline checks
  and the printout say it).

Left out: the memory estimate (cohort/plan/memory.py), the printout (cohort/plan/printout.py) and every check
(cohort/plan/validate.py). Pure: imports the config, the algorithms' facts and the run's mode, never torch.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from cohort.algorithm_facts import FACTS
from cohort.config import CohortConfig
from cohort.config.admission import AdmissionRules
from cohort.plan.run_mode import ONE_STEP_FIX, one_step_per_generation


@dataclasses.dataclass(frozen=True)
class BatchPlan:
    """The batch arithmetic of a run, derived once from the config."""

    num_generations: int
    prompts_per_step: int
    completions_per_step: int
    steps_per_generation: int
    num_iterations: int
    generation_batch_size: int  # completions per generation batch
    prompts_per_generation: int
    micro_batch_size: int
    micro_batches_per_step: int
    max_tokens_per_sequence: int | None  # longest prompt + rollout.max_completion_length; None: the data was not read
    max_steps: int
    prompt_tokens_from: str = "data.max_prompt_length"  # what bounds the prompt in max_tokens_per_sequence
    # the run's mode, resolved once: what the rollout scheduler admits, and whether groups train as they finish
    admission: AdmissionRules = AdmissionRules()
    stream_update: bool = False

    @property
    def optimizer_steps_per_generation(self) -> int:
        return self.steps_per_generation * self.num_iterations

    @property
    def off_policy(self) -> bool:
        """True when some update uses completions sampled by an older policy."""
        return self.optimizer_steps_per_generation > 1

    @property
    def num_generation_batches(self) -> int:
        return math.ceil(self.max_steps / self.optimizer_steps_per_generation)


GROUP_LOCAL_ADVANTAGES = tuple(n for n in FACTS if FACTS[n].group_local)  # (for messages)
GROUP_RELATIVE = tuple(n for n in FACTS if FACTS[n].zero_for_constant_group)


def stream_update_blockers(cfg: CohortConfig, world_size: int = 1) -> list[str]:
    """Why the per-group (streamed) update would not equal the batch update for this config; [] when it would.

    The streamed update sums each finished group's unnormalised loss and divides by the loss normaliser once the
    batch is known, so it needs advantages that read only their own group, a normaliser that is a sum over rows
    (not bnpo's per-micro-batch mean), the batch trained in exactly one optimizer step, and nothing measured over
    the whole batch before the update (a KL in the reward, an adaptive beta, a critic, batch whitening)."""
    a, t, out = cfg.algorithm, cfg.train, []
    spec = FACTS[a.name]
    if not spec.group_local:
        out.append(f"algorithm.name = {a.name}: its advantages need the whole batch (whitening or a critic); "
                   f"use {' or '.join(GROUP_LOCAL_ADVANTAGES)}")
    elif a.scale_rewards == "batch" and a.name == "grpo":
        out.append("algorithm.scale_rewards = batch: the std is the whole batch's; use group or none")
    if a.loss_type == "bnpo":
        out.append("algorithm.loss_type = bnpo: a token mean per micro-batch depends on how the batch is split; "
                   "use dapo (the whole step's token mean), grpo or dr_grpo")
    if a.top_entropy_quantile < 1:
        out.append(f"algorithm.top_entropy_quantile = {a.top_entropy_quantile}: the entropy threshold is a quantile of "
                   "each micro-batch, which depends on how the batch is split; use 1.0")
    placement = a.kl_placement if a.kl_placement != "auto" else spec.kl_placement
    if a.beta != 0 and (placement == "reward" or a.kl_controller == "adaptive"):
        out.append(f"algorithm.beta = {a.beta} with the KL in the reward or an adaptive coefficient: measured over the "
                   "whole batch first; set algorithm.kl_placement=loss with kl_controller=fixed, or beta=0")
    if not one_step_per_generation(cfg):
        out.append(f"train.steps_per_generation = {t.steps_per_generation}, algorithm.num_iterations = {a.num_iterations}, "
                   f"rollout.generation_batch_size: set {ONE_STEP_FIX}")
    if world_size > 1:
        out.append(f"{world_size} training processes: the streamed update runs in one; set train.num_processes=1")
    if cfg.agent.enabled:
        out.append("an agent (agent.function, or an environment played through the agent endpoint): its runs are widened into one sample per seat "
                   "and call when the whole batch is taken, not group by group; set pipeline.stream_update=off")
    if cfg.pipeline.max_staleness:
        out.append(f"pipeline.max_staleness = {cfg.pipeline.max_staleness}: groups may come from older policies, trained when the "
                   "batch is taken; set it to 0 (or unset)")
    return out


def stream_update_active(cfg: CohortConfig, world_size: int = 1) -> bool:
    """Whether the trainer runs the update group by group (pipeline.stream_update; see `stream_update_blockers`)."""
    if cfg.pipeline.stream_update == "off" or stream_update_blockers(cfg, world_size):
        return False
    return cfg.pipeline.stream_update == "on" or cfg.engine.mode in ("local_server", "server")


def batch_plan(cfg: CohortConfig, world_size: int = 1) -> BatchPlan:
    """The batch arithmetic and the run's mode for `world_size` training processes."""
    g = cfg.rollout.num_generations
    per_step = cfg.train.prompts_per_step * g
    gen = cfg.rollout.generation_batch_size or per_step * cfg.train.steps_per_generation
    mb = min(cfg.train.micro_batch_size, per_step)
    return BatchPlan(
        num_generations=g,
        prompts_per_step=cfg.train.prompts_per_step,
        completions_per_step=per_step,
        steps_per_generation=gen // per_step if per_step else 0,
        num_iterations=cfg.algorithm.num_iterations,
        generation_batch_size=gen,
        prompts_per_generation=gen // g if g else 0,
        micro_batch_size=mb,
        micro_batches_per_step=math.ceil(per_step / mb) if mb else 0,
        max_tokens_per_sequence=None if cfg.data.max_prompt_length is None else cfg.data.max_prompt_length + cfg.rollout.max_completion_length,
        max_steps=cfg.train.max_steps,
        prompt_tokens_from="data.max_prompt_length" if cfg.data.max_prompt_length is not None else "not measured (data not read)",
        admission=AdmissionRules.from_config(cfg.pipeline),
        stream_update=stream_update_active(cfg, world_size),
    )


@dataclass(frozen=True)
class MeasuredPrompts:
    """The prompts of a run as the trainer will keep them, measured without loading weights (`cohort.plan.validate`)."""

    longest: int | None  # tokens of the longest prompt kept (None when a problem stopped the measurement)
    where: str  # its row
    filtered: int  # train prompts longer than the limit, dropped by data.overlong_prompts = filter
    problems: list[str]


def with_measured_prompts(cfg: CohortConfig, plan: BatchPlan, measured: MeasuredPrompts | None) -> BatchPlan:
    """The plan with its token bound taken from the longest prompt kept, when the prompts could be measured."""
    if measured is None or measured.longest is None:
        if cfg.data.max_prompt_length is None:
            return dataclasses.replace(plan, prompt_tokens_from="not measured (a tiny:* model's tokenizer is built with the model)")
        return plan
    return dataclasses.replace(plan, max_tokens_per_sequence=measured.longest + cfg.rollout.max_completion_length,
                               prompt_tokens_from=f"the longest prompt kept, {measured.where}")
