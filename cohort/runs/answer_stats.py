"""What a held-out accuracy is worth: the answers' side of an eval, in pure functions over lists.

A small model under GRPO finds the answer prior first (the most common answer is right more often than anything else
it samples), so an accuracy is read against what a constant answer scores on the same items. Everything here takes
answers already read the way the task's scorer reads them (cohort/rewards/answer_reading.py) and returns numbers:

- `ranked(values)`: (answer, count) pairs, most common first; **ties go to the smaller text** (plain string order), so
  a breakdown never depends on the order of the held-out items. None (no answer, no reference) is never ranked.
- `constant_baseline(references)`: the best constant answer and its accuracy: the most common reference answer's share
  of the items that have one. A constant answer is right exactly on the items whose reference it equals, so no other
  constant scores more (under the scorer's reading: answers are compared in its canonical text).
- `common_answers(references, top=2)`: the `top` most common references (`ranked`'s order, ties included by text
  order); `beyond_common(references, correct, top=2)`: the accuracy on the items whose reference is **not** one of
  them, and how many such items there are ("beyond the two most common answers"). Items without a reference are in
  neither set. Accuracy there is what a model can only get by answering the question, not by saying the prior.
- `chance_accuracy(answers, references, items)`: what the model's answers score on `items` if they ignored the
  question: the model's answers over every item with a reference dealt out to the items at random, so item i is right
  with probability p(reference of i), p(a) = the share of the items with a reference that the model answered a;
  averaged over `items` (all items with a reference by default). A balanced guess scores the constant answer's share
  or better beyond the common answers without reading anything: accuracy there means the question was read only when
  it is above this. `above_chance(accuracy, chance, n)`: above by more than two binomial standard errors,
  2 sqrt(c (1 - c) / n) (about 7 points at c = 15%, n = 100).
- `by_reference(answers, references, correct, top=5)`: for the `top` most common references, `[answer, items,
  accuracy, said]`: the accuracy on the items with that reference beside the share of all items the model answered it
  (`said`). The two equal, reference by reference, is a model answering without the question.
- `answer_distribution(answers, top=5)`: the model's answers as `{"top": [[answer, count], ...], "distinct": n,
  "no_answer": m}` (`distinct` counts answers given, the no-answer case not among them).
- `pass_at_k(n, c, k)`: Chen et al. 2021's unbiased estimator 1 - C(n-c, k) / C(n, k) from n samples of which c are
  correct, in its product form (no large binomials); `mean_pass_at_k(correct, k)` averages it over items.
- `group_answer_metrics(answers, references, group_size)`: the training-time signals (answers/distinct_per_group,
  answers/top_share, answers/reference_top_share, answers/no_answer_share) of one generation batch.
- `gain_line(before, after)`: the one line a user reads ("+20.7 points; beyond the two most common answers: -4.3");
  `eval_line(record)`: one eval in one line (`eval_parts`: its parts, as the training console prints them).

Left out: significance tests (a held-out set of 300 gives about ±3 points of binomial noise at 50%: docs/runs.md).
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Sequence

COMMON_TOP = 2  # "beyond the two most common answers"
DISTRIBUTION_TOP = 5
BY_REFERENCE_SHOWN = 3  # the console's; the record keeps DISTRIBUTION_TOP


def ranked(values: Sequence[str | None]) -> list[tuple[str, int]]:
    """(value, count) of the non-None values, most common first, ties in string order."""
    counts = Counter(v for v in values if v is not None)
    return sorted(counts.items(), key=lambda item: (-item[1], item[0]))


def constant_baseline(references: Sequence[str | None]) -> tuple[str | None, float]:
    """The best constant answer and its accuracy over the items with a reference; (None, nan) when none has one."""
    order = ranked(references)
    if not order:
        return None, math.nan
    answer, count = order[0]
    return answer, count / sum(c for _, c in order)


def common_answers(references: Sequence[str | None], top: int = COMMON_TOP) -> list[str]:
    """The `top` most common reference answers (ties: the smaller text first)."""
    return [answer for answer, _ in ranked(references)[:top]]


def beyond_common(references: Sequence[str | None], correct: Sequence[float], top: int = COMMON_TOP) -> tuple[float, int]:
    """(accuracy, items) on the items whose reference is not among the `top` most common; NaN entries of `correct`
    (unscored) are left out; (nan, 0) when no item is beyond them."""
    if len(references) != len(correct):
        raise ValueError(f"{len(references)} references for {len(correct)} scores")
    scores = [float(correct[i]) for i in beyond_items(references, top) if not math.isnan(float(correct[i]))]
    return (sum(scores) / len(scores), len(scores)) if scores else (math.nan, 0)


def chance_accuracy(answers: Sequence[str | None], references: Sequence[str | None],
                    items: Sequence[int] | None = None) -> float:
    """The accuracy on `items` (indices; default every item with a reference) of the model's answers dealt out at random
    over the items with a reference (module docstring); nan when there is no such item."""
    referenced, said = _said(answers, references)
    chosen = referenced if items is None else [i for i in items if references[i] is not None]
    if not chosen:
        return math.nan
    return sum(said[references[i]] for i in chosen) / (len(referenced) * len(chosen))


def _said(answers: Sequence[str | None], references: Sequence[str | None]) -> tuple[list[int], Counter]:
    """(the indices of the items with a reference, how often the model gave each answer on them)."""
    referenced = [i for i, r in enumerate(references) if r is not None]
    return referenced, Counter(answers[i] for i in referenced if answers[i] is not None)


def above_chance(accuracy: float, chance: float, items: int) -> bool:
    """Whether `accuracy` on `items` items beats `chance` by more than two binomial standard errors."""
    if items <= 0 or math.isnan(accuracy) or math.isnan(chance):
        return False
    return accuracy - chance > 2.0 * math.sqrt(chance * (1.0 - chance) / items)


def beyond_items(references: Sequence[str | None], top: int = COMMON_TOP) -> list[int]:
    """The indices of the items whose reference is not among the `top` most common (items without one left out)."""
    common = set(common_answers(references, top))
    return [i for i, r in enumerate(references) if r is not None and r not in common]


def by_reference(answers: Sequence[str | None], references: Sequence[str | None], correct: Sequence[float],
                 top: int = DISTRIBUTION_TOP) -> list[list]:
    """[answer, items, accuracy, said] for the `top` most common references (module docstring); accuracy over the
    scored items (NaN entries of `correct` left out), said over every item with a reference."""
    referenced, said = _said(answers, references)
    rows = []
    for answer, count in ranked(references)[:top]:
        scores = [float(correct[i]) for i in referenced if references[i] == answer and not math.isnan(float(correct[i]))]
        rows.append([answer, count, sum(scores) / len(scores) if scores else math.nan, said[answer] / len(referenced)])
    return rows


def answer_distribution(answers: Sequence[str | None], top: int = DISTRIBUTION_TOP) -> dict:
    """{"top": [[answer, count], ...] (at most `top`), "distinct": answers given, "no_answer": completions without one}."""
    order = ranked(answers)
    return {"top": [[answer, count] for answer, count in order[:top]], "distinct": len(order),
            "no_answer": sum(1 for a in answers if a is None)}


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c correct: 1 - C(n-c, k)/C(n, k) = 1 - prod_{i=n-c+1}^{n} (1 - k/i)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n; got n={n}, c={c}, k={k}")
    if n - c < k:  # every draw of k contains a correct sample
        return 1.0
    product = 1.0
    for i in range(n - c + 1, n + 1):
        product *= 1.0 - k / i
    return 1.0 - product


def mean_pass_at_k(correct: Sequence[Sequence[float]], k: int) -> float:
    """pass@k averaged over items; `correct` holds one row of 0/1 (NaN: unscored, left out) per item; nan with no item."""
    values = []
    for row in correct:
        scored = [float(c) for c in row if not math.isnan(float(c))]
        if len(scored) >= k:
            values.append(pass_at_k(len(scored), int(sum(scored)), k))
    return sum(values) / len(values) if values else math.nan


def group_answer_metrics(answers: Sequence[str | None], references: Sequence[str | None], group_size: int) -> dict[str, float]:
    """One batch's answer signals; consecutive runs of `group_size` completions are one prompt's group.

    answers/distinct_per_group: mean over groups of the distinct answers given (no answer counts as one more value);
    answers/top_share: the most common answer's share of all completions; answers/reference_top_share: the most
    common reference's share (rows counted once per completion, as the batch holds them); answers/no_answer_share."""
    n = len(answers)
    if n == 0:
        return {}
    groups = [answers[i:i + group_size] for i in range(0, n, group_size)]
    top = ranked(answers)
    top_ref = ranked(references)
    return {
        "answers/distinct_per_group": sum(len(set(g)) for g in groups) / len(groups),
        "answers/top_share": top[0][1] / n if top else 0.0,
        "answers/reference_top_share": top_ref[0][1] / n if top_ref else math.nan,
        "answers/no_answer_share": sum(1 for a in answers if a is None) / n,
    }


def _points(before: float | None, after: float | None) -> str:
    if before is None or after is None or math.isnan(before) or math.isnan(after):
        return "n/a"
    return f"{(after - before) * 100:+.1f}"


def gain_line(before: dict, after: dict) -> str:
    """'+20.7 points; beyond the two most common answers: -4.3' from two eval records (`evaluate`'s), and whether the
    accuracy beyond them after is above what its answers score if they ignored the question ('..., after training at
    chance (14.9%; 16.0% if its answers ignored the question)'); the second half says why it is absent when the task's answers
    cannot be read."""
    line = f"{_points(before.get('accuracy'), after.get('accuracy'))} points"
    if "beyond_common_accuracy" not in after:
        return f"{line}; no answer breakdown: {after.get('breakdown_missing', 'not measured')}"
    line += (f"; beyond the two most common answers: "
             f"{_points(before.get('beyond_common_accuracy'), after.get('beyond_common_accuracy'))}")
    verdict = chance_verdict(after.get("beyond_common_accuracy"), after.get("beyond_common_chance"),
                             after.get("beyond_common_prompts"))
    return f"{line}, after training {verdict}" if verdict else line


def chance_verdict(accuracy, chance, items) -> str:
    """'above chance (30.0%; 16.0% if its answers ignored the question)' or 'at chance (...)'; '' when a value is missing
    (a record written before the chance fields)."""
    if any(value is None for value in (accuracy, chance, items)) or math.isnan(accuracy) or math.isnan(chance):
        return ""
    word = "above chance" if above_chance(accuracy, chance, items) else "at chance"
    return f"{word} ({accuracy:.1%}; {chance:.1%} if its answers ignored the question)"


def _percent(value) -> str:
    return "n/a" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.1%}"


def _answers_text(distribution: dict) -> str:
    top = ", ".join(f'"{answer}" x{count}' for answer, count in distribution.get("top", []))
    none = f", no answer x{distribution['no_answer']}" if distribution.get("no_answer") else ""
    return f"{top or 'none'}{none} ({distribution.get('distinct', 0)} distinct)"


def eval_line(record: dict) -> str:
    """One eval record (`evaluate`'s, eval.jsonl's) in one line (`eval_parts` joined by "; ")."""
    return "; ".join(eval_parts(record))


def tool_part(tools: dict) -> str:
    """A tools eval's calls in one part: calls per trajectory, the share in the template's tags and the other forms,
    ignored calls, the share whose answer used a result, the statuses ("tool calls 1.00 per trajectory, 0% tagged
    (fenced 38, bare 2), 0 ignored, 95% answered with a result; status ok 100%")."""
    forms = ", ".join(f"{form} {tools[f'call_forms/{form}']:g}" for form in ("fenced", "bare")
                      if tools.get(f"call_forms/{form}"))
    statuses = ", ".join(f"{key[len('status/'):]} {_percent(value)}" for key, value in tools.items()
                         if key.startswith("status/") and value)
    return (f"tool calls {tools.get('call_frequency', 0.0):.2f} per trajectory, {_percent(tools.get('tagged_share', 0.0))} "
            f"tagged{f' ({forms})' if forms else ''}, {tools.get('ignored_calls', 0.0):g} ignored, "
            f"{_percent(tools.get('used_result', 0.0))} answered with a result; status {statuses or 'none'}")


def eval_parts(record: dict) -> list[str]:
    """One eval record (`evaluate`'s, eval.jsonl's) as the console says it, a short part each (the training console
    prints the first after its label and each other on an indented line of its own): the accuracy, the constant
    answer's, its answers' chance accuracy, the accuracy beyond the two most common answers (at or above chance), the
    accuracy on each of the three most common references beside how often the model says it, a tools run's calls
    (`tool_part`), pass@k, the model's most common answers."""
    parts = [f"accuracy {_percent(record.get('accuracy'))} on {record.get('num_prompts')} held-out prompts"]
    if "constant_accuracy" in record:
        common = ", ".join(f'"{a}"' for a in record.get("common_answers", []))
        parts.append(f'constant answer "{record["constant_answer"]}": {_percent(record["constant_accuracy"])}')
        if "chance_accuracy" in record:
            parts.append(f"if its answers ignored the question: {_percent(record['chance_accuracy'])}")
        verdict = chance_verdict(record.get("beyond_common_accuracy"), record.get("beyond_common_chance"),
                                 record.get("beyond_common_prompts"))
        parts.append(f"beyond the two most common answers ({common}; {record.get('beyond_common_prompts')} prompts): "
                     + (verdict or _percent(record.get("beyond_common_accuracy"))))
        if record.get("by_reference"):
            shown = ", ".join(f'"{answer}" {_percent(accuracy)} vs {_percent(said)}'
                              for answer, _, accuracy, said in record["by_reference"][:BY_REFERENCE_SHOWN])
            parts.append(f"right on each reference vs how often it says it: {shown}")
    elif "breakdown_missing" in record:
        parts.append(f"no answer breakdown: {record['breakdown_missing']}")
    if record.get("tools"):
        parts.append(tool_part(record["tools"]))
    passes = sorted((key for key in record if key.startswith("pass@")), key=lambda key: int(key[5:]))
    if passes:
        values = ", ".join(f"{key} {_percent(record[key])}" for key in passes)
        parts.append(f"{values} ({record.get('pass_samples')} samples at T={record.get('pass_temperature'):g})")
    if "answers" in record:
        parts.append(f"answers: {_answers_text(record['answers'])}")
    return parts
