"""Two facts of a config that decide which scheduler rules combine (cohort/plan/pipeline_checks.py reads them, the
batch plan too): one optimizer step per generation batch, and an engine that shares the
policy module. The admission rules themselves are data in cohort/config/admission.py. Pure: imports only the
config, so the planner stays torch-free.
"""

from __future__ import annotations

from cohort.config import CohortConfig


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
