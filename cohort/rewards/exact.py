"""``exact_match``: is the completion's text the gold text?

Choices:
- The completion's text (the last assistant message of a chat completion) and the gold are compared as strings after
  removing leading and trailing whitespace, nothing else: case, inner spaces and punctuation all count. A task whose
  answer is a long string (the built-in ``long_tail`` counts ``"120 121 122"``) needs this, where ``numeric_match``
  would read only the last number.
- The gold is a string or a number (``str()`` of it); a missing gold (``None``) gives ``None`` (the row is skipped).

Deliberately left out: normalisation beyond whitespace (use your own function, or ``numeric_match``/``accuracy`` for
numbers and maths).
"""

from __future__ import annotations

from typing import Any

from cohort.rewards.numeric import GOLD_FALLBACKS
from cohort.rewards.reward_registry import Needs, register
from cohort.rewards.text import completion_texts, pick_column


class ExactMatch:
    """The ``exact_match`` reward function (a picklable callable)."""

    def __init__(self, gold_column: str | None):
        self.gold_column = gold_column

    def __call__(self, *, completions: list[Any], **columns: Any) -> list[float | None]:
        golds = pick_column(columns, self.gold_column, GOLD_FALLBACKS, reward="exact_match")
        return [None if gold is None else float(text.strip() == str(gold).strip())
                for text, gold in zip(completion_texts(completions), golds, strict=True)]

    def read_answers(self, *, completions: list[Any], **columns: Any) -> list[str | None]:
        """Each completion's stripped text (cohort/rewards/answer_reading.py); an empty reply gives no answer."""
        return [text.strip() or None for text in completion_texts(completions)]

    def reference_answers(self, **columns: Any) -> list[str | None]:
        golds = pick_column(columns, self.gold_column, GOLD_FALLBACKS, reward="exact_match")
        return [None if gold is None else str(gold).strip() for gold in golds]


@register("exact_match", needs=[Needs("the gold answer", "gold_column", GOLD_FALLBACKS)])
def exact_match(*, gold_column: str | None = None) -> ExactMatch:
    """1.0 when the completion's text, stripped of surrounding whitespace, equals the gold's, else 0.0; None when the
    gold is missing. The gold column defaults to ``answer``, then ``solution``, then ``ground_truth``."""
    return ExactMatch(gold_column)
