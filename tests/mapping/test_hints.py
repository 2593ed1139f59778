"""A verl or TRL key given where a cohort key belongs is refused before anything loads, with cohort's spelling."""

from __future__ import annotations

import pytest

from cohort.config import ConfigError
from cohort.config.resolve import load_config
from cohort.mapping.hints import foreign_key_hint
from cohort.mapping.trl_rules import TRL_RULES
from cohort.mapping.verl_rules import VERL_RULES


def test_every_target_of_both_tables_is_a_cohort_field():
    from cohort.config.fields import describe_fields

    known = {key for key, *_ in describe_fields()}
    targets = {t for rule in VERL_RULES + TRL_RULES for t in rule.targets}
    assert targets <= known
    for rules in (VERL_RULES, TRL_RULES):
        sources = [r.source for r in rules]
        assert len(sources) == len(set(sources)), "a source key is in its table twice"


@pytest.mark.parametrize("override, line", [
    ("actor_rollout_ref.rollout.n=8", "actor_rollout_ref.rollout.n is verl's name: cohort calls it rollout.num_generations"),
    ("data.train_batch_size=64", "data.train_batch_size is verl's name: cohort calls it rollout.generation_batch_size"),
    ("num_generations=8", "num_generations is TRL's name: cohort calls it rollout.num_generations"),
    ("trainer.project_name=x", "trainer.project_name is verl's name: cohort has no counterpart: the wandb run"),
])
def test_a_foreign_override_is_refused_with_cohorts_spelling(override, line):
    with pytest.raises(ConfigError) as err:
        load_config(None, [override])
    assert err.value.problems == [err.value.problems[0]] and err.value.problems[0].startswith(line)
    assert "cohort convert" in err.value.problems[0]


def test_foreign_keys_in_a_yaml_are_refused_each_on_one_line(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("num_generations: 8\nlearning_rate: 1.0e-6\nactor_rollout_ref:\n  rollout:\n    n: 5\ntrain:\n  max_steps: 3\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert [p.split(":")[0] for p in err.value.problems] == ["num_generations is TRL's name", "learning_rate is TRL's name",
                                                             "actor_rollout_ref is a section of verl's config, not of cohort's"]
    assert "train.learning_rate" in err.value.problems[1]


def test_a_plain_typo_keeps_the_usual_message():
    assert foreign_key_hint("rollout.num_generation") is None
    with pytest.raises(ConfigError, match="rollout.num_generation: unknown field; valid fields in rollout"):
        load_config(None, ["rollout.num_generation=8"])
