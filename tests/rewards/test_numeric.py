"""numeric_match: formatting-tolerant exact number match."""

from fractions import Fraction

import pytest

from cohort.rewards import get
from cohort.rewards.numeric import extract_number, gold_number, parse_numbers


@pytest.mark.parametrize(
    "text, expected",
    [
        ("1,234", ["1234"]),
        (" 42.0", ["42"]),
        ("-7", ["-7"]),
        ("\u22123", ["-3"]),  # Unicode minus
        ("$1,234.50", ["2469/2"]),
        ("so 5-3=2", ["5", "3", "2"]),  # a minus after a digit is an operator
        ("x-7", ["7"]),
        ("1,2,3", ["1", "2", "3"]),  # not thousands groups
        ("is 42.", ["42"]),  # sentence full stop
        (".5 and 2e3", ["1/2", "2000"]),
        ("1e999999999", []),  # absurd exponents are ignored, not expanded
        ("no digits", []),
    ],
)
def test_parse_numbers(text, expected):
    assert [str(x) for x in parse_numbers(text)] == expected


def test_extract_last_first_and_pattern():
    text = r"Step 1: 3 apples. Step 2: 4 more. \boxed{7} (checked 2 times)"
    assert extract_number(text) == 2
    assert extract_number(text, position="first") == 1
    assert extract_number(text, answer_pattern=r"\\boxed\{([^}]*)\}") == 7
    assert extract_number("no box", answer_pattern=r"\\boxed\{([^}]*)\}") is None


def test_gold_number_forms():
    assert gold_number("Natalia sold 48/2 = 24 clips.\n#### 72") == 72  # GSM8K
    assert gold_number(7) == 7
    assert gold_number(0.1) == Fraction(1, 10)  # decimal value, not the binary neighbour
    assert gold_number("n/a") is None
    assert gold_number(None) is None
    assert gold_number(True) is None


def test_numeric_match_scores_plain_and_chat():
    reward = get("numeric_match")
    completions = [
        "The total is 1,234.",
        [{"role": "assistant", "content": "I get  42.0"}],
        "It is -7",
        "I think 8",
        "no number at all",
        "42",
    ]
    answers = ["1234", "42", "#### -7", "9", "5", "unknown"]
    scores = reward(prompts=[""] * 6, completions=completions, completion_ids=[[]] * 6, answer=answers)
    assert scores == [1.0, 1.0, 1.0, 0.0, 0.0, None]


def test_gold_column_fallbacks_and_error():
    reward = get("numeric_match")
    assert reward(completions=["3"], solution=["3"]) == [1.0]  # answer missing → solution
    assert reward(completions=["3"], ground_truth=[3]) == [1.0]
    with pytest.raises(KeyError, match="gold_column"):
        reward(completions=["3"], other=["3"])
    custom = get("numeric_match", gold_column="target")
    assert custom(completions=["3", "4"], target=[3, 3], answer=[4, 4]) == [1.0, 0.0]


def test_rel_tol():
    reward = get("numeric_match", rel_tol=1e-3)
    assert reward(completions=["3.1416"], answer=["3.14159"]) == [1.0]
    assert get("numeric_match")(completions=["3.1416"], answer=["3.14159"]) == [0.0]


def test_bad_options():
    with pytest.raises(ValueError, match="position"):
        get("numeric_match", position="middle")
    with pytest.raises(ValueError, match="no option"):
        get("numeric_match", gold="answer")
