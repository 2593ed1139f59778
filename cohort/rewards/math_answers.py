"""``accuracy`` and ``reasoning_accuracy``: math answers checked with math-verify.

Behaviour follows TRL's ``accuracy_reward`` / ``reasoning_accuracy_reward``:
- the gold text is parsed with math-verify's default extraction (LaTeX, then plain
  expressions); if nothing parses, the row scores ``None`` (skipped);
- the completion is parsed with LaTeX extraction only, ``\\boxed{}`` first, an anchor
  required (no bare-expression fallback), units normalised, first match;
- the score is ``float(verify(gold, answer))``: 1.0 or 0.0;
- ``reasoning_accuracy`` first keeps only the text after the reasoning block: the
  delimiters (default ``["</think>"]``) are tried in order, the first one present
  splits the text and the part after its last occurrence is the answer; a completion
  with none of them scores 0.0 (incomplete reasoning is penalised, not skipped).

The gold column defaults to ``solution`` and falls back to ``answer``, then
``ground_truth`` (verl's column: a verl parquet's ``reward_model.ground_truth`` is read
as ``ground_truth``). A ``ground_truth`` holds the bare final answer (``\\frac{1}{2}``,
``72``), not a worked solution, so it is read as ``\\boxed{answer}``, as verl's
math-verify scorer does: bare, math-verify would miss ``\\sqrt{2}`` and read
``3\\sqrt{3}`` as 3.

Choices: math-verify is pure Python (sympy) and can be slow on long outputs, so rows
are checked in a pool of *spawned* worker processes shared by every math reward in
the process (started at the first call, stopped when the last user closes). There
math-verify's own timeouts work (they use ``signal.alarm``, which needs a main thread):
10 s to parse, 5 s to verify, as in TRL. A worker that dies (say, out of memory) fails
the call; the next call starts a fresh pool. The work is ``async`` (``acall``, awaited by
the RewardSet beside the other functions); calling the function from plain Python
returns the scores, as TRL's ``accuracy_reward(completions=..., solution=...)`` does.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import concurrent.futures.process
import multiprocessing
import os
import threading
from collections.abc import Sequence
from typing import Any

from cohort.rewards.calling import AsyncReward
from cohort.rewards.reward_registry import Needs, register
from cohort.rewards.text import completion_texts, pick_named_column

PARSING_TIMEOUT_S = 10
VERIFY_TIMEOUT_S = 5
GOLD_FALLBACKS = ("solution", "answer", "ground_truth")
BARE_ANSWER_COLUMNS = ("ground_truth",)  # verl's convention: the final answer alone


def verify_answer(text: str, gold: str) -> float | None:
    """One row, as TRL does it: None if the gold does not parse, else 1.0 / 0.0."""
    from latex2sympy2_extended import NormalizationConfig
    from math_verify import LatexExtractionConfig, parse, verify

    gold_parsed = parse(gold, parsing_timeout=PARSING_TIMEOUT_S)
    if len(gold_parsed) == 0:
        return None
    answer_config = LatexExtractionConfig(
        normalization_config=NormalizationConfig(units=True),
        boxed_match_priority=0,
        try_extract_without_anchor=False,
    )
    answer_parsed = parse(
        text, extraction_config=[answer_config], extraction_mode="first_match", parsing_timeout=PARSING_TIMEOUT_S
    )
    return float(verify(gold_parsed, answer_parsed, timeout_seconds=VERIFY_TIMEOUT_S))


def gold_text(gold: Any, *, bare: bool) -> str:
    """The text math-verify parses as the gold: a bare answer goes inside ``\\boxed{}`` (unless already boxed)."""
    text = "" if gold is None else str(gold)
    if bare and text.strip() and "\\boxed" not in text:
        return "\\boxed{" + text.strip().strip("$") + "}"
    return text


def _verify_chunk(rows: Sequence[tuple[str, str]]) -> list[float | None]:
    return [verify_answer(text, gold) for text, gold in rows]


def _quiet_worker() -> None:
    import logging

    for name in ("math_verify", "math_verify.parser", "math_verify.grader", "latex2sympy2_extended"):
        logging.getLogger(name).setLevel(logging.ERROR)
    import math_verify  # noqa: F401  (import once per worker, not per task)


class _SharedPool:
    """A spawned process pool shared by the math rewards of this process, ref-counted."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pool: concurrent.futures.ProcessPoolExecutor | None = None
        self._workers = 0
        self._users = 0

    def acquire(self, workers: int) -> None:
        with self._lock:
            self._users += 1
            self._workers = max(self._workers, workers)

    def release(self) -> None:
        with self._lock:
            self._users -= 1
            if self._users <= 0 and self._pool is not None:
                self._pool.shutdown(wait=False, cancel_futures=True)
                self._pool = None

    def _start(self) -> concurrent.futures.ProcessPoolExecutor:
        return concurrent.futures.ProcessPoolExecutor(
            max_workers=max(1, self._workers),
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_quiet_worker,
        )

    def submit(self, function: Any, *args: Any) -> concurrent.futures.Future:
        with self._lock:
            if self._pool is None:
                self._pool = self._start()
            try:
                return self._pool.submit(function, *args)
            except concurrent.futures.process.BrokenProcessPool:  # a worker died last time
                self._pool.shutdown(wait=False, cancel_futures=True)
                self._pool = self._start()
                return self._pool.submit(function, *args)


_POOL = _SharedPool()


def default_workers() -> int:
    return max(1, min(4, (os.cpu_count() or 2) // 2))


class PooledReward(AsyncReward):
    """A reward whose checks run in the shared pool: ``await self.map(fn, items)`` is ``[fn([item])[0] ...]``."""

    def __init__(self, num_workers: int | None):
        self.num_workers = num_workers or default_workers()
        self._acquired = False

    async def map(self, function: Any, items: Sequence[Any]) -> list[Any]:
        """``function(chunk) -> list`` over ``items`` in chunks, in the pool; results in order."""
        if not items:
            return []
        if not self._acquired:
            _POOL.acquire(self.num_workers)
            self._acquired = True
        chunk = max(1, -(-len(items) // (self.num_workers * 4)))
        pieces = [items[k : k + chunk] for k in range(0, len(items), chunk)]
        futures = [_POOL.submit(function, piece) for piece in pieces]
        results = await asyncio.gather(*(asyncio.wrap_future(f) for f in futures))
        return [value for scores in results for value in scores]

    def close(self) -> None:
        if self._acquired:
            self._acquired = False
            _POOL.release()


class MathAccuracy(PooledReward):
    """The callable behind ``accuracy`` and ``reasoning_accuracy``."""

    def __init__(self, name: str, gold_column: str | None, delimiters: Sequence[str] | None, num_workers: int | None):
        super().__init__(num_workers)
        self.__name__ = name
        self.gold_column = gold_column
        self.delimiters = list(delimiters) if delimiters is not None else None

    def answer_part(self, text: str) -> str | None:
        """The text after the reasoning block, or None when it never closed."""
        if self.delimiters is None:
            return text
        for delimiter in self.delimiters:
            if delimiter in text:
                return text.split(delimiter)[-1]
        return None

    async def acall(self, *, completions: list[Any], **columns: Any) -> list[float | None]:
        gold_name, golds = pick_named_column(columns, self.gold_column, GOLD_FALLBACKS, reward=self.__name__)
        if len(golds) != len(completions):
            raise ValueError(f"{len(golds)} gold answers for {len(completions)} completions")
        rewards: list[float | None] = [0.0] * len(completions)
        todo = []  # (row, answer text, gold text)
        for i, (text, gold) in enumerate(zip(completion_texts(completions), golds)):
            answer = self.answer_part(text)
            if answer is not None:
                todo.append((i, answer, gold_text(gold, bare=gold_name in BARE_ANSWER_COLUMNS)))
        scores = await self.map(_verify_chunk, [(a, g) for _, a, g in todo])
        for (i, _, _), score in zip(todo, scores):
            rewards[i] = score
        return rewards


GOLD_NEEDS = [Needs("the gold answer", "gold_column", GOLD_FALLBACKS)]


@register("accuracy", needs=GOLD_NEEDS)
def accuracy(*, gold_column: str | None = None, num_workers: int | None = None) -> MathAccuracy:
    """1.0 when math-verify finds the completion's answer equal to the gold, 0.0 if not, None when the gold does not parse.

    As TRL's accuracy_reward: LaTeX answers, \\boxed{} first. The gold column defaults
    to `solution`, then `answer`, then `ground_truth` (verl's; read as \\boxed{answer}).
    Runs in a shared pool of num_workers processes (default: half the CPUs, at most 4).
    """
    return MathAccuracy("accuracy", gold_column, None, num_workers)


@register("reasoning_accuracy", needs=GOLD_NEEDS)
def reasoning_accuracy(
    *,
    reasoning_delimiters: Sequence[str] = ("</think>",),
    gold_column: str | None = None,
    num_workers: int | None = None,
) -> MathAccuracy:
    """accuracy on the text after the reasoning block; 0.0 when the block never closes.

    As TRL's reasoning_accuracy_reward: the first delimiter present splits the text and
    the part after its last occurrence is checked.
    """
    if isinstance(reasoning_delimiters, str) or not reasoning_delimiters:
        raise ValueError("reasoning_delimiters must be a non-empty list of strings, e.g. ['</think>']")
    return MathAccuracy("reasoning_accuracy", gold_column, reasoning_delimiters, num_workers)
