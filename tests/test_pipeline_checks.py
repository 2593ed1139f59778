"""The scheduler rules' incompatibilities: one table (cohort/plan/pipeline_checks.py), each row's message naming its fields
and the fix; every other combination of the rules is accepted."""

from __future__ import annotations

from cohort.config.resolve import load_config
from cohort.plan.pipeline_checks import INCOMPATIBLE, pipeline_problems


def _problems(*overrides: str, world: int = 1) -> list[str]:
    return pipeline_problems(load_config(None, list(overrides)), world)


def test_the_rules_compose():
    # one scheduler: a staleness bound with partial rollouts, dynamic sampling and the streamed update left on auto
    assert _problems() == []
    assert _problems("pipeline.max_staleness=2", "pipeline.over_provision=2", "pipeline.dynamic_sampling=true") == []
    assert _problems("pipeline.max_staleness=0", "pipeline.stream_update=on") == []  # k = 0 is synchronous


def test_each_incompatibility_is_one_row_with_its_fix():
    # k = 1 with the transformers engine in-process, two steps per generation batch, the streamed update forced on and
    # two training processes: the four k >= 1 rows, then stream_update=on's own blockers (the two steps, the two
    # processes, the staleness bound), in the table's order
    got = _problems("pipeline.max_staleness=1", "engine.name=hf", "train.steps_per_generation=2", "pipeline.stream_update=on",
                    world=2)
    assert [p.split(":")[0].split(";")[0] for p in got[:4]] == [
        "pipeline.max_staleness with engine.name = hf", "pipeline.max_staleness needs one optimizer step per generation batch",
        "pipeline.max_staleness with pipeline.stream_update = on", "pipeline.max_staleness runs in one training process (got 2)"]
    assert got[1].endswith("set train.steps_per_generation = 1, algorithm.num_iterations = 1 and rollout.generation_batch_size "
                           "unset (one optimizer step per generation batch)")
    assert len(got) == 4 + 3 and all("pipeline.stream_update = on, but" in p for p in got[4:])


def test_ranges_and_the_algorithm_rule():
    assert _problems("pipeline.max_staleness=-1") == ["pipeline.max_staleness = -1: must be >= 0; 0: synchronous; 1-4 are usual; or unset it"]
    assert _problems("pipeline.over_provision=0.5")[0].startswith("pipeline.over_provision = 0.5: must be a number >= 1")
    (ds,) = _problems("pipeline.dynamic_sampling=true", "algorithm.name=ppo")
    assert ds.startswith("pipeline.dynamic_sampling = true with algorithm.name = ppo") and ds.endswith(
        "use one of ['grpo', 'rloo', 'reinforce_pp_baseline'] or set pipeline.dynamic_sampling=false")
    assert {row.rule for row in INCOMPATIBLE} == {"max_staleness", "engine_timeout_s", "over_provision", "max_aborts",
                                                  "max_refill_rounds", "dynamic_sampling"}
