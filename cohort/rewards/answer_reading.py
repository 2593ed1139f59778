"""Which answer a completion gives, as the task's scorer reads it: the one seam the eval's answer breakdown and the
training diagnostics read answers through.

A reward function that can say it exposes two methods (the built-ins `numeric_match`, `exact_match` and
`reasoning_gym` do; your own function may too):

    fn.read_answers(completions=[...], **columns) -> list[str | None]   # each completion's answer; None: it gives none
    fn.reference_answers(**columns) -> list[str | None]                 # each row's reference answer; None: no reference

Both return the scorer's canonical text, the form in which it compares an answer with the reference, so that equal
texts are what the scorer counts as the same answer: `numeric_match` the number (`"1.0"` and `"1"` are both `"1"`),
`exact_match` the stripped text, `reasoning_gym` the text its `answer_format` extracts, stripped, and the entry's
`answer` (what the task's `score_answer` compares with). The columns are the dataset's, one list entry per row, as
reward functions get them.

`answer_reader(rewards)` finds the reader: the *first* reward function (the one the eval counts as the task's
correctness check, cohort/trainer/evaluate.py), or `Unreadable(reason)` saying why there is no breakdown (the first
function does not expose its answers, e.g. math-verify's `accuracy`, whose equivalence is no text).

Left out: answers of multi-turn episodes beyond the final text (a tool's result is not read).
"""

from __future__ import annotations

from typing import Any, NamedTuple, Protocol, Sequence, runtime_checkable

from cohort.runs.answer_stats import group_answer_metrics


@runtime_checkable
class AnswerReader(Protocol):
    def read_answers(self, *, completions: list[Any], **columns: Any) -> list[str | None]: ...

    def reference_answers(self, **columns: Any) -> list[str | None]: ...


class Unreadable(NamedTuple):
    """Why a task's answers cannot be read (a breakdown's absence, said in one line)."""

    reason: str


def answer_reader(rewards: Any) -> AnswerReader | Unreadable:
    """The reward set's first function when it reads answers, else why not."""
    functions = list(getattr(rewards, "functions", None) or [])
    names = list(getattr(rewards, "names", None) or [])
    if not functions:
        return Unreadable("no reward function")
    first = functions[0]
    if isinstance(first, AnswerReader):
        return first
    name = names[0] if names else getattr(first, "__name__", type(first).__name__)
    return Unreadable(f"the first reward function ({name}) does not say which answer a completion gives "
                      "(read_answers / reference_answers: cohort/rewards/answer_reading.py)")


def read_pairs(reader: AnswerReader, completions: Sequence[Any], columns: dict[str, list]) -> tuple[list, list]:
    """(answers, references) for these completions and their rows' columns (one entry per completion)."""
    answers = list(reader.read_answers(completions=list(completions), **columns))
    references = list(reader.reference_answers(**columns))
    if len(answers) != len(completions) or len(references) != len(completions):
        raise ValueError(f"an answer reader returned {len(answers)} answers and {len(references)} references for "
                         f"{len(completions)} completions")
    return answers, references


def batch_answer_metrics(reader: AnswerReader | Unreadable, data: Any, rows: Sequence[int], texts: Sequence[str],
                         group_size: int) -> dict[str, float]:
    """A generation batch's answers/* metrics (cohort/runs/answer_stats.py's `group_answer_metrics`) from the completion
    texts and their rows in `data` (a PromptDataset: `rows`, `columns`, `prompt_key`); {} when answers are unreadable."""
    if isinstance(reader, Unreadable) or not texts:
        return {}
    picked = [data.rows[i] for i in rows]
    completions = [[{"role": "assistant", "content": t}] if isinstance(row[data.prompt_key], list) else t
                   for row, t in zip(picked, texts, strict=True)]
    answers, references = read_pairs(reader, completions, {c: [row.get(c) for row in picked] for c in data.columns})
    return group_answer_metrics(answers, references, group_size)
