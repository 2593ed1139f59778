"""The built-in long_tail task: its answers, its disjoint fixed splits, and its length distribution."""

import math
import random
import re

from cohort.data.tasks import LONG_TAIL_ALPHA, LONG_TAIL_MAX_COUNT, get_task, long_tail_count

PROMPT = re.compile(r"^(\d{5})\.\.(\d{5})=$")


def answer_quantile(rows, q):
    """The smallest answer length L with at least a fraction q of the rows at or below it (the lower quantile)."""
    lengths = sorted(len(row["answer"]) for row in rows)
    return lengths[math.ceil(q * len(lengths)) - 1]


def test_every_answer_counts_from_the_prompts_first_number_to_the_next_hundred():
    task = get_task("long_tail")
    assert task.reward_specs == [{"name": "exact_match", "weight": 1.0}]
    for row in task.train_rows[:2000] + task.eval_rows:
        first, last = map(int, PROMPT.match(row["prompt"]).groups())
        assert last % 100 == 0 and last - 100 < first <= last  # the next multiple of 100 at or after the first
        assert row["answer"] == " ".join(str(n) for n in range(first, last + 1))
    assert get_task("long_tail").train_rows[:3] == task.train_rows[:3]  # deterministic


def test_splits_are_fixed_disjoint_and_only_ordered_by_the_seed():
    seed0, seed1 = get_task("long_tail", seed=0), get_task("long_tail", seed=1)
    assert (len(seed0.train_rows), len(seed0.eval_rows)) == (20_000, 200)
    assert seed0.eval_rows == seed1.eval_rows  # the held-out split does not depend on the seed
    assert sorted(r["prompt"] for r in seed0.train_rows) == sorted(r["prompt"] for r in seed1.train_rows)
    assert seed0.train_rows != seed1.train_rows
    eval_prompts = {r["prompt"] for r in seed0.eval_rows}
    assert len(eval_prompts) == 200 and not eval_prompts & {r["prompt"] for r in seed0.train_rows}


def test_answer_lengths_follow_the_truncated_power_law():
    # A count of n five-digit numbers is an answer of 6n - 1 characters. P(n >= k) = (k^-a - c) / (1 - c), a = 0.85,
    # c = 43^-a = 0.04094 (the redraw above 42):
    #   P(n >= 2) = (0.55478 - 0.04094) / 0.95906 = 0.5358, P(n >= 3) = (0.39309 - 0.04094) / 0.95906 = 0.3672:
    #     the median count is 2 -> 11 characters (and 46.4% of answers are one number, 5 characters);
    #   P(n >= 10) = (0.14125 - 0.04094) / 0.95906 = 0.1046, P(n >= 11) = (0.13031 - 0.04094) / 0.95906 = 0.0932:
    #     the 90th percentile count is 10 -> 59 characters;
    #   P(n >= 17) = (0.09000 - 0.04094) / 0.95906 = 0.0512: 5.1% of answers are over 100 characters (17 numbers,
    #     101); the 95th percentile count is 16 or 17 (P(n <= 16) = 0.9488, one standard error, 0.0016 at 20,000
    #     rows, from 0.95): this sample has it at 16 -> 95 characters;
    #   P(n >= 33) = (0.05121 - 0.04094) / 0.95906 = 0.0107, P(n >= 34) = (0.04993 - 0.04094) / 0.95906 = 0.0094:
    #     the 99th percentile count is 33 -> 197 characters; the longest answer is 42 numbers, 251 characters.
    assert (LONG_TAIL_ALPHA, LONG_TAIL_MAX_COUNT) == (0.85, 42)
    rows = get_task("long_tail", seed=0).train_rows
    assert [answer_quantile(rows, q) for q in (0.5, 0.9, 0.95, 0.99, 1.0)] == [11, 59, 95, 197, 251]
    assert sum(len(r["answer"]) == 5 for r in rows) / len(rows) == 0.4636  # population 0.4642
    assert sum(len(r["answer"]) > 100 for r in rows) / len(rows) == 0.0499  # population 0.0512


def test_count_draws_are_the_power_law_and_never_over_the_cap():
    rng = random.Random(0)
    counts = [long_tail_count(rng) for _ in range(50_000)]
    assert max(counts) == LONG_TAIL_MAX_COUNT and min(counts) == 1
    # P(n >= 2) = 0.5358 and P(n >= 17) = 0.0512 (derived above); 3 standard errors at 50,000 draws: 0.0067, 0.0030
    assert abs(sum(c >= 2 for c in counts) / len(counts) - 0.5358) < 0.0067
    assert abs(sum(c >= 17 for c in counts) / len(counts) - 0.0512) < 0.0030
