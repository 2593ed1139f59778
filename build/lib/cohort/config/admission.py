"""What the rollout scheduler admits (cohort/rollout/scheduler.py), read once from `pipeline.*`: `AdmissionRules`.

The one declaration of the rules: the batch plan carries them (`BatchPlan.admission`, cohort/plan/batch.py) and the
scheduler takes them as they are. Data, not a check: it sits with the config, below the rollout package, so both
read the same class. Imports only the config's schema.
"""

from __future__ import annotations

from dataclasses import dataclass

from cohort.config.schema import PipelineConfig


@dataclass(frozen=True)
class AdmissionRules:
    """What the rollout scheduler admits (the scheduler's module docstring says how each rule acts)."""

    max_staleness: int = 0  # k
    over_provision: float = 1.0  # f
    max_aborts: int = 1
    stale_tokens: str = "mask"  # mask | drop
    engine_timeout_s: float = 600.0
    refill: bool = False  # dynamic sampling: a dropped (constant) group is replaced by a new prompt
    max_refill_rounds: int = 30

    @classmethod
    def from_config(cls, pipeline: PipelineConfig) -> AdmissionRules:
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
