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
