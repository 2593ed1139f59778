"""RewardSet.submit + merge: scoring group by group gives the whole-batch call's outputs and metrics exactly."""

from __future__ import annotations

import math

import numpy as np

from cohort.rewards.calling import Scores
from cohort.rewards.reward_set import RewardEntry, RewardSet


def lengths(completions, **kwargs):
    # one score per completion, plus a per-row metric that is None for completions of even length
    return Scores([float(len(c)) for c in completions],
                  {"odd": [float(len(c)) if len(c) % 2 else None for c in completions]})


def sometimes(completions, **kwargs):
    return [None if c.startswith("x") else 0.5 * len(c) for c in completions]


COMPLETIONS = ["a", "bbb", "xx", "cccc", "xyz", "dd"]  # 3 groups of G=2


def test_merge_of_groups_equals_one_call_over_the_batch():
    for aggregation in ("sum_then_normalize", "normalize_then_sum"):
        rs = RewardSet([RewardEntry("len", lengths, 1.0), RewardEntry("half", sometimes, 2.0)], aggregation=aggregation)
        try:
            kw = lambda part: dict(prompts=["p"] * len(part), completions=part, completion_ids=[[1]] * len(part), group_size=2)
            whole = rs.score(**kw(COMPLETIONS))
            pending = [rs.submit(**kw(COMPLETIONS[k:k + 2])) for k in range(0, 6, 2)]
            merged = rs.merge([p.result() for p in pending])
        finally:
            rs.close()
        np.testing.assert_array_equal(merged.per_function, whole.per_function)
        np.testing.assert_array_equal(merged.total, whole.total)
        timing = {k for k in whole.metrics if k.startswith("timing/")}
        assert set(merged.metrics) == set(whole.metrics)
        for key in set(whole.metrics) - timing:
            assert merged.metrics[key] == whole.metrics[key] or (math.isnan(merged.metrics[key]) and math.isnan(whole.metrics[key])), key
        # by hand: len column 1,3,2,4,3,2 → mean 15/6 = 2.5; odd-length rows 1,3,3 → extra metric mean 7/3;
        # half column scores the rows not starting with x: 0.5, 1.5, 2.0, 1.0 → mean 1.25
        assert whole.metrics["rewards/len/mean"] == 2.5 and abs(whole.metrics["rewards/len/odd"] - 7 / 3) < 1e-15
        assert whole.metrics["rewards/half/mean"] == 1.25
