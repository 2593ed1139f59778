"""Training rows balanced by answer: ``data.max_answer_share`` caps the share of the train rows one reference answer
may hold, so that no constant answer is right on more than that share of the prompts the policy trains on.

Why: on a task whose answers are skewed (reasoning-gym's ``letter_counting`` with 3-5 words: the key is "1" for 57% of
the questions), GRPO pays a small model for the most common answer before it pays for the task; the policy learns to
say "1" (docs/environments.md, "Worked example"). With the share capped, a constant answer earns at most that share of
the reward, and the skill (an answer that depends on the question) pays more than any prior.

Choices:
- A cap by dropping, not a resampling: each answer keeps its first ``T`` rows in the rows' own order (the generation
  order for a reasoning-gym task; ``train.seed`` still orders them each epoch), with ``T`` the largest count for which
  ``T <= share * sum(min(count_a, T))``; answers rarer than ``T`` keep every row. Repeating the rare answers' rows
  instead would train on the same few questions many times; generating more rows (``data.task_size``) gives the cap
  more to choose from.
- Only the train rows: the held-out rows stay as generated, so the eval still measures the task as it comes.
- The answer is the row's ``answer`` column (a reasoning-gym task's key; a file's column of that name), compared as
  text after stripping spaces. Rows with no answer are refused (there is no share to cap).
- A share below 1 / (number of distinct answers) cannot be met (even equal counts give each answer 1 / k): refused
  with the smallest share that can.

Left out: balancing the held-out set, and weighting rewards by answer frequency instead of dropping rows.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

ANSWER_KEY = "answer"


class BalanceError(ValueError):
    """``data.max_answer_share`` cannot be applied to these rows; the message names the fix."""


def answer_cap(counts: dict[str, int], share: float) -> int:
    """The most rows any one answer may keep: the largest ``T`` with ``T <= share * sum(min(c, T) for c in counts)``.

    ``T`` at the largest count means no answer is cut. Raises BalanceError when even equal counts exceed ``share``."""
    if not 0 < share <= 1:
        raise BalanceError(f"data.max_answer_share = {share}: a share in (0, 1]; e.g. 0.25, or null for rows as generated")
    if not counts:
        raise BalanceError("data.max_answer_share: no training rows to balance")
    if share * len(counts) < 1:
        raise BalanceError(f"data.max_answer_share = {share}: the train rows have {len(counts)} distinct answers, so an "
                           f"answer's share is at least 1/{len(counts)} = {1 / len(counts):.3f}; set it to that or more")
    best = 0
    for cap in range(1, max(counts.values()) + 1):  # share * kept(T) - T is concave and 0 at T = 0: the caps that
        if cap > share * sum(min(c, cap) for c in counts.values()) + 1e-9:  # meet it are 1..best
            break
        best = cap
    return best


def cap_answer_share(rows: list[dict[str, Any]], share: float) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """(kept rows, a note): each answer keeps at most ``answer_cap`` of its rows, the first ones, order unchanged."""
    answers = [_answer(row, i) for i, row in enumerate(rows)]
    counts = Counter(answers)
    cap = answer_cap(dict(counts), share)
    seen: Counter = Counter()
    kept = []
    for row, answer in zip(rows, answers):
        seen[answer] += 1
        if seen[answer] <= cap:
            kept.append(row)
    top, top_count = counts.most_common(1)[0]
    note = {"rows_before": len(rows), "rows_after": len(kept), "answers": len(counts), "rows_per_answer_cap": cap,
            "top_answer": top, "top_share_before": top_count / len(rows), "top_share_after": min(top_count, cap) / len(kept)}
    return kept, note


def _answer(row: dict[str, Any], index: int) -> str:
    value = row.get(ANSWER_KEY)
    if value is None or str(value).strip() == "":
        raise BalanceError(f"data.max_answer_share: train row {index} has no {ANSWER_KEY!r} (the reference answer the cap "
                           f"counts); give every row an {ANSWER_KEY!r} column, or set data.max_answer_share: null")
    return str(value).strip()


def describe(note: dict[str, Any]) -> str:
    """The console line: what the cap did to the train rows."""
    return (f"data.max_answer_share: {note['rows_after']} of {note['rows_before']} train rows kept (at most "
            f"{note['rows_per_answer_cap']} per answer, {note['answers']} answers); the most common answer "
            f"{note['top_answer']!r} holds {note['top_share_after']:.0%} of them (was {note['top_share_before']:.0%})")
