"""``numeric_match``: is the number in the completion the gold number?

Choices:
- Numbers are read with one regular expression: an optional sign (``-``, ``+``, or
  the Unicode minus ``−``), digits with optional comma thousands separators
  (``1,234,567`` but not ``1,23``), an optional decimal part, an optional exponent
  (``1e-3``). A sign counts only when it does not follow a letter, digit or closing
  bracket, so ``5-3`` reads as 5 and 3, and ``x-7`` as 7. ``$1,234.50`` reads 1234.5.
- The completion's *last* number is its answer by default (``position="first"`` to
  change); ``answer_pattern`` narrows the search to the last match of a regex (its
  first group when it has one), e.g. ``r"\\\\boxed\\{([^}]*)\\}"`` or ``r"####(.*)"``.
- Gold is a number (int/float) or text; in text, the part after the last ``####``
  (GSM8K's convention) when present, then its last number. No number in the gold:
  ``None`` (the row is skipped). No number in the completion: 0.0.
- Comparison is exact on decimal values (``42 == 42.0 == 4.2e1``), or within
  ``rel_tol`` when that is set.

Deliberately left out: fractions (``3/4``), words ("seven"), units, LaTeX; use
``accuracy`` (math-verify) for those.
"""

from __future__ import annotations

import math
import numbers
import re
from decimal import Decimal, InvalidOperation
from fractions import Fraction
from typing import Any

from cohort.rewards.reward_registry import Needs, register
from cohort.rewards.text import completion_texts, pick_column

_NUMBER = re.compile(
    r"(?:(?<![\w)\]}])(?P<sign>[-+\u2212]))?"
    r"(?P<body>(?<![\d.])(?:\d{1,3}(?:,\d{3})+(?![\d])|\d+)(?:\.\d+)?|(?<![\d])\.\d+)"
    r"(?P<exp>[eE][-+]?\d+)?"
)

GOLD_FALLBACKS = ("answer", "solution", "ground_truth")
_MAX_EXPONENT = 400


def parse_numbers(text: str) -> list[Fraction]:
    """Every number in ``text``, in order, as an exact ``Fraction``."""
    values = []
    for match in _NUMBER.finditer(text):
        body = match.group("body").replace(",", "")
        sign = "-" if match.group("sign") in ("-", "\u2212") else ""
        exponent = match.group("exp") or ""
        if exponent and abs(int(exponent[1:])) > _MAX_EXPONENT:
            continue  # 1e999999999 would build a billion-digit integer
        try:
            values.append(Fraction(Decimal(sign + body + exponent)))
        except (InvalidOperation, ValueError, OverflowError):
            continue
    return values


def extract_number(text: str, *, position: str = "last", answer_pattern: str | None = None) -> Fraction | None:
    """The answer number of a completion, or ``None`` when there is none."""
    if answer_pattern is not None:
        matches = list(re.finditer(answer_pattern, text, flags=re.DOTALL))
        if not matches:
            return None
        last = matches[-1]
        text = last.group(1) if last.re.groups else last.group(0)
    found = parse_numbers(text)
    if not found:
        return None
    return found[-1] if position == "last" else found[0]


def gold_number(gold: Any) -> Fraction | None:
    """The gold number: a numeric value as is; in text, the last number after ``####``."""
    if gold is None or isinstance(gold, bool):
        return None
    if isinstance(gold, numbers.Integral):
        return Fraction(int(gold))
    if isinstance(gold, numbers.Real):
        value = float(gold)  # via repr, so 0.1 is one tenth, not its binary neighbour
        return Fraction(Decimal(repr(value))) if math.isfinite(value) else None
    text = str(gold)
    if "####" in text:
        text = text.rsplit("####", 1)[1]
    found = parse_numbers(text)
    return found[-1] if found else None


def number_text(value: Fraction | None) -> str | None:
    """A number's canonical text, equal for equal values: an integer plainly ("42"), else the exact fraction ("1/8")."""
    if value is None:
        return None
    return str(value.numerator) if value.denominator == 1 else f"{value.numerator}/{value.denominator}"


def numbers_equal(answer: Fraction, gold: Fraction, rel_tol: float) -> bool:
    if rel_tol == 0.0:
        return answer == gold
    return math.isclose(float(answer), float(gold), rel_tol=rel_tol)


class NumericMatch:
    """Callable built by ``numeric_match``; plain data, so it pickles."""

    __name__ = "numeric_match"

    def __init__(self, gold_column: str | None, position: str, answer_pattern: str | None, rel_tol: float):
        if position not in ("last", "first"):
            raise ValueError(f"numeric_match position must be 'last' or 'first', got {position!r}")
        if answer_pattern is not None:
            re.compile(answer_pattern)
        self.gold_column = gold_column
        self.position = position
        self.answer_pattern = answer_pattern
        self.rel_tol = float(rel_tol)

    def __call__(self, *, completions: list[Any], **columns: Any) -> list[float | None]:
        golds = pick_column(columns, self.gold_column, GOLD_FALLBACKS, reward="numeric_match")
        rewards: list[float | None] = []
        for text, gold in zip(completion_texts(completions), golds, strict=True):
            target = gold_number(gold)
            if target is None:
                rewards.append(None)
                continue
            answer = extract_number(text, position=self.position, answer_pattern=self.answer_pattern)
            rewards.append(1.0 if answer is not None and numbers_equal(answer, target, self.rel_tol) else 0.0)
        return rewards

    def read_answers(self, *, completions: list[Any], **columns: Any) -> list[str | None]:
        """Each completion's number as text (cohort/rewards/answer_reading.py): `"1.0"` and `"1"` read `"1"`."""
        return [number_text(extract_number(text, position=self.position, answer_pattern=self.answer_pattern))
                for text in completion_texts(completions)]

    def reference_answers(self, **columns: Any) -> list[str | None]:
        """Each row's gold number as text, in read_answers' form; None where the gold has no number."""
        golds = pick_column(columns, self.gold_column, GOLD_FALLBACKS, reward="numeric_match")
        return [number_text(gold_number(gold)) for gold in golds]


@register("numeric_match", needs=[Needs("the gold answer", "gold_column", GOLD_FALLBACKS)])
def numeric_match(
    *,
    gold_column: str | None = None,
    position: str = "last",
    answer_pattern: str | None = None,
    rel_tol: float = 0.0,
) -> NumericMatch:
    """1.0 when the completion's number equals the gold number, else 0.0; None when the gold has no number.

    Tolerant of formatting ("1,234", " 42.0", "-7", "$5"). The gold column defaults to
    ``answer``, then ``solution``, then ``ground_truth``; GSM8K's "... #### 72" reads 72.
    The completion's last number is its answer (``position="first"`` for the first);
    ``answer_pattern`` (a regex, first group if any) narrows where to look.
    """
    return NumericMatch(gold_column, position, answer_pattern, rel_tol)
