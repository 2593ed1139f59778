"""Registries: lookup, unknown names, duplicates, and one shared signature per kind."""

import pytest

from cohort.algorithms import ADVANTAGE_ESTIMATORS, AGGREGATIONS, KL_ESTIMATORS, POLICY_LOSSES, Registry


def test_register_and_get():
    registry: Registry = Registry("widget")

    @registry.register("double")
    def double(x):
        return 2 * x

    assert registry.get("double") is double
    assert registry.names() == ("double",)
    assert "double" in registry and len(registry) == 1


def test_unknown_name_lists_valid_names():
    registry: Registry = Registry("widget")
    registry.add("a", 1)
    registry.add("b", 2)
    with pytest.raises(ValueError, match=r"unknown widget 'c'; valid names: a, b"):
        registry.get("c")


def test_duplicate_name_raises():
    registry: Registry = Registry("widget")
    registry.add("a", 1)
    with pytest.raises(ValueError, match="already registered"):
        registry.add("a", 2)
    with pytest.raises(ValueError, match="already registered"):
        registry.register("a")(lambda: None)
    assert registry.get("a") == 1  # the first entry survives


def test_builtin_registries_hold_the_documented_names():
    assert set(ADVANTAGE_ESTIMATORS.names()) == {"grpo", "dr_grpo", "rloo"}
    assert set(POLICY_LOSSES.names()) == {"ppo_clip", "gspo", "seq_sum_clip", "cispo", "sapo", "luspo", "vespo",
                                         "gmpo"}
    assert set(KL_ESTIMATORS.names()) == {"k1", "k2", "k3", "low_var_kl"}
    assert set(AGGREGATIONS.names()) == {
        "token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "seq_mean_token_sum_norm", "bnpo",
    }


@pytest.mark.parametrize("registry", [ADVANTAGE_ESTIMATORS, POLICY_LOSSES, KL_ESTIMATORS, AGGREGATIONS])
def test_builtin_registries_refuse_duplicates(registry):
    name = registry.names()[0]
    with pytest.raises(ValueError, match="already registered"):
        registry.add(name, registry.get(name))
