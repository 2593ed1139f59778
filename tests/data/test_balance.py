"""Training rows balanced by answer (cohort/data/balance.py, data.max_answer_share)."""

from __future__ import annotations

from collections import Counter

import pytest

from cohort.config import load_config
from cohort.config.schema import ConfigError
from cohort.data.balance import BalanceError, answer_cap, cap_answer_share
from cohort.data.datasets import DataError
from cohort.plan.run_environment import run_data


def rows_of(answers: str) -> list[dict]:
    return [{"prompt": f"q{i}", "answer": a} for i, a in enumerate(answers)]


def test_the_cap_is_the_largest_count_whose_share_stays_under_the_limit():
    # counts 1:6, 2:3, 3:1 and share 0.5: T=4 keeps 4+3+1 = 8 rows and 4/8 = 0.5 <= 0.5; T=5 keeps 5+3+1 = 9 and
    # 5/9 = 0.56 > 0.5. So at most 4 rows per answer.
    assert answer_cap({"1": 6, "2": 3, "3": 1}, 0.5) == 4
    # share 1/3 with three answers: only equal counts meet it, so every answer keeps as many as the rarest (1)
    assert answer_cap({"1": 6, "2": 3, "3": 1}, 1 / 3) == 1
    # share 1: nothing is cut (the cap is the largest count)
    assert answer_cap({"1": 6, "2": 3, "3": 1}, 1.0) == 6
    # 0.4 with counts 10, 10, 10, 1: T=10 keeps 31 rows, 10/31 = 0.32: nothing is cut
    assert answer_cap({"a": 10, "b": 10, "c": 10, "d": 1}, 0.4) == 10


def test_capped_rows_keep_each_answer_s_first_rows_in_order():
    rows = rows_of("1121131121")  # "1" x7 at 0,1,3,4,6,7,9; "2" x2 at 2,8; "3" x1 at 5
    # share 0.5: T=3 keeps 3+2+1 = 6 and 3/6 = 0.5; T=4 keeps 4+2+1 = 7 and 4/7 > 0.5. The first three "1" rows
    # (0, 1, 3) stay, the other four go.
    kept, note = cap_answer_share(rows, 0.5)
    assert [r["prompt"] for r in kept] == ["q0", "q1", "q2", "q3", "q5", "q8"]
    assert note == {"rows_before": 10, "rows_after": 6, "answers": 3, "rows_per_answer_cap": 3, "top_answer": "1",
                    "top_share_before": 0.7, "top_share_after": 0.5}


def test_answers_compare_as_stripped_text():
    kept, note = cap_answer_share([{"prompt": "a", "answer": 1}, {"prompt": "b", "answer": " 1"},
                                   {"prompt": "c", "answer": "2"}], 0.5)
    assert note["answers"] == 2 and [r["prompt"] for r in kept] == ["a", "c"]


def test_a_share_no_rows_can_meet_and_rows_without_answers_are_refused_with_the_fix():
    with pytest.raises(BalanceError, match=r"3 distinct answers, so an answer's share is at least 1/3 = 0.333; set it"):
        cap_answer_share(rows_of("1123"), 0.3)
    with pytest.raises(BalanceError, match="train row 1 has no 'answer'.*or set data.max_answer_share: null"):
        cap_answer_share([{"prompt": "a", "answer": "1"}, {"prompt": "b"}], 0.5)


def test_out_of_range_is_refused_by_the_config():
    for bad in (0, 1.5):
        with pytest.raises(ConfigError, match="max_answer_share"):
            load_config(None, [f"data.max_answer_share={bad}"])


def test_letter_counting_train_rows_are_capped_and_the_held_out_rows_stay():
    # reasoning-gym letter_counting, 3-5 words, seed 0: 60 held out, 200 train entries, none repeating a held-out
    # question. Train keys (as generated): "1" 112, "2" 55, "3" 22, "4" 9, "5" 1, "6" 1. Share 0.3: T=24 keeps
    # 24+24+22+9+1+1 = 81 rows and 24/81 = 0.296 <= 0.3; T=25 keeps 83 and 25/83 = 0.301 > 0.3. Held out: "1" 35, ...
    overrides = ["data.task=reasoning_gym:letter_counting", "data.task_config.min_words=3",
                 "data.task_config.max_words=5", "data.task_eval_size=60", "data.task_size=200",
                 "data.answer_format=last_number"]
    train, evals, _ = run_data(load_config(None, overrides))
    assert Counter(r["answer"] for r in train.rows) == Counter({"1": 112, "2": 55, "3": 22, "4": 9, "5": 1, "6": 1})
    capped, evals_capped, _ = run_data(load_config(None, overrides + ["data.max_answer_share=0.3"]))
    assert Counter(r["answer"] for r in capped.rows) == Counter({"1": 24, "2": 24, "3": 22, "4": 9, "5": 1, "6": 1})
    assert [r for r in train.rows if r["answer"] == "1"][:24] == [r for r in capped.rows if r["answer"] == "1"]
    assert [r["rg_index"] for r in evals_capped.rows] == [r["rg_index"] for r in evals.rows]
    assert len(capped.sources) == len(capped.rows)
    with pytest.raises(DataError, match="data.max_answer_share = 0.1: the train rows have"):
        run_data(load_config(None, overrides + ["data.max_answer_share=0.1"]))
