"""verl's reward contract, and ``verl_default``: verl's default scorer for GSM8K and MATH data.

verl calls a reward function once per sample,
``compute_score(data_source, solution_str, ground_truth, extra_info=None) -> float | dict``,
where a dict carries the score under ``score`` and anything else the user wants logged.
Such a function is used as is: it is recognised by its parameters (``data_source``,
``solution_str`` and ``ground_truth`` all present) or by ``contract: verl`` in its
reward spec, and ``VerlReward`` adapts it to the batch contract:
- one call per completion, all at once: ``async def`` calls gathered on the
  RewardSet's loop, plain ones on daemon threads, at most ``max_concurrency`` in flight;
- the arguments come from the dataset columns ``data_source``, ``ground_truth``
  (a verl parquet's ``reward_model.ground_truth``) and ``extra_info`` (None where a
  column is absent; ``ground_truth`` must be there), ``solution_str`` is the
  completion's text; the first three go by position (so ``contract: verl`` admits other
  names), ``extra_info`` by name when the function takes it, the spec's other options
  as keyword arguments;
- the result: a number, or a dict whose ``score`` is the reward and whose other
  numeric (or bool) keys become the metrics ``rewards/<name>/<key>`` (the mean over
  the completions that reported them); other keys are ignored. A call that raises
  fails naming its row.

``verl_default`` routes each row by ``data_source`` as verl's
``default_compute_score`` does, for the two families verl's examples start with:
- GSM8K (``openai/gsm8k``): the answer is the last ``#### <number>`` of the
  completion, commas and ``$`` removed; 1.0 when that string equals the ground
  truth, 0.0 otherwise (no ``####``: 0.0). Strict, as verl: ``72.0`` is not ``72``.
- MATH (``lighteval/MATH``, ``DigitalLearningGmbH/MATH-lighteval``,
  ``HuggingFaceH4/MATH-500``): math-verify, as verl's math-verify scorer: the gold is
  ``\\boxed{ground_truth}``, the completion is read with plain-expression and LaTeX
  extraction; 1.0 when equal, else 0.0. Checked in the shared process pool of
  ``accuracy``.
- DAPO's math (``math_dapo``, ``math``, ``math_dapo_reasoning``, ``aime*``): DAPO's
  ``Answer:`` scorer, 1.0 or -1.0 (``dapo_math``, cohort.rewards.dapo).
Any other ``data_source`` fails, naming it and the known ones. Left out: verl's
other families (PRIME math and code, geometry3k, sandbox code).
"""

from __future__ import annotations

import asyncio
import inspect
import math
import numbers
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from cohort.rewards.calling import AsyncReward, DaemonThreads, RewardRowError, Scores, async_implementation
from cohort.rewards.dapo import MATH_DAPO_SOURCES, dapo_score, is_dapo_source
from cohort.rewards.math_answers import PARSING_TIMEOUT_S, VERIFY_TIMEOUT_S, PooledReward
from cohort.rewards.reward_registry import Needs, Resolved, RewardFunction, instantiate, register
from cohort.rewards.text import completion_texts, pick_column

CONTRACTS = ("trl", "verl")
VERL_PARAMETERS = ("data_source", "solution_str", "ground_truth")
GSM8K_SOURCES = ("openai/gsm8k",)
MATH_SOURCES = ("lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500")
_GSM8K_ANSWER = re.compile(r"#### (-?[0-9.,]+)")


# -- the contract ------------------------------------------------------------------


def _call_signature(target: Any, kind: str) -> inspect.Signature | None:
    try:
        return inspect.signature(target.__call__ if kind == "class" else target)
    except (TypeError, ValueError):
        return None


def contract_of(resolved: Resolved, contract: str | None) -> str:
    """"verl" or "trl" for a resolved reward: ``contract`` when given, else read from its parameters."""
    if contract is not None and contract not in CONTRACTS:
        raise ValueError(f"contract must be one of {CONTRACTS} (or left out to read it from the signature), got {contract!r}")
    if resolved.kind == "builtin":
        if contract == "verl":
            raise ValueError(f"{resolved.name!r} is a built-in with the batch contract; contract: verl is for your own compute_score")
        return "trl"
    signature = _call_signature(resolved.target, resolved.kind)
    params = signature.parameters if signature is not None else {}
    if contract is None:
        return "verl" if all(p in params for p in VERL_PARAMETERS) else "trl"
    if contract == "verl" and signature is not None:
        names = [p for p in params if p != "self"]
        try:
            signature.bind(*([None] * 3 if resolved.kind == "function" else [None] * 4))
        except TypeError:
            raise ValueError(
                f"contract: verl calls {resolved.name}(data_source, solution_str, ground_truth, extra_info=None) once per "
                f"completion, but its parameters are {names}"
            ) from None
    return contract


def build(resolved: Resolved, options: Mapping[str, Any], contract: str | None) -> RewardFunction:
    """The reward function for a validated spec: as ``get`` builds it, or adapted from verl's contract."""
    if contract_of(resolved, contract) == "trl":
        return instantiate(resolved, options)
    if resolved.kind == "class":
        return VerlReward(resolved.target(**options), resolved.display_name, {})
    return VerlReward(resolved.target, resolved.display_name, options)


class VerlReward(AsyncReward):
    """A verl ``compute_score`` called once per completion, concurrently; see the module docstring."""

    def __init__(self, function: Callable[..., Any], name: str, options: Mapping[str, Any], max_concurrency: int = 32):
        self.function = function
        self.__name__ = name
        self.options = dict(options)
        self.max_concurrency = max_concurrency
        signature = _call_signature(function, "function")
        params = signature.parameters.values() if signature is not None else ()
        self._extra_info = any(p.name == "extra_info" or p.kind is p.VAR_KEYWORD for p in params)
        self._threads = DaemonThreads()

    async def acall(self, *, completions: list[Any], **columns: Any) -> Scores:
        n = len(completions)
        truths = pick_column(columns, None, ("ground_truth",), reward=self.__name__)
        sources = columns.get("data_source") or [None] * n
        extras = columns.get("extra_info") or [None] * n
        semaphore = asyncio.Semaphore(self.max_concurrency)
        calls = [self._one(i, semaphore, s, text, t, e)
                 for i, (s, text, t, e) in enumerate(zip(sources, completion_texts(completions), truths, extras))]
        return _scores(self.__name__, await asyncio.gather(*calls))

    async def _one(self, row: int, semaphore: asyncio.Semaphore, source, text, truth, extra) -> Any:
        args = (source, text, truth)  # by position: contract: verl allows other names
        kwargs = {"extra_info": extra, **self.options} if self._extra_info else dict(self.options)
        awaitable = async_implementation(self.function)
        async with semaphore:
            try:
                if awaitable is not None:
                    return await awaitable(*args, **kwargs)
                return await asyncio.get_running_loop().run_in_executor(self._threads, lambda: self.function(*args, **kwargs))
            except Exception as exc:  # noqa: BLE001 - re-raised naming the row
                raise RewardRowError(row, f"{type(exc).__name__}: {exc}") from exc

    def close(self) -> None:
        close = getattr(self.function, "close", None)
        if callable(close):
            close()


def _scores(name: str, results: Sequence[Any]) -> Scores:
    """verl results (numbers or dicts with ``score``) -> Scores with the dicts' numeric keys as metrics."""
    scores, metrics = [], {}
    for row, result in enumerate(results):
        if isinstance(result, Mapping):
            if "score" not in result:
                raise RewardRowError(row, f"{name} returned a dict without 'score' (keys {sorted(result)}); "
                                          f"verl's contract: a number, or a dict with the reward under 'score'")
            for key, value in result.items():
                if key != "score" and isinstance(value, (numbers.Real, bool)) and math.isfinite(float(value)):
                    metrics.setdefault(key, [None] * len(results))[row] = float(value)
            result = result["score"]
        scores.append(result)
    return Scores(scores, metrics)


# -- verl_default --------------------------------------------------------------------


def gsm8k_score(solution_str: str, ground_truth: Any) -> float:
    """1.0 when the last ``#### <number>`` (commas and $ removed) is the ground truth string, else 0.0."""
    found = _GSM8K_ANSWER.findall(solution_str)
    if not found:
        return 0.0
    return 1.0 if found[-1].replace(",", "").replace("$", "") == str(ground_truth) else 0.0


def math_score(solution_str: str, ground_truth: Any) -> float:
    """math-verify as verl's scorer calls it: gold ``\\boxed{ground_truth}``, answer by expression or LaTeX."""
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    gold = parse("\\boxed{" + str(ground_truth) + "}", extraction_config=[LatexExtractionConfig()],
                 parsing_timeout=PARSING_TIMEOUT_S)
    answer = parse(solution_str, extraction_config=[ExprExtractionConfig(), LatexExtractionConfig()],
                   parsing_timeout=PARSING_TIMEOUT_S)
    if not gold or not answer:
        return 0.0
    return float(verify(gold, answer, timeout_seconds=VERIFY_TIMEOUT_S))


def _math_chunk(rows: Sequence[tuple[str, Any]]) -> list[float]:
    scores = []
    for text, truth in rows:
        try:
            scores.append(math_score(text, truth))
        except Exception:  # noqa: BLE001 - as verl: a timeout or a parser failure scores 0
            scores.append(0.0)
    return scores


class VerlDefault(PooledReward):
    __name__ = "verl_default"

    async def acall(self, *, completions: list[Any], **columns: Any) -> list[float]:
        sources = pick_column(columns, None, ("data_source",), reward="verl_default")
        truths = pick_column(columns, None, ("ground_truth",), reward="verl_default")
        texts = completion_texts(completions)
        rewards = [0.0] * len(texts)
        math_rows = []
        for i, (source, text, truth) in enumerate(zip(sources, texts, truths)):
            if source in GSM8K_SOURCES:
                rewards[i] = gsm8k_score(text, truth)
            elif source in MATH_SOURCES:
                math_rows.append(i)
            elif is_dapo_source(source):
                rewards[i] = dapo_score(text, truth)
            else:
                raise RewardRowError(i, f"verl_default has no scorer for data_source {source!r}; it knows "
                                        f"{', '.join(GSM8K_SOURCES + MATH_SOURCES + MATH_DAPO_SOURCES)}, aime* "
                                        "(for others write a compute_score)")
        for i, score in zip(math_rows, await self.map(_math_chunk, [(texts[i], truths[i]) for i in math_rows])):
            rewards[i] = score
        return rewards


@register("verl_default", needs=[Needs("the data source", None, ("data_source",)), Needs("the ground truth", None, ("ground_truth",))])
def verl_default(*, num_workers: int | None = None) -> VerlDefault:
    """verl's default scorer, routed by data_source: GSM8K's '#### 72' (openai/gsm8k), MATH's answer checked with math-verify,
    or DAPO's 'Answer:' scorer (1 / -1).

    MATH sources: lighteval/MATH, DigitalLearningGmbH/MATH-lighteval, HuggingFaceH4/MATH-500. DAPO sources: math_dapo,
    math, math_dapo_reasoning, aime*.
    Reads the columns data_source and ground_truth (a verl parquet's reward_model.ground_truth);
    an unknown data_source fails naming it.
    """
    return VerlDefault(num_workers)
