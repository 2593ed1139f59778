"""Reward functions that say which answer a completion gives (cohort/rewards/answer_reading.py), and the eval's
answer breakdown over them (cohort/trainer/evaluate.py's `answer_breakdown`) on the letter_counting example's real
held-out split."""

from __future__ import annotations

import numpy as np
import pytest

from cohort.config.resolve import load_config
from cohort.plan.run_environment import run_data
from cohort.rewards import RewardSet
from cohort.rewards.answer_reading import AnswerReader, Unreadable, answer_reader, batch_answer_metrics
from cohort.trainer.evaluate import answer_breakdown

EXAMPLE = "examples/reasoning_gym_letter_counting.yaml"


def test_numeric_match_reads_numbers_as_the_scorer_compares_them():
    rewards = RewardSet.from_specs([{"name": "numeric_match"}])
    reader = answer_reader(rewards)
    assert isinstance(reader, AnswerReader)
    completions = ["so 1.0", "it is 1,234", "none here", "-7", "x 0.125"]
    # the last number of each, one text per value: 1.0 -> "1", 1,234 -> "1234", none -> None, 0.125 -> "1/8"
    assert reader.read_answers(completions=completions) == ["1", "1234", None, "-7", "1/8"]
    assert reader.reference_answers(answer=["1", 1234, "#### 72", None, "0.125"]) == ["1", "1234", "72", None, "1/8"]
    rewards.close()


def test_exact_match_reads_stripped_text():
    reader = answer_reader(RewardSet.from_specs([{"name": "exact_match"}]))
    assert reader.read_answers(completions=[" 120 121 \n", "   ", [{"role": "assistant", "content": "ok"}]]) == \
        ["120 121", None, "ok"]
    assert reader.reference_answers(answer=[" 120 121", None, 3]) == ["120 121", None, "3"]


def test_a_reward_without_answers_says_why():
    def my_reward(completions, **kwargs):
        return [0.0] * len(completions)

    reader = answer_reader(RewardSet.from_specs([my_reward]))
    assert isinstance(reader, Unreadable) and "does not say which answer a completion gives" in reader.reason
    assert answer_breakdown(RewardSet.from_specs([my_reward]), ["a"], {"answer": ["a"]}, np.array([1.0])) == \
        {"breakdown_missing": reader.reason}
    assert batch_answer_metrics(reader, None, [0], ["a"], 1) == {}


@pytest.fixture(scope="module")
def letter_counting():
    cfg = load_config(EXAMPLE, [])
    _, evals, specs = run_data(cfg)
    rewards = RewardSet.from_specs(specs)
    yield evals, rewards
    rewards.close()


def test_letter_counting_breakdown_hand_counted(letter_counting):
    evals, rewards = letter_counting
    rows = evals.rows
    columns = {c: [r.get(c) for r in rows] for c in evals.columns}
    assert len(rows) == 300
    # the model of the worked example after training: "... 1 time" to every question (docs/environments.md), chat
    completions = [[{"role": "assistant", "content": 'The letter appears 1 time in "x".'}] for _ in rows]
    reader = answer_reader(rewards)
    answers, refs = reader.read_answers(completions=completions, **columns), reader.reference_answers(**columns)
    assert set(answers) == {"1"}
    # hand-counted from the split (docs/environments.md): key "1" 171, "2" 82, "3" 30, "4" 12, "5" 3, "6" 2
    counts = {k: refs.count(k) for k in set(refs)}
    assert counts == {"1": 171, "2": 82, "3": 30, "4": 12, "5": 3, "6": 2}
    correct = np.array([1.0 if r == "1" else 0.0 for r in refs])  # what the task's scorer gives "1" (checked below)
    scores = np.asarray(rewards.score(prompts=[r["prompt"] for r in rows], completions=completions,
                                      completion_ids=[[0]] * 300, columns=columns, group_size=1).per_function[:, 0])
    assert np.array_equal(scores >= 1.0, correct == 1.0)
    out = answer_breakdown(rewards, completions, columns, correct)
    # constant "1": 171/300 = 57.0%; beyond {"1", "2"}: 300 - 171 - 82 = 47 questions, none right. A constant answer's
    # chance accuracy is its accuracy (p("1") = 1 x q("1") = 171/300), and 0 beyond the common answers (it never says
    # "3".."6"); by reference: right on every "1" question, saying "1" to all 300, never right nor saying the others
    assert out == {"constant_answer": "1", "constant_accuracy": 171 / 300, "chance_accuracy": 171 / 300,
                   "common_answers": ["1", "2"], "beyond_common_accuracy": 0.0, "beyond_common_prompts": 47,
                   "beyond_common_chance": 0.0,
                   "by_reference": [["1", 171, 1.0, 1.0], ["2", 82, 0.0, 0.0], ["3", 30, 0.0, 0.0], ["4", 12, 0.0, 0.0],
                                    ["5", 3, 0.0, 0.0]],
                   "answers": {"top": [["1", 300]], "distinct": 1, "no_answer": 0}}


def test_letter_counting_batch_metrics(letter_counting):
    evals, rewards = letter_counting
    # two groups of 4 on rows 0 and 1, as the trainer logs them: answers from the replies' last numbers
    texts = ["1", "It is 1.", "2 times", "none", "1", "1", "1", "1"]
    metrics = batch_answer_metrics(answer_reader(rewards), evals, [0, 0, 0, 0, 1, 1, 1, 1], texts, 4)
    keys = [evals.rows[0]["answer"], evals.rows[1]["answer"]]
    top_reference = 1.0 if keys[0] == keys[1] else 0.5
    # group 1: "1", "1", "2", None -> 3 distinct; group 2: "1" -> 1; mean 2.0; "1" is 6 of 8; 1 of 8 no answer
    assert metrics == {"answers/distinct_per_group": 2.0, "answers/top_share": 0.75,
                       "answers/reference_top_share": top_reference, "answers/no_answer_share": 0.125}
