"""``reasoning_gym``: a reasoning-gym task's own ``score_answer`` on the answer read from the completion.

The task's spec (``cohort.data.reasoning_gym.build_task`` writes it) names the dataset once: ``task``, ``config``,
``seed``, ``size``; each row carries only ``rg_index``, and the reward rebuilds that entry from the dataset object
cached per process (entries are deterministic for (task, config, seed, index)). With ``data.task_train_config`` the
spec also holds ``train_config`` and ``eval_size``: entries below ``eval_size`` are built from ``config`` (the
held-out ones), the rest from ``train_config``. Choices:
- ``answer_format`` says where the answer is, for models that do or do not write reasoning-gym's tags:
  ``tags`` (default): the text of the last ``<answer>...</answer>`` (reasoning-gym's ``extract_answer``); no tags
  scores 0.0, as reasoning-gym scores it. ``last_line``: the tags when present, else the last non-empty line.
  ``last_number``: the tags when present, else the completion's last number as written (thousands commas dropped):
  for numeric tasks and a model that answers in a sentence.
- The score is the task's float in [0, 1] as is (some tasks give partial credit), or with ``credit: full``
  (``data.task_credit``) 1.0 at the full score and 0 below it; a scorer that raises gives 0.0 for that completion (a
  malformed answer is a wrong answer), never a crashed step.

Left out: the scorers' async variants and reasoning-gym's remote (server) scoring.
"""

from __future__ import annotations

import re
from typing import Any

from cohort.data.reasoning_gym import ANSWER_FORMATS, ROW_INDEX, rg_dataset
from cohort.rewards.numeric import _NUMBER
from cohort.rewards.reward_registry import Needs, register
from cohort.rewards.text import completion_texts

CREDITS = ("partial", "full")  # data.task_credit
_TAGS = re.compile(r"<answer>\s?(.*?)\s?</answer>", flags=re.DOTALL)  # reasoning_gym.utils.extract_answer's regex


def extract(text: str, answer_format: str) -> str | None:
    """The answer text of a completion as ``answer_format`` reads it (module docstring); None: no answer."""
    tagged = _TAGS.findall(text)
    if tagged:
        return tagged[-1].strip()
    if answer_format == "last_line":
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        return lines[-1] if lines else None
    if answer_format == "last_number":
        numbers = list(_NUMBER.finditer(text))
        return numbers[-1].group(0).replace(",", "") if numbers else None
    return None


class ReasoningGymScore:
    """Callable built by ``reasoning_gym``; holds the dataset's definition, not the dataset (so it pickles)."""

    __name__ = "reasoning_gym"
    # evals count a completion correct from this score on (cohort.trainer.evaluate): reasoning-gym's default scorer
    # gives len(answer key) / len(answer) when the key is inside the answer ("10" for the key "1" scores 0.5), so
    # correct is the task's full score
    correct_at = 1.0

    def __init__(self, task: str, config: dict[str, Any], seed: int, size: int, answer_format: str, credit: str = "partial",
                 train_config: dict[str, Any] | None = None, eval_size: int | None = None):
        if answer_format not in ANSWER_FORMATS:
            raise ValueError(f"reasoning_gym answer_format {answer_format!r}: choose one of {', '.join(ANSWER_FORMATS)}")
        if credit not in CREDITS:
            raise ValueError(f"reasoning_gym credit {credit!r}: choose one of {', '.join(CREDITS)}")
        self.task, self.config, self.seed, self.size, self.answer_format = task, dict(config), seed, size, answer_format
        self.credit = credit
        if (train_config is None) != (eval_size is None):
            raise ValueError("reasoning_gym: train_config and eval_size go together (the index below which entries are "
                             "the held-out config's)")
        self.train_config, self.eval_size = (None if train_config is None else dict(train_config)), eval_size

    def entries(self, indices) -> list[tuple[Any, dict]]:
        """(dataset, entry) at each of `indices`: held-out entries from `config`, train ones from `train_config` when
        set (each scored by its own dataset's score_answer)."""
        held_out = rg_dataset(self.task, self.config, self.seed, self.size)
        train = held_out if self.train_config is None else rg_dataset(self.task, self.train_config, self.seed, self.size)
        sources = [held_out if self.eval_size is None or int(i) < self.eval_size else train for i in indices]
        return [(dataset, dataset[int(i)]) for dataset, i in zip(sources, indices)]

    def __call__(self, *, completions: list[Any], **columns: Any) -> list[float]:
        if ROW_INDEX not in columns:
            raise ValueError(f"reward reasoning_gym needs the {ROW_INDEX!r} column of a reasoning_gym:<name> task's rows")
        return [self.score(dataset, text, entry)
                for text, (dataset, entry) in zip(completion_texts(completions), self.entries(columns[ROW_INDEX]), strict=True)]

    def read_answers(self, *, completions: list[Any], **columns: Any) -> list[str | None]:
        """The answer text each completion gives as `answer_format` extracts it, stripped (what score_answer gets, but
        for the whitespace: cohort/rewards/answer_reading.py); None: no answer, or an empty one."""
        return [(answer.strip() or None) if (answer := extract(text, self.answer_format)) is not None else None
                for text in completion_texts(completions)]

    def reference_answers(self, **columns: Any) -> list[str | None]:
        """Each row's entry's `answer`, stripped; None for the tasks without an answer key (boxnet, rush_hour ...)."""
        if ROW_INDEX not in columns:
            raise ValueError(f"reward reasoning_gym needs the {ROW_INDEX!r} column of a reasoning_gym:<name> task's rows")
        keys = [entry.get("answer") for _, entry in self.entries(columns[ROW_INDEX])]
        return [None if key is None else (str(key).strip() or None) for key in keys]

    def score(self, dataset: Any, text: str, entry: dict) -> float:
        answer = extract(text, self.answer_format)
        if answer is None:
            return 0.0
        try:
            score = float(dataset.score_answer(answer, entry))
        except Exception:  # a scorer that chokes on a malformed answer: a wrong answer
            return 0.0
        return score if self.credit == "partial" else float(score >= self.correct_at)


@register("reasoning_gym", needs=[Needs("the entry's index", None, (ROW_INDEX,))])
def reasoning_gym(*, task: str, config: dict | None = None, seed: int = 0, size: int, answer_format: str = "tags",
                  credit: str = "partial", train_config: dict | None = None, eval_size: int | None = None) -> ReasoningGymScore:
    """A reasoning-gym task's own score_answer (in [0, 1]) on the completion's answer, for `data.task: reasoning_gym:<name>`.

    The task writes this spec itself (task, config, seed, size of its dataset); rows carry `rg_index`.
    answer_format: `tags` (reasoning-gym's <answer>...</answer>; none scores 0), `last_line` or `last_number` (the
    tags when present, else the completion's last line / last number). credit: `partial` (the scorer's float as it is)
    or `full` (1.0 at the task's full score, else 0: data.task_credit). train_config, eval_size: the train entries'
    config (data.task_train_config) and the index from which entries are train entries.
    """
    return ReasoningGymScore(task, config or {}, seed, size, answer_format, credit, train_config, eval_size)
