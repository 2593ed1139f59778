"""The answer breakdown's pure functions (cohort/runs/answer_stats.py), each against hand-counted values."""

from __future__ import annotations

import math
from math import comb

import pytest

from cohort.runs import answer_stats as st


def test_ranked_orders_by_count_then_text_and_skips_none():
    # counts: "b" 2, "a" 2, "c" 1, "10" 1; ties go to the smaller text: "a" < "b", "10" < "c"
    assert st.ranked(["b", "a", None, "b", "c", "a", "10", None]) == [("a", 2), ("b", 2), ("10", 1), ("c", 1)]


def test_constant_baseline_is_the_most_common_reference_share():
    # 7 references, one None: "1" x3, "2" x2, "3" x1 -> the constant "1" is right on 3 of the 6 with a reference
    assert st.constant_baseline(["1", "2", "1", None, "3", "2", "1"]) == ("1", 0.5)
    answer, share = st.constant_baseline([None, None])
    assert answer is None and math.isnan(share)


def test_common_answers_break_ties_by_text():
    # "x" 2, "b" 2, "a" 2, "z" 1: three tie for the top; the two smaller texts win, in any item order
    refs = ["x", "b", "a", "z", "a", "b", "x"]
    assert st.common_answers(refs) == ["a", "b"]
    assert st.common_answers(list(reversed(refs))) == ["a", "b"]


def test_beyond_common_is_the_accuracy_off_the_two_most_common_answers():
    refs = ["1", "1", "1", "2", "2", "3", "4", None, "5"]
    correct = [1, 1, 1, 0, 1, 0, 1, 1, math.nan]
    # common = {"1", "2"}; beyond: "3" (0), "4" (1), "5" (unscored: NaN, left out); None is in neither set -> 1/2
    assert st.beyond_common(refs, correct) == (0.5, 2)
    # with ties: "a" 2, "b" 2, "c" 2 -> common {"a", "b"}; beyond = the two "c" items, one right
    assert st.beyond_common(["c", "a", "b", "c", "a", "b"], [1, 1, 1, 0, 1, 1]) == (0.5, 2)
    accuracy, items = st.beyond_common(["1", "2", "1"], [1, 0, 1])
    assert math.isnan(accuracy) and items == 0


def test_answer_distribution_counts_answers_and_no_answers():
    answers = ["1", "1", "10", None, "1", "2", "10", None, "3"]
    # "1" x3, "10" x2, "2" x1, "3" x1 (4 distinct), 2 without an answer; top 3: "1", "10", then "2" < "3"
    assert st.answer_distribution(answers, top=3) == {"top": [["1", 3], ["10", 2], ["2", 1]], "distinct": 4, "no_answer": 2}


@pytest.mark.parametrize("n, c, k, expected", [
    (5, 2, 2, 1 - 3 / 10),      # 1 - C(3,2)/C(5,2) = 1 - 3/10
    (4, 1, 1, 0.25),            # pass@1 is the fraction correct
    (4, 0, 4, 0.0),
    (4, 1, 4, 1.0),             # every draw of 4 of 4 holds the correct one
    (10, 3, 4, 1 - 35 / 210),   # 1 - C(7,4)/C(10,4) = 1 - 35/210
    (8, 6, 3, 1.0),             # n - c = 2 < k: always
])
def test_pass_at_k_matches_the_binomial_form(n, c, k, expected):
    assert st.pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)
    assert st.pass_at_k(n, c, k) == pytest.approx(1 - comb(n - c, k) / comb(n, k), abs=1e-12)


def test_pass_at_k_refuses_impossible_counts():
    with pytest.raises(ValueError, match="1 <= k <= n"):
        st.pass_at_k(4, 1, 5)


def test_mean_pass_at_k_averages_items_and_skips_unscored_samples():
    rows = [[1, 0, 0, 0], [0, 0, 0, 0], [1, 1, math.nan, 0], [math.nan] * 4]
    # pass@2: item 1: 1 - C(3,2)/C(4,2) = 1 - 3/6 = 0.5; item 2: 0; item 3 (3 scored, 2 right): 1 - C(1,2)/C(3,2) = 1;
    # item 4 has no scored sample: left out -> (0.5 + 0 + 1) / 3 = 0.5
    assert st.mean_pass_at_k(rows, 2) == pytest.approx(0.5)
    # pass@1 = mean correct per item: (0.25 + 0 + 2/3) / 3
    assert st.mean_pass_at_k(rows, 1) == pytest.approx((0.25 + 0 + 2 / 3) / 3)


def test_group_answer_metrics_of_a_collapsed_and_a_spread_batch():
    # two groups of 4: ["1","1","1","1"] and ["1","1","2",None]; references "1" (group 1) and "3" (group 2)
    answers = ["1", "1", "1", "1", "1", "1", "2", None]
    refs = ["1"] * 4 + ["3"] * 4
    m = st.group_answer_metrics(answers, refs, 4)
    # distinct per group: 1 and 3 ("1", "2", None) -> 2.0; "1" is 6 of 8; the top reference 4 of 8; 1 of 8 no answer
    assert m == {"answers/distinct_per_group": 2.0, "answers/top_share": 0.75, "answers/reference_top_share": 0.5,
                 "answers/no_answer_share": 0.125}


def test_gain_line_and_eval_line():
    before = {"accuracy": 0.243, "beyond_common_accuracy": 0.391, "num_prompts": 200}
    after = {"accuracy": 0.450, "beyond_common_accuracy": 0.348, "num_prompts": 200}
    # (0.450 - 0.243) * 100 = +20.7; (0.348 - 0.391) * 100 = -4.3: the example
    assert st.gain_line(before, after) == "+20.7 points; beyond the two most common answers: -4.3"
    assert st.gain_line({"accuracy": 0.1}, {"accuracy": 0.2, "breakdown_missing": "no reader"}) == \
        "+10.0 points; no answer breakdown: no reader"
    record = {"accuracy": 0.557, "num_prompts": 300, "constant_answer": "1", "constant_accuracy": 0.57,
              "common_answers": ["1", "2"], "beyond_common_accuracy": 0.0, "beyond_common_prompts": 47,
              "answers": {"top": [["1", 292], ["2", 5]], "distinct": 4, "no_answer": 1},
              "pass@1": 0.5, "pass@4": 0.625, "pass_samples": 4, "pass_temperature": 0.7}
    assert st.eval_line(record) == (
        'accuracy 55.7% on 300 held-out prompts; constant answer "1": 57.0%; beyond the two most common answers '
        '("1", "2"; 47 prompts): 0.0%; pass@1 50.0%, pass@4 62.5% (4 samples at T=0.7); answers: "1" x292, "2" x5, '
        'no answer x1 (4 distinct)')


# 8 items; the model's answers and the references (None: no answer / no reference)
CHANCE_ANSWERS = ["1", "1", "1", "2", "1", "3", None, "1"]
CHANCE_REFS = ["1", "1", "2", "2", "3", "4", "1", None]


def test_chance_accuracy_deals_the_model_s_answers_out_at_random():
    # items with a reference: 0..6 (7). The model's answers on them: "1" x4, "2" x1, "3" x1, no answer x1, so
    # p("1") = 4/7, p("2") = 1/7, p("3") = 1/7, p("4") = 0. References: "1" x3, "2" x2, "3" x1, "4" x1.
    # all: (3 * 4 + 2 * 1 + 1 * 1 + 1 * 0) / (7 * 7) = 15/49
    assert st.chance_accuracy(CHANCE_ANSWERS, CHANCE_REFS) == pytest.approx(15 / 49, abs=1e-12)
    # beyond "1" and "2": items 4 ("3") and 5 ("4"): (1/7 + 0) / 2 = 1/14
    assert st.beyond_items(CHANCE_REFS) == [4, 5]
    assert st.chance_accuracy(CHANCE_ANSWERS, CHANCE_REFS, st.beyond_items(CHANCE_REFS)) == pytest.approx(1 / 14, abs=1e-12)
    # a constant answer's chance accuracy is its own accuracy: the constant "1" is right on 3 of 7
    assert st.chance_accuracy(["1"] * 8, CHANCE_REFS) == pytest.approx(3 / 7, abs=1e-12)
    assert math.isnan(st.chance_accuracy(["1", "2"], [None, None]))


def test_by_reference_puts_each_reference_s_accuracy_beside_how_often_the_model_says_it():
    correct = [1, 1, 0, 1, 0, 0, 0, 0]  # answer == reference: items 0, 1, 3
    # "1": items 0, 1, 6 -> 2 of 3 right, said on 4 of the 7 referenced items; "2": items 2, 3 -> 1 of 2, said 1/7;
    # "3": item 4 -> 0, said 1/7 (on item 5, whose reference is "4"); "4": item 5 -> 0, never said
    rows = st.by_reference(CHANCE_ANSWERS, CHANCE_REFS, correct)
    assert rows == [["1", 3, pytest.approx(2 / 3), pytest.approx(4 / 7)], ["2", 2, 0.5, pytest.approx(1 / 7)],
                    ["3", 1, 0.0, pytest.approx(1 / 7)], ["4", 1, 0.0, 0.0]]
    assert st.by_reference(CHANCE_ANSWERS, CHANCE_REFS, correct, top=1) == [["1", 3, pytest.approx(2 / 3), pytest.approx(4 / 7)]]


@pytest.mark.parametrize("accuracy, chance, items, above", [
    (0.30, 0.16, 100, True),   # 2 sqrt(0.16 * 0.84 / 100) = 0.0733; 0.14 above
    (0.24, 0.16, 100, True),   # 0.08 > 0.0733
    (0.23, 0.16, 100, False),  # 0.07 < 0.0733
    (0.149, 0.16, 100, False),  # below
    (0.01, 0.0, 5, True),      # nothing by chance: any right answer is the question read
    (0.5, math.nan, 5, False),
    (0.5, 0.1, 0, False),
])
def test_above_chance_is_two_binomial_standard_errors_above(accuracy, chance, items, above):
    assert st.above_chance(accuracy, chance, items) is above


def test_the_gain_line_says_whether_the_gain_beyond_the_common_answers_is_above_chance():
    before = {"accuracy": 0.19, "beyond_common_accuracy": 0.0}
    # the letter_counting run with G=16, T=1.0 (docs/environments.md): +14.9 beyond, at its answers' chance
    after = {"accuracy": 0.29, "beyond_common_accuracy": 0.149, "beyond_common_chance": 0.16, "beyond_common_prompts": 100}
    assert st.gain_line(before, after) == ("+10.0 points; beyond the two most common answers: +14.9, after training at chance "
                                           "(14.9%; 16.0% if its answers ignored the question)")
    after = {**after, "beyond_common_accuracy": 0.30}
    assert st.gain_line(before, after) == ("+10.0 points; beyond the two most common answers: +30.0, after training above chance "
                                           "(30.0%; 16.0% if its answers ignored the question)")


def test_the_eval_line_shows_chance_and_the_accuracy_by_reference():
    record = {"accuracy": 0.29, "num_prompts": 300, "constant_answer": "1", "constant_accuracy": 0.57,
              "chance_accuracy": 0.317, "common_answers": ["1", "2"], "beyond_common_accuracy": 0.149,
              "beyond_common_prompts": 47, "beyond_common_chance": 0.16,
              "by_reference": [["1", 171, 0.25, 0.26], ["2", 82, 0.3, 0.31], ["3", 30, 0.1, 0.12], ["4", 10, 0.0, 0.05]],
              "answers": {"top": [["2", 93], ["1", 78]], "distinct": 9, "no_answer": 0}}
    # 2 sqrt(0.16 * 0.84 / 47) = 0.107: 14.9% is at chance
    assert st.eval_parts(record) == [
        "accuracy 29.0% on 300 held-out prompts", 'constant answer "1": 57.0%', "if its answers ignored the question: 31.7%",
        'beyond the two most common answers ("1", "2"; 47 prompts): at chance (14.9%; 16.0% if its answers ignored the '
        'question)',
        'right on each reference vs how often it says it: "1" 25.0% vs 26.0%, "2" 30.0% vs 31.0%, "3" 10.0% vs 12.0%',
        'answers: "2" x93, "1" x78 (9 distinct)']
