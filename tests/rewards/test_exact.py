"""exact_match: the whole completion against the gold, after stripping surrounding whitespace only."""

import pytest

from cohort.rewards import get, resolve
from cohort.rewards.reward_registry import needed_columns


def test_exact_match_compares_the_stripped_text_and_nothing_looser():
    reward = get("exact_match")
    completions = ["14797 14798", " 14797 14798\n", "14797  14798", "14797 1479", "14797 14798 14799", "Yes", "7",
                   [{"role": "assistant", "content": "14797 14798"}]]
    golds = ["14797 14798", "14797 14798", "14797 14798", "14797 14798", "14797 14798", "yes", 7, "14797 14798"]
    # surrounding whitespace goes; an inner double space, a missing digit, one number too many, case: all wrong;
    # a numeric gold is compared as its text; a chat completion is its last assistant message
    assert reward(completions=completions, answer=golds) == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0]


def test_a_missing_gold_is_not_applicable_and_the_column_is_configurable():
    assert get("exact_match")(completions=["a", "b"], answer=["a", None]) == [1.0, None]
    assert get("exact_match", gold_column="target")(completions=["a"], target=["a"], answer=["b"]) == [1.0]
    with pytest.raises(KeyError, match="exact_match needs the gold column 'answer' or 'solution' or 'ground_truth'"):
        get("exact_match")(completions=["a"], label=["a"])


def test_exact_match_is_a_builtin_that_reads_the_gold_column():
    assert resolve("exact_match").kind == "builtin"
    assert needed_columns("exact_match") == [("the gold answer", "gold_column", ("answer", "solution", "ground_truth"))]
    assert needed_columns("exact_match", {"gold_column": "target"}) == [("the gold answer", "gold_column", ("target",))]
