"""The run's mode as the rollout scheduler and the checks read it: its admission rules (`AdmissionRules`, from
`pipeline.*`) and the two facts of a config that decide what combines (one optimizer step per generation batch; an
engine that shares the policy module). Pure: imports only the config, so the planner stays torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass

from cohort.config import CohortConfig


@dataclass(frozen=True)
class AdmissionRules:
    """What the rollout scheduler admits (cohort/rollout/scheduler.py), read once from `pipeline.*` (`from_config`)."""

    max_staleness: int = 0  # k
    over_provision: float = 1.0  # f
    max_aborts: int = 1
    stale_tokens: str = "mask"  # mask | drop
    engine_timeout_s: float = 600.0
    refill: bool = False  # dynamic sampling: a dropped (constant) group is replaced by a new prompt
    max_refill_rounds: int = 30

    @classmethod
    def from_config(cls, pipeline) -> AdmissionRules:
        return cls(pipeline.max_staleness or 0, pipeline.over_provision, pipeline.max_aborts, pipeline.stale_tokens,
                   pipeline.engine_timeout_s, pipeline.dynamic_sampling, pipeline.max_refill_rounds)

    @property
    def generates_through_updates(self) -> bool:
        """k >= 1: the engine keeps generating while the trainer updates (a driver thread polls it)."""
        return self.max_staleness >= 1

    @property
    def interrupts(self) -> bool:
        """Partial rollouts with k = 0: a batch's end aborts the rest into the continuation buffer."""
        return self.over_provision > 1 and not self.generates_through_updates

    @property
    def off_policy(self) -> bool:
        """Some trained tokens may come from an older policy (staleness metrics are worth showing)."""
        return self.generates_through_updates or self.over_provision > 1


def one_step_per_generation(cfg: CohortConfig) -> bool:
    """Each generation batch is trained by exactly one optimizer step (what the streamed update and a staleness
    bound k >= 1 need): train.steps_per_generation = 1, algorithm.num_iterations = 1, generation_batch_size unset
    (or the step's own)."""
    r, t = cfg.rollout, cfg.train
    return (t.steps_per_generation == 1 and cfg.algorithm.num_iterations == 1
            and r.generation_batch_size in (None, t.prompts_per_step * r.num_generations))


ONE_STEP_FIX = ("train.steps_per_generation = 1, algorithm.num_iterations = 1 and rollout.generation_batch_size unset "
                "(one optimizer step per generation batch)")


def engine_shares_policy_module(cfg: CohortConfig) -> bool:
    """The transformers engine in the trainer's process samples with the policy module itself: its weights cannot
    change under requests in flight."""
    return cfg.engine.name == "hf" and cfg.engine.mode == "colocate"
