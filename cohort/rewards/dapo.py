"""``dapo_math``: DAPO's math scorer (verl's ``math_dapo``, the reward of the DAPO paper's DAPO-Math-17k and AIME runs).

The completion's answer is the text after the last ``Answer:`` (case-insensitive, to the
end of that line) within its last 300 characters; it and the ground truth are normalised the
same way (Minerva's normalisation as DAPO uses it):
- only what follows the last ``=`` is kept;
- spacing, articles, ``\\$``, ``mbox``, "and" between items are rewritten, and units and
  filler words (``degrees``, ``cm``, ``\\text{}``, ``^\\circ``, ``\\dots``, ...) removed;
- ``$…$`` keeps its inside; ``\\text{x}``, ``\\textbf{x}``, ``\\overline{x}``, ``\\boxed{x}``
  become ``x``; shorthand ``\\fracab`` becomes ``\\frac{a}{b}`` and ``\\sqrta`` ``\\sqrt{a}``;
- a number with thousands commas loses them; the result is stripped.
The score is 1.0 when the two normalised strings are equal, else -1.0 (a completion with no
``Answer:`` line scores -1.0). Strict as DAPO: ``1/2`` is not ``\\frac{1}{2}``.

It is one half of verl's DAPO reward manager (``reward_model.reward_manager=dapo``); the other,
the overlong buffer, is ``soft_overlong`` weighted by the penalty factor (cohort.rewards.format).
``verl_default`` routes DAPO's data sources (``math_dapo``, ``math``, ``math_dapo_reasoning``,
``aime*``) here, as verl's ``default_compute_score`` does. Left out: the strict-box variant
(``strict_box_verify``), which DAPO's recipes do not turn on.
"""

from __future__ import annotations

import re
from typing import Any

from cohort.rewards.reward_registry import Needs, register
from cohort.rewards.text import completion_texts, pick_column

TAIL_CHARS = 300  # DAPO looks only at the completion's last 300 characters
_ANSWER = re.compile(r"(?i)Answer\s*:\s*([^\n]+)")
# (old, new) rewrites, in this order, then removals: what DAPO's normalisation does to both strings
_REWRITES = (("an ", ""), ("a ", ""), (".$", "$"), ("\\$", ""), ("\\ ", ""), (" ", ""), ("mbox", "text"),
             (",\\text{and}", ","), ("\\text{and}", ","), ("\\text{m}", "\\text{}"))
_UNITS = ("square", "ways", "integers", "dollars", "mph", "inches", "hours", "km", "units", "\\ldots", "sue", "points",
          "feet", "minutes", "digits", "cents", "degrees", "cm", "gm", "pounds", "meters", "meals", "edges", "students",
          "childrentickets", "multiples")
_MARKUP = ("\\text{s}", "\\text{.}", "\\text{\ns}", "\\text{}^2", "\\text{}^3", "\\text{\n}", "\\text{}", r"\mathrm{th}",
           r"^\circ", r"^{\circ}", r"\;", r",\!", "{,}", '"', "\\dots")
_UNWRAP = tuple(re.compile(p) for p in (r"(\\text\{)(.*?)(\})", r"(\\textbf\{)(.*?)(\})", r"(\\overline\{)(.*?)(\})",
                                         r"(\\boxed\{)(.*)(\})"))
MATH_DAPO_SOURCES = ("math_dapo", "math", "math_dapo_reasoning")  # and every data_source starting with "aime"


def normalize_answer(text: str) -> str:
    """A final answer as DAPO compares it (the module docstring lists the steps)."""
    text = text.split("=")[-1]
    for old, new in _REWRITES:
        text = text.replace(old, new)
    for word in _UNITS + _MARKUP:
        text = text.replace(word, "")
    text = re.sub(r"(.*?)(\$)(.*?)(\$)(.*)", "$\\3$", text)
    for pattern in _UNWRAP:
        text = pattern.sub("\\2", text)
    text = re.sub(r"(frac)([^{])(.)", "frac{\\2}{\\3}", text)
    text = re.sub(r"(sqrt)([^{])", "sqrt{\\2}", text)
    text = text.replace("$", "")
    if text.replace(",", "").isdigit():
        text = text.replace(",", "")
    return text.strip()


def dapo_score(solution: str, ground_truth: Any) -> float:
    """1.0 when the last ``Answer:`` of the completion's tail matches the ground truth after normalising both, else -1.0."""
    found = _ANSWER.findall(solution[-TAIL_CHARS:])
    answer = normalize_answer(found[-1]) if found else None
    return 1.0 if answer is not None and answer == normalize_answer(str(ground_truth)) else -1.0


def is_dapo_source(source: Any) -> bool:
    return isinstance(source, str) and (source in MATH_DAPO_SOURCES or source.startswith("aime"))


class DapoMath:
    __name__ = "dapo_math"

    def __call__(self, *, completions: list[Any], **columns: Any) -> list[float]:
        truths = pick_column(columns, None, ("ground_truth",), reward="dapo_math")
        return [dapo_score(text, truth) for text, truth in zip(completion_texts(completions), truths)]


@register("dapo_math", needs=[Needs("the ground truth", None, ("ground_truth",))])
def dapo_math() -> DapoMath:
    """DAPO's math reward (verl's math_dapo): 1.0 when the last 'Answer: X' line matches the ground truth, else -1.0.

    Both are normalised as DAPO does (units, \\text{}, \\boxed{}, $...$ and thousands commas removed); only the
    completion's last 300 characters are read. Reads the column ground_truth (a verl parquet's
    reward_model.ground_truth). With the overlong buffer add soft_overlong (weight = the penalty factor).
    """
    return DapoMath()
