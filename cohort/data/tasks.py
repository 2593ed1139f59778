"""Built-in verifiable tasks, generated offline from a seed.

A task is a train split, a held-out eval split and the reward functions that score
it; `cohort train` with no config runs GRPO on ``arith`` with the offline
``tiny:arith`` model (see ``cohort.models.tiny``).

``arith``: integer addition and subtraction of a one-digit number to or from a
number below 100, prompts like ``"47+8="`` with answer ``"55"``. Choices:
- Operands: ``a`` in 0..99, ``b`` in 0..9 (1,955 distinct problems; 300 held out).
  Two two-digit operands were tried first: the 1M-parameter tiny model needs
  thousands of steps to get past ~10% on them, far over a one-minute build,
  whereas ``a±b`` with one-digit ``b`` is learned within a few hundred steps, so
  an early-stopped warm start sits mid-way with headroom GRPO can use.
- Subtraction only pairs ``b <= a`` so every answer is a non-negative integer (no
  sign for a reward parser to misread); answers are 1 to 3 digits, unpadded.
- The prompt is the bare expression (no chat template, no spaces): one character
  per token with the character tokenizer, so a completion is at most 3 digits and
  an end-of-text token.
- The splits are disjoint by the ``(a, op, b)`` triple; the eval split has as
  many ``+`` as ``-`` rows, train is every remaining problem.
- The held-out problems are the same for every seed (a fixed split key), so the
  tiny model's warm start, trained on seed 0's train rows, has never seen the
  eval rows of any seed. The seed orders both splits (and picks the subset when
  ``train_size`` is given); the same seed gives the same rows on every machine
  (``random.Random``, no global state).

Rows carry only ``prompt`` and ``answer``; the ``numeric_match`` reward compares
the last number in a completion with ``answer``.

``arith_chat``: the same problems and splits as chat messages, one user turn
(``[{"role": "user", "content": "47+8="}]``), rendered by the model's chat template
(for the ``tiny:arith_chat`` model, whose tokenizer is a byte-level BPE with
ChatML special tokens: ``cohort.models.tiny_chat``). No system message: the
template decides whether to add one.

``tool_calc``: ``a*b=`` (a in 10..999, b in 10..99) as one chat user turn, for
multi-turn tool calling: the tiny model cannot multiply in its head but can call
a calculator (``tiny:tool_calc``, ``examples/tool_calc.yaml``, docs/tools.md).
A fixed 200-problem held-out split.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Callable

ARITH_MAX_FIRST = 99  # first operand: 0..99
ARITH_MAX_SECOND = 9  # second operand: 0..9
ARITH_EVAL_SIZE = 300
ARITH_SPLIT_KEY = "cohort-arith-split-v1"  # change only with the tiny model recipe


@dataclass(frozen=True)
class Task:
    """A built-in task: rows of ``{"prompt", "answer"}`` and its reward specs."""

    name: str
    train_rows: list[dict]
    eval_rows: list[dict]
    reward_specs: list[dict]
    description: str = ""
    metadata: dict = field(default_factory=dict)


TaskBuilder = Callable[[int], Task]
_TASK_BUILDERS: dict[str, TaskBuilder] = {}


def register_task(name: str) -> Callable[[TaskBuilder], TaskBuilder]:
    """Register ``builder(seed) -> Task`` under ``name``; a name registers once."""

    def decorator(builder: TaskBuilder) -> TaskBuilder:
        if name in _TASK_BUILDERS:
            raise ValueError(f"task {name!r} is already registered")
        _TASK_BUILDERS[name] = builder
        return builder

    return decorator


def list_tasks() -> list[str]:
    """Names of the built-in tasks, sorted."""
    return sorted(_TASK_BUILDERS)


def get_task(name: str, seed: int = 0) -> Task:
    """Build task ``name`` from ``seed``; unknown names fail with the valid ones."""
    if name not in _TASK_BUILDERS:
        raise ValueError(f"unknown task {name!r}; built-in tasks: {', '.join(list_tasks())}")
    return _TASK_BUILDERS[name](seed)


def arith_rows(
    seed: int,
    *,
    eval_size: int = ARITH_EVAL_SIZE,
    train_size: int | None = None,
    max_first: int = ARITH_MAX_FIRST,
    max_second: int = ARITH_MAX_SECOND,
) -> tuple[list[dict], list[dict]]:
    """Disjoint (train, eval) rows for ``a+b=`` and ``a-b=`` (``b <= a``).

    The eval split has as many ``+`` as ``-`` rows and does not depend on ``seed``
    (a fixed split), so a model warm-started on one seed's train rows never sees
    any seed's eval rows. Train is every other problem (or ``train_size`` of them),
    in an order the seed picks; the seed also orders the eval rows.
    """
    if eval_size % 2:
        raise ValueError(f"eval_size must be even (half + and half -); got {eval_size}")
    split_rng = random.Random(f"{ARITH_SPLIT_KEY}:{max_first}:{max_second}:{eval_size}")
    rng = random.Random(seed)
    train_triples: list[tuple[int, str, int]] = []
    eval_triples: list[tuple[int, str, int]] = []
    for op in ("+", "-"):
        triples = [
            (a, op, b)
            for a in range(max_first + 1)
            for b in range(max_second + 1)
            if op == "+" or b <= a
        ]
        if eval_size // 2 >= len(triples):
            raise ValueError(f"only {len(triples)} distinct {op!r} problems; eval_size {eval_size} leaves no train rows")
        split_rng.shuffle(triples)
        eval_triples += triples[: eval_size // 2]
        train_triples += triples[eval_size // 2 :]
    rng.shuffle(train_triples)
    rng.shuffle(eval_triples)
    if train_size is not None:
        if train_size > len(train_triples):
            raise ValueError(f"train_size {train_size} > the {len(train_triples)} problems left after eval")
        train_triples = train_triples[:train_size]
    return [_arith_row(*t) for t in train_triples], [_arith_row(*t) for t in eval_triples]


def _arith_row(a: int, op: str, b: int) -> dict:
    answer = a + b if op == "+" else a - b
    return {"prompt": f"{a}{op}{b}=", "answer": str(answer)}


@register_task("arith")
def _build_arith(seed: int) -> Task:
    train_rows, eval_rows = arith_rows(seed)
    return Task(
        name="arith",
        train_rows=train_rows,
        eval_rows=eval_rows,
        reward_specs=[{"name": "numeric_match", "weight": 1.0}],
        description=(
            f"Addition/subtraction of a one-digit number ('47+8=' -> '55', '47-8=' -> '39'); "
            f"{len(train_rows)} train / {len(eval_rows)} held-out prompts, answers >= 0."
        ),
        metadata={"max_first": ARITH_MAX_FIRST, "max_second": ARITH_MAX_SECOND, "max_answer_chars": 3},
    )


@register_task("arith_chat")
def _build_arith_chat(seed: int) -> Task:
    train_rows, eval_rows = arith_rows(seed)
    chat = [[{"prompt": [{"role": "user", "content": row["prompt"]}], "answer": row["answer"]} for row in rows]
            for rows in (train_rows, eval_rows)]
    return Task(
        name="arith_chat",
        train_rows=chat[0],
        eval_rows=chat[1],
        reward_specs=[{"name": "numeric_match", "weight": 1.0}],
        description=(
            f"arith as one chat user turn ([{{'role': 'user', 'content': '47+8='}}] -> '55'); "
            f"{len(chat[0])} train / {len(chat[1])} held-out prompts."
        ),
        metadata={"max_first": ARITH_MAX_FIRST, "max_second": ARITH_MAX_SECOND, "max_answer_chars": 3},
    )


TOOL_CALC_SPLIT_KEY = "tool_calc-split-v1"


def tool_calc_rows(seed: int, eval_size: int = 200) -> tuple[list[dict], list[dict]]:
    """Disjoint (train, eval) rows for `a*b=` with a in 10..999 and b in 10..99 (answers of 3 to 5 digits); the eval
    split is fixed (it does not depend on `seed`), the seed orders the train rows."""
    problems = [(a, b) for a in range(10, 1000) for b in range(10, 100)]
    random.Random(TOOL_CALC_SPLIT_KEY).shuffle(problems)
    evals, train = problems[:eval_size], problems[eval_size:]
    random.Random(seed).shuffle(train)
    row = lambda a, b: {"prompt": [{"role": "user", "content": f"{a}*{b}="}], "answer": str(a * b)}  # noqa: E731
    return [row(a, b) for a, b in train], [row(a, b) for a, b in evals]


@register_task("tool_calc")
def _build_tool_calc(seed: int) -> Task:
    train_rows, eval_rows = tool_calc_rows(seed)
    return Task(
        name="tool_calc",
        train_rows=train_rows,
        eval_rows=eval_rows,
        reward_specs=[{"name": "numeric_match", "weight": 1.0}],
        description=(
            "Multiplication of a 2-3 digit number by a 2 digit number as one chat user turn ('123*45=' -> '5535'), "
            "meant for multi-turn tool calling with cohort.tools.builtin.calculator (examples/tool_calc.yaml): the "
            f"tiny model cannot multiply in its head, but can with the tool; {len(train_rows)} train / "
            f"{len(eval_rows)} held-out prompts."
        ),
        metadata={"max_answer_chars": 5},
    )

