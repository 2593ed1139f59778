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

``add_chat``: ``"What is a + b?"`` with a, b in 1..30 as one chat user turn, answer ``a + b``, scored by
``numeric_match`` (the last number in the completion). The task for a real pretrained instruct model, which answers in
prose of its own making (SmolLM2-135M-Instruct: ~25% greedy before training; ``examples/smollm2_add.yaml``). 900
problems (ordered pairs, so ``3 + 4`` and ``4 + 3`` are two); a fixed 200 held out, the other 700 train, ordered by the
seed.

``long_tail``: count up to the next hundred, ``"14797..14800="`` -> ``"14797 14798 14799 14800"`` (five-digit numbers,
one space apart), scored by ``exact_match``. A workload with a long tail of completion lengths, for partial rollouts
(``tiny:long_tail``, ``examples/long_tail.yaml``, docs/performance.md "The long tail"). Choices:
- The count ``n`` follows a power law truncated at 42 (``P(n >= k) = k^-0.85``, redrawn above 42): the median answer
  is 2 numbers (11 characters), 46% are one number, 5.1% are over 100 characters (17 numbers or more), the longest
  251 (252 tokens with eos, under a 256-token completion budget). tests/data/test_long_tail.py derives the quantiles.
- The stop is local (after a number ending in 00), so a small model can learn it; a first version counted from any
  ``a`` to any ``b`` and the tiny model never learned to compare the number it wrote with ``b``.
- A fixed 20,000-row train split of independent draws (short problems repeat as often as the distribution says:
  there are only 899 problems of each count) and 200 distinct held-out rows; both keep the count's distribution.
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


def _builtin_task(name: str, rows: Callable[[int], tuple[list[dict], list[dict]]], reward: str, description: str,
                  metadata: dict) -> None:
    """Register built-in task ``name``: ``rows(seed)`` gives its (train, eval) rows, scored by the one reward function
    ``reward``; ``description`` is completed with the split sizes (``{train}``, ``{held_out}``)."""

    @register_task(name)
    def build(seed: int) -> Task:
        train_rows, eval_rows = rows(seed)
        return Task(name=name, train_rows=train_rows, eval_rows=eval_rows, reward_specs=[{"name": reward, "weight": 1.0}],
                    description=description.format(train=len(train_rows), held_out=len(eval_rows)),
                    metadata=dict(metadata))


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


def arith_chat_rows(seed: int) -> tuple[list[dict], list[dict]]:
    """``arith_rows(seed)`` with each prompt as one chat user turn."""
    train_rows, eval_rows = arith_rows(seed)
    chat = [[{"prompt": [{"role": "user", "content": row["prompt"]}], "answer": row["answer"]} for row in rows]
            for rows in (train_rows, eval_rows)]
    return chat[0], chat[1]


ARITH_METADATA = {"max_first": ARITH_MAX_FIRST, "max_second": ARITH_MAX_SECOND, "max_answer_chars": 3}
_builtin_task("arith", arith_rows, "numeric_match", "Addition/subtraction of a one-digit number ('47+8=' -> '55', "
              "'47-8=' -> '39'); {train} train / {held_out} held-out prompts, answers >= 0.", ARITH_METADATA)
_builtin_task("arith_chat", arith_chat_rows, "numeric_match", "arith as one chat user turn ([{{'role': 'user', "
              "'content': '47+8='}}] -> '55'); {train} train / {held_out} held-out prompts.", ARITH_METADATA)


TOOL_CALC_SPLIT_KEY = "tool_calc-split-v1"


def tool_calc_rows(seed: int, eval_size: int = 200) -> tuple[list[dict], list[dict]]:
    """Disjoint (train, eval) rows for `a*b=` with a in 10..999 and b in 10..99 (answers of 3 to 5 digits); the eval
    split is fixed (it does not depend on `seed`), the seed orders the train rows."""
    train, evals = fixed_split([(a, b) for a in range(10, 1000) for b in range(10, 100)], TOOL_CALC_SPLIT_KEY, eval_size, seed)
    row = lambda a, b: {"prompt": [{"role": "user", "content": f"{a}*{b}="}], "answer": str(a * b)}  # noqa: E731
    return [row(a, b) for a, b in train], [row(a, b) for a, b in evals]


def fixed_split(problems: list, split_key: str, eval_size: int, seed: int) -> tuple[list, list]:
    """(train, eval) problems: the eval ones drawn by `split_key` alone (the same for every seed), the rest in the
    order `seed` gives."""
    problems = list(problems)
    random.Random(split_key).shuffle(problems)
    evals, train = problems[:eval_size], problems[eval_size:]
    random.Random(seed).shuffle(train)
    return train, evals


_builtin_task("tool_calc", tool_calc_rows, "numeric_match",
              "Multiplication of a 2-3 digit number by a 2 digit number as one chat user turn ('123*45=' -> '5535'), "
              "meant for multi-turn tool calling with cohort.tools.builtin.calculator (examples/tool_calc.yaml): the "
              "tiny model cannot multiply in its head, but can with the tool; {train} train / {held_out} held-out "
              "prompts.", {"max_answer_chars": 5})


ADD_CHAT_SPLIT_KEY = "add_chat-split-v1"
ADD_CHAT_OPERANDS = range(1, 31)  # a and b: 1..30
ADD_CHAT_EVAL_SIZE = 200


def add_chat_rows(seed: int, eval_size: int = ADD_CHAT_EVAL_SIZE) -> tuple[list[dict], list[dict]]:
    """Disjoint (train, eval) rows for "What is a + b?" (a, b in 1..30); the eval split is fixed (it does not depend on
    `seed`), the seed orders the train rows."""
    train, evals = fixed_split([(a, b) for a in ADD_CHAT_OPERANDS for b in ADD_CHAT_OPERANDS], ADD_CHAT_SPLIT_KEY, eval_size, seed)
    row = lambda a, b: {"prompt": [{"role": "user", "content": f"What is {a} + {b}?"}], "answer": str(a + b)}  # noqa: E731
    return [row(a, b) for a, b in train], [row(a, b) for a, b in evals]


_builtin_task("add_chat", add_chat_rows, "numeric_match",
              "Addition asked in words as one chat user turn ('What is 12 + 30?' -> '42'; a, b in 1..30), for a real "
              "instruct model that answers in prose (examples/smollm2_add.yaml); {train} train / {held_out} held-out "
              "prompts.", {"max_answer_chars": 2})


LONG_TAIL_SPLIT_KEY = "long_tail-split-v1"  # change only with the tiny:long_tail recipe
LONG_TAIL_ALPHA = 0.85  # tail index of the count's power law
LONG_TAIL_MAX_COUNT = 42  # 42 five-digit numbers: a 251-character answer, 252 tokens with eos
LONG_TAIL_HUNDREDS = range(101, 1000)  # the answer ends at 100 * h: 10100 .. 99900
LONG_TAIL_TRAIN_SIZE = 20_000
LONG_TAIL_EVAL_SIZE = 200


def long_tail_count(rng: random.Random, alpha: float = LONG_TAIL_ALPHA, max_count: int = LONG_TAIL_MAX_COUNT) -> int:
    """How many numbers one answer counts: ``floor(u ** (-1 / alpha))`` for ``u`` uniform on (0, 1], so
    P(n >= k) = k ** -alpha, redrawn above ``max_count`` (a power law truncated at ``max_count``)."""
    while True:
        count = int((1.0 - rng.random()) ** (-1.0 / alpha))
        if count <= max_count:
            return count


def long_tail_rows(seed: int, *, train_size: int = LONG_TAIL_TRAIN_SIZE,
                   eval_size: int = LONG_TAIL_EVAL_SIZE) -> tuple[list[dict], list[dict]]:
    """Disjoint (train, eval) rows for ``"a..b="`` -> ``"a a+1 ... b"``: five-digit numbers one space apart, ``b``
    the next multiple of 100 at or after ``a`` (so the rule is local: stop after a number ending in 00).

    Each row draws its count ``n`` (``long_tail_count``), then its hundred ``b`` uniformly, ``a = b - n + 1``. The
    eval rows are distinct and train rows never equal one: a row that would is given another hundred, never another
    count, so both splits keep the count's distribution exactly (there are only 899 problems of each count). Both
    splits come from a fixed key (they do not depend on ``seed``), so the tiny model's warm start never sees an eval
    row; ``seed`` orders the train rows."""
    split_rng = random.Random(LONG_TAIL_SPLIT_KEY)

    def draw(avoid: dict) -> tuple[int, int]:
        count = long_tail_count(split_rng)
        while (pair := (100 * (last := split_rng.choice(LONG_TAIL_HUNDREDS)) - count + 1, 100 * last)) in avoid:
            pass
        return pair

    held_out: dict[tuple[int, int], None] = {}  # (an ordered set)
    while len(held_out) < eval_size:
        held_out[draw(held_out)] = None
    train_pairs = [draw(held_out) for _ in range(train_size)]
    random.Random(seed).shuffle(train_pairs)
    return [_long_tail_row(*pair) for pair in train_pairs], [_long_tail_row(*pair) for pair in held_out]


def _long_tail_row(first: int, last: int) -> dict:
    return {"prompt": f"{first}..{last}=", "answer": " ".join(str(n) for n in range(first, last + 1))}


_builtin_task("long_tail", long_tail_rows, "exact_match",
              "Count up to the next hundred ('14797..14800=' -> '14797 14798 14799 14800'); the count follows a power "
              "law, so most answers are a few characters and about one in twenty is over a hundred (a long tail of "
              "completion lengths for partial rollouts, examples/long_tail.yaml); {train} train / {held_out} held-out "
              "prompts.", {"max_answer_chars": 6 * LONG_TAIL_MAX_COUNT - 1})
