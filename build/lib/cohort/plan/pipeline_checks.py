"""The rollout scheduler's rules (`pipeline.*`) checked before anything loads: their ranges, and every combination
that cannot work, in one table that also writes the messages.

Each row of `INCOMPATIBLE` is (the rule, its condition, what to say, the fix); `pipeline_problems(cfg, world)` returns
the message of every row that holds. The rules otherwise compose (one scheduler, cohort/rollout/scheduler.py):
a staleness bound k >= 1 with partial rollouts, dynamic sampling and tools all run. What a row's condition reads
(one optimizer step per generation batch, an engine sharing the policy module, the streamed update's blockers) is
defined once, in cohort/plan/run_mode.py and cohort/plan/batch.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from cohort.algorithm_facts import FACTS
from cohort.config import CohortConfig
from cohort.plan.batch import GROUP_RELATIVE, stream_update_blockers
from cohort.plan.run_mode import ONE_STEP_FIX, engine_shares_policy_module, one_step_per_generation


@dataclass(frozen=True)
class Incompatible:
    """A combination that cannot work: `when(cfg, world)` holds; the message is `what(cfg, world)` + "; " + `fix`."""

    rule: str  # the pipeline field the row belongs to (docs and tests group by it)
    when: Callable[[CohortConfig, int], bool]
    what: Callable[[CohortConfig, int], str]
    fix: str


def _k(cfg: CohortConfig) -> int:
    return cfg.pipeline.max_staleness or 0


INCOMPATIBLE: tuple[Incompatible, ...] = (
    # ranges
    Incompatible("max_staleness", lambda c, w: _k(c) < 0,
                 lambda c, w: f"pipeline.max_staleness = {c.pipeline.max_staleness}: must be >= 0",
                 "0: synchronous; 1-4 are usual; or unset it"),
    Incompatible("engine_timeout_s", lambda c, w: c.pipeline.engine_timeout_s <= 0,
                 lambda c, w: f"pipeline.engine_timeout_s = {c.pipeline.engine_timeout_s}: must be > 0 seconds", "600 is the default"),
    Incompatible("over_provision", lambda c, w: not (c.pipeline.over_provision >= 1 and math.isfinite(c.pipeline.over_provision)),
                 lambda c, w: f"pipeline.over_provision = {c.pipeline.over_provision}: must be a number >= 1",
                 "1: off; 1.5 requests half as many groups again as the batch needs"),
    Incompatible("max_aborts", lambda c, w: c.pipeline.max_aborts < 0,
                 lambda c, w: f"pipeline.max_aborts = {c.pipeline.max_aborts}: must be >= 0",
                 "0: a request interrupted once runs to the end next step"),
    Incompatible("max_refill_rounds", lambda c, w: c.pipeline.max_refill_rounds < 0,
                 lambda c, w: f"pipeline.max_refill_rounds = {c.pipeline.max_refill_rounds}: must be >= 0",
                 "0: no replacement groups"),
    # a staleness bound k >= 1: generation through the update
    Incompatible("max_staleness", lambda c, w: _k(c) >= 1 and engine_shares_policy_module(c),
                 lambda c, w: "pipeline.max_staleness with engine.name = hf: the transformers engine samples with the "
                              "trainer's own module, which cannot change between its steps",
                 "use engine.name=vllm (or a local_server/server mode) or unset pipeline.max_staleness"),
    Incompatible("max_staleness", lambda c, w: _k(c) >= 1 and not one_step_per_generation(c),
                 lambda c, w: "pipeline.max_staleness needs one optimizer step per generation batch", f"set {ONE_STEP_FIX}"),
    Incompatible("max_staleness", lambda c, w: _k(c) >= 1 and c.pipeline.stream_update == "on",
                 lambda c, w: "pipeline.max_staleness with pipeline.stream_update = on: groups are trained when the batch "
                              "is taken", "set pipeline.stream_update=auto"),
    Incompatible("max_staleness", lambda c, w: _k(c) >= 1 and w > 1,
                 lambda c, w: f"pipeline.max_staleness runs in one training process (got {w})",
                 "set train.num_processes=1 or unset it"),
    # partial rollouts and dynamic sampling
    Incompatible("over_provision", lambda c, w: c.pipeline.over_provision > 1 and w > 1,
                 lambda c, w: f"pipeline.over_provision > 1 with {w} training processes: partial rollouts run in one "
                              "process only", "set train.num_processes=1 or pipeline.over_provision=1"),
    Incompatible("dynamic_sampling", lambda c, w: c.pipeline.dynamic_sampling
                 and not FACTS[c.algorithm.name].zero_for_constant_group,
                 lambda c, w: f"pipeline.dynamic_sampling = true with algorithm.name = {c.algorithm.name}: under it a group "
                              "whose rewards are all equal still has non-zero advantages (batch whitening, a critic or a teacher), so "
                              "dropping it throws signal away",
                 f"use one of {list(GROUP_RELATIVE)} or set pipeline.dynamic_sampling=false"),
    Incompatible("dynamic_sampling", lambda c, w: c.pipeline.dynamic_sampling and w > 1,
                 lambda c, w: f"pipeline.dynamic_sampling = true with {w} training processes: served in one process only",
                 "set train.num_processes=1 or pipeline.dynamic_sampling=false"),
)


def pipeline_problems(cfg: CohortConfig, world: int) -> list[str]:
    """Every row of `INCOMPATIBLE` that holds for this config and `world` training processes, and a streamed update
    asked for (`pipeline.stream_update = on`) where it would not be exact."""
    problems = [f"{row.what(cfg, world)}; {row.fix}" for row in INCOMPATIBLE if row.when(cfg, world)]
    if cfg.pipeline.stream_update == "on":
        problems += [f"pipeline.stream_update = on, but the per-group update would not equal the batch update: {b} "
                     "(or set pipeline.stream_update=auto/off)" for b in stream_update_blockers(cfg, world)]
    return problems
