"""Shape rewards: ``think_format`` and ``soft_overlong``.

``think_format`` follows TRL's ``think_format_reward``: the completion starts with
``<think>``, has no second ``<think>``, and closes the block with ``</think>``; then,
unlike TRL, a non-blank answer must follow (``require_answer=False`` restores TRL's
behaviour exactly: ``"<think>x</think>"`` scores 1.0 there). Anything after the first
``</think>`` is the answer, as in TRL, so a stray second ``</think>`` is tolerated.
``opened_in_prompt=True`` is for chat templates that end the prompt with ``<think>``
(the completion then starts inside the block and must not open another one).

``soft_overlong`` is DAPO's soft overlong punishment (eq. 13), as TRL's
``get_soft_overlong_punishment``: with ``L = max_completion_length`` and
``C = cache_length``, a completion of ``n`` tokens scores 0 when ``n <= L - C``,
``(L - C - n) / C`` when ``L - C < n <= L`` (falling linearly from 0 to -1), and -1 when
``n > L``. Lengths come from ``completion_ids``.
"""

from __future__ import annotations

from typing import Any

from cohort.rewards.reward_registry import register
from cohort.rewards.text import completion_texts


class ThinkFormat:
    __name__ = "think_format"

    def __init__(self, open_tag: str, close_tag: str, require_answer: bool, opened_in_prompt: bool):
        if not open_tag or not close_tag:
            raise ValueError("think_format needs non-empty open_tag and close_tag")
        self.open_tag = open_tag
        self.close_tag = close_tag
        self.require_answer = require_answer
        self.opened_in_prompt = opened_in_prompt

    def well_formed(self, text: str) -> bool:
        if self.opened_in_prompt:
            body = text
        elif text.startswith(self.open_tag):
            body = text[len(self.open_tag) :]
        else:
            return False
        reasoning, closed, answer = body.partition(self.close_tag)
        if not closed or self.open_tag in reasoning:
            return False
        if self.open_tag in answer:  # TRL: no second opening tag anywhere
            return False
        return bool(answer.strip()) or not self.require_answer

    def __call__(self, *, completions: list[Any], **_: Any) -> list[float]:
        return [1.0 if self.well_formed(text) else 0.0 for text in completion_texts(completions)]


@register("think_format")
def think_format(
    *,
    open_tag: str = "<think>",
    close_tag: str = "</think>",
    require_answer: bool = True,
    opened_in_prompt: bool = False,
) -> ThinkFormat:
    """1.0 when the completion is `<think>reasoning</think>` followed by a non-blank answer, else 0.0.

    As TRL's think_format_reward (starts with the opening tag, no second one), plus the
    answer requirement; require_answer=False matches TRL exactly. opened_in_prompt=True
    when the chat template already put the opening tag at the end of the prompt.
    """
    return ThinkFormat(open_tag, close_tag, require_answer, opened_in_prompt)


class SoftOverlong:
    __name__ = "soft_overlong"

    def __init__(self, max_completion_length: int, cache_length: int):
        if not 0 <= cache_length <= max_completion_length:
            raise ValueError(
                f"soft_overlong needs 0 <= cache_length <= max_completion_length; "
                f"got cache_length={cache_length}, max_completion_length={max_completion_length}"
            )
        self.max_completion_length = int(max_completion_length)
        self.cache_length = int(cache_length)

    def penalty(self, length: int) -> float:
        soft_start = self.max_completion_length - self.cache_length
        if length <= soft_start:
            return 0.0
        if length <= self.max_completion_length:
            return (soft_start - length) / self.cache_length
        return -1.0

    def __call__(self, *, completion_ids: list[Any], **_: Any) -> list[float]:
        return [self.penalty(len(ids)) for ids in completion_ids]


@register("soft_overlong")
def soft_overlong(*, max_completion_length: int, cache_length: int) -> SoftOverlong:
    """DAPO's soft overlong punishment: 0 up to max_completion_length - cache_length tokens, then linear down to -1 at max_completion_length, -1 beyond.

    Matches TRL's get_soft_overlong_punishment(max_completion_len, soft_punish_cache).
    Lengths are len(completion_ids[i]).
    """
    return SoftOverlong(max_completion_length, cache_length)
