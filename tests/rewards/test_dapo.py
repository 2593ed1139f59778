"""dapo_math: DAPO's 'Answer:' scorer (verl's math_dapo), and verl_default routing DAPO's data sources to it."""

from __future__ import annotations

import pytest

from cohort.rewards import get
from cohort.rewards.dapo import normalize_answer

CASES = [  # (completion, ground truth, expected, why)
    ("so the total is 42.\nAnswer: 42", "42", 1.0, "the Answer: line equals the ground truth"),
    ("answer: 42", "42", 1.0, "Answer: is matched in any case"),
    ("Answer: 1\nAnswer: 2", "2", 1.0, "the last Answer: counts"),
    ("Answer: x = 3", "3", 1.0, "only what follows the last = is compared"),
    ("Answer: 5 degrees", "5", 1.0, "spaces then units are removed: '5degrees' -> '5'"),
    ("Answer: \\boxed{1,000}", "1000", 1.0, "boxed unwrapped, thousands commas dropped"),
    ("Answer: $\\frac12$", "\\frac{1}{2}", 1.0, "$...$ unwrapped, \\fracab -> \\frac{a}{b}"),
    ("Answer: 1/2", "\\frac{1}{2}", -1.0, "strict: 1/2 is not \\frac{1}{2}"),
    ("the answer is 3", "3", -1.0, "no 'Answer:' line: -1"),
    ("Answer: 7" + " padding" * 50, "7", -1.0, "only the last 300 characters are read (the answer is 400 back)"),
    ("Answer: 8", "7", -1.0, "a wrong answer scores -1, not 0"),
]


@pytest.mark.parametrize("completion, truth, expected, why", CASES)
def test_dapo_math_scores_as_dapo(completion, truth, expected, why):
    assert get("dapo_math")(completions=[completion], ground_truth=[truth]) == [expected], why


def test_normalisation_steps():
    # '\\text{m}' -> '\\text{}' then removed; 'an ' dropped; '\\$' dropped; '^\\circ' removed
    assert normalize_answer(" 12 \\text{m}") == "12"
    assert normalize_answer("an apple") == "apple" and normalize_answer("a b") == "b"  # articles dropped
    assert normalize_answer("\\$5") == "5" and normalize_answer("90^\\circ") == "90"
    assert normalize_answer("\\sqrt2") == "\\sqrt{2}"


def test_verl_default_routes_dapo_sources():
    reward = get("verl_default", num_workers=1)
    try:
        scores = reward(completions=["Answer: 3", "Answer: 4", "Answer: 5"], ground_truth=["3", "3", "5"],
                        data_source=["math_dapo", "aime2024", "math"])
    finally:
        reward.close()
    assert scores == [1.0, -1.0, 1.0]
