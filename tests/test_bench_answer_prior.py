"""bench/answer_prior.py's own readings of a breakdown (the rest is cohort eval's, tested with it)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location("answer_prior", Path(__file__).parents[1] / "bench" / "answer_prior.py")
answer_prior = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(answer_prior)


def test_accuracy_by_reference_and_chance_accuracy_are_hand_counted():
    answers, references = ["1", "1", "2", None], ["1", "2", "2", "3"]
    got = answer_prior.readings(answers, references)
    # references: "2" twice (answered "1" and "2": 1/2), "1" once (answered "1": 1/1), "3" once (no answer: 0)
    assert got["accuracy_by_reference"] == {"2": 0.5, "1": 1.0, "3": 0.0}
    # said "1" x2, "2" x1; references "1" x1, "2" x2, "3" x1: (2*1 + 1*2) / (4*4) = 0.25
    assert got["chance_accuracy"] == 0.25


def test_unseen_items_keep_the_questions_an_earlier_stage_never_asked():
    rows = [{"prompt": [{"role": "system", "content": "s"}, {"role": "user", "content": "gcd 4, 6"}]},
            {"prompt": [{"role": "user", "content": "gcd 20, 25"}]}, {"prompt": "gcd 21, 14"}, {"prompt": "gcd 3, 9"}]
    # the earlier stage asked "gcd 4, 6" (with the same system message) and "gcd 3, 9": rows 1 and 2 are unseen
    seen = set(answer_prior.questions([rows[0], {"prompt": [{"role": "user", "content": "gcd 3, 9"}]}]))
    keep, correct = answer_prior.unseen_items(rows, seen, ["2", "5", None, "3"], ["2", "5", "7", "3"])
    assert keep == [1, 2]
    assert correct.tolist() == [True, False]  # "5" == "5"; no answer read is wrong
    assert answer_prior.questions([rows[0]]) == ["s\ngcd 4, 6"]
