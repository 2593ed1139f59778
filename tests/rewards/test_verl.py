"""verl compatibility: the gold in `ground_truth`, verl's per-sample contract, and `verl_default`."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from cohort.data.datasets import load_prompt_dataset
from cohort.rewards import RewardEntry, RewardError, RewardSet, get, validate_spec
from cohort.rewards.verl import VerlReward

pytest.importorskip("math_verify")

# -- user functions with verl's contract (module level: specs name them by import path) --------------------------

CALLS: list[tuple] = []
THREADS: set[int] = set()


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    """verl-style: a dict with the score and extra keys, the numeric ones logged."""
    CALLS.append((data_source, solution_str, ground_truth, extra_info))
    correct = solution_str.strip().endswith(str(ground_truth))
    return {"score": 1.0 if correct else -1.0, "acc": correct, "length": len(solution_str), "pred": solution_str[-2:]}


def slow_score(data_source, solution_str, ground_truth, extra_info=None):
    THREADS.add(threading.get_ident())  # alive together, so distinct
    time.sleep(0.3)
    return 0.5


async def async_score(data_source, solution_str, ground_truth, extra_info=None, bonus=0.0):
    await asyncio.sleep(0.3)
    return float(len(solution_str)) + bonus


def positional_score(source, text, truth):  # verl's order, other names: needs contract: verl
    return 2.0 if text == truth else 0.0


def no_score_key(data_source, solution_str, ground_truth):
    return {"acc": 1.0}


def trl_reward(completions, ground_truth, **kwargs):  # TRL's contract, reads ground_truth: stays TRL
    return [1.0 if c == g else 0.0 for c, g in zip(completions, ground_truth)]


def score(rs, completions, **columns):
    n = len(completions)
    return rs.score(prompts=["p"] * n, completions=completions, completion_ids=[[1]] * n, columns=columns)


# -- accuracy reads ground_truth -------------------------------------------------------------------------------------


@pytest.mark.slow
def test_accuracy_reads_the_gold_from_ground_truth_as_a_boxed_answer():
    accuracy = get("accuracy", num_workers=1)
    try:
        scores = accuracy(
            completions=[r"so \boxed{\sqrt{2}}", r"\boxed{3}", r"\boxed{3\sqrt{3}}", r"\boxed{72}"],
            ground_truth=[r"\sqrt{2}", r"3\sqrt{3}", r"3\sqrt{3}", "72"],
        )
        # sqrt(2) = sqrt(2): 1. Unboxed, math-verify parses the gold "3\sqrt{3}" as 3 and would give 1.0 to "\boxed{3}";
        # read as \boxed{3\sqrt{3}} it is 3*sqrt(3) != 3: 0.0, and "\boxed{3\sqrt{3}}" matches: 1.0. 72 = 72: 1.0
        assert scores == [1.0, 0.0, 1.0, 1.0]
    finally:
        accuracy.close()
    reasoning = get("reasoning_accuracy", num_workers=1)
    try:  # the answer after </think> is checked; no </think>: 0.0
        assert reasoning(completions=[r"<think>\boxed{1}</think> \boxed{2}", r"\boxed{2}"], ground_truth=["2", "2"]) == [1.0, 0.0]
    finally:
        reasoning.close()


def test_accuracy_scores_a_verl_parquet_as_training_reads_it(verl_parquet):
    path = verl_parquet([("lighteval/MATH", "1/2?", r"\frac{1}{2}"), ("openai/gsm8k", "6*12?", "72")])
    data = load_prompt_dataset([str(path)])
    assert data.rows[0]["prompt"] == [{"role": "user", "content": "1/2?"}]
    columns = {c: [row.get(c) for row in data.rows] for c in data.columns}
    assert columns["ground_truth"] == [r"\frac{1}{2}", "72"] and columns["data_source"] == ["lighteval/MATH", "openai/gsm8k"]
    with RewardSet.from_specs([{"name": "accuracy", "num_workers": 1}]) as rs:
        out = score(rs, [r"\boxed{0.5}", r"\boxed{71}"], **columns)
    assert out.per_function[:, 0].tolist() == [1.0, 0.0]  # 0.5 = 1/2; 71 != 72


# -- verl's contract ---------------------------------------------------------------------------------------------------


def test_a_verl_function_is_recognised_and_called_once_per_sample_with_its_dict_as_metrics():
    CALLS.clear()
    assert validate_spec({"name": f"{__name__}.compute_score"}).kind == "function"
    with RewardSet.from_specs([{"name": f"{__name__}.compute_score"}]) as rs:
        assert isinstance(rs.functions[0], VerlReward)
        out = score(rs, ["x 72", "x 5", "x 9"], ground_truth=["72", "6", "9"], data_source=["gsm8k"] * 3,
                    extra_info=[{"i": 0}, {"i": 1}, {"i": 2}])
    assert sorted(CALLS) == [("gsm8k", "x 5", "6", {"i": 1}), ("gsm8k", "x 72", "72", {"i": 0}), ("gsm8k", "x 9", "9", {"i": 2})]
    assert out.per_function[:, 0].tolist() == [1.0, -1.0, 1.0]
    m = out.metrics
    assert m["rewards/compute_score/mean"] == pytest.approx(1 / 3)  # (1 - 1 + 1) / 3
    assert m["rewards/compute_score/acc"] == pytest.approx(2 / 3)  # True, False, True
    assert m["rewards/compute_score/length"] == pytest.approx(10 / 3)  # len("x 72") + len("x 5") + len("x 9") = 4 + 3 + 3
    assert "rewards/compute_score/pred" not in m  # a string: not a metric


def test_verl_functions_run_concurrently_sync_on_threads_async_gathered_with_options():
    THREADS.clear()
    specs = [{"name": f"{__name__}.slow_score"}, {"name": f"{__name__}.async_score", "bonus": 10.0}]
    with RewardSet.from_specs(specs) as rs:
        start = time.perf_counter()
        out = score(rs, ["a", "bb", "ccc", "dddd"], ground_truth=["1"] * 4)  # no data_source / extra_info: None
        elapsed = time.perf_counter() - start
    # 4 samples x 0.3 s per function: 2.4 s in series, one 0.3 s round when every call runs at once
    assert elapsed < 1.0, elapsed
    assert len(THREADS) == 4
    assert out.per_function[:, 0].tolist() == [0.5] * 4
    assert out.per_function[:, 1].tolist() == [11.0, 12.0, 13.0, 14.0]  # len + bonus 10


def test_contract_verl_for_other_names_and_the_errors_it_can_give():
    spec = {"name": f"{__name__}.positional_score", "contract": "verl"}
    with RewardSet.from_specs([spec]) as rs:
        assert score(rs, ["7", "8"], ground_truth=["7", "7"]).per_function[:, 0].tolist() == [2.0, 0.0]
    with RewardSet.from_specs([{"name": f"{__name__}.trl_reward"}]) as rs:  # has ground_truth, no solution_str: TRL
        assert not isinstance(rs.functions[0], VerlReward)
        assert score(rs, ["7", "8"], ground_truth=["7", "7"]).per_function[:, 0].tolist() == [1.0, 0.0]
    with pytest.raises(ValueError, match=r"contract must be one of \('trl', 'verl'\).*got 'ppo'"):
        validate_spec({"name": f"{__name__}.compute_score", "contract": "ppo"})
    with pytest.raises(ValueError, match="'accuracy' is a built-in with the batch contract"):
        validate_spec({"name": "accuracy", "contract": "verl"})
    with pytest.raises(ValueError, match=r"contract: verl calls .*trl_reward\(data_source, .* but its parameters are \['completions', 'ground_truth', 'kwargs'\]"):
        validate_spec({"name": f"{__name__}.trl_reward", "contract": "verl"})
    with RewardSet.from_specs([{"name": f"{__name__}.no_score_key"}]) as rs:
        with pytest.raises(RewardError, match=r"returned a dict without 'score' \(keys \['acc'\]\).*\n  completion\[0\]: 'a'"):
            score(rs, ["a"], ground_truth=["1"])


def test_a_verl_function_that_raises_names_the_row():
    def picky(data_source, solution_str, ground_truth, extra_info=None):
        if solution_str == "bad":
            raise ValueError("cannot parse")
        return 1.0

    with RewardSet([RewardEntry("picky", VerlReward(picky, "picky", {}))]) as rs:
        with pytest.raises(RewardError, match=r"'picky' failed: RewardRowError: ValueError: cannot parse\n  completion\[2\]: 'bad'"):
            score(rs, ["ok", "ok", "bad"], ground_truth=["1"] * 3)


# -- verl_default --------------------------------------------------------------------------------------------------


def test_verl_default_routes_gsm8k_and_math_rows():
    reward = get("verl_default", num_workers=1)
    try:
        cases = [  # (data_source, completion, ground truth, expected, why)
            ("openai/gsm8k", "6*12 = 72\n#### 72", "72", 1.0, "the #### answer equals the ground truth"),
            ("openai/gsm8k", "#### 5 then #### 72", "72", 1.0, "the last #### answer counts"),
            ("openai/gsm8k", "#### 1,000", "1000", 1.0, "commas are removed"),
            ("openai/gsm8k", "#### 72.0", "72", 0.0, "strict string comparison, as verl"),
            ("openai/gsm8k", "the answer is 72", "72", 0.0, "no ####: no answer"),
            ("lighteval/MATH", r"so $\boxed{\frac{1}{2}}$", r"\frac{1}{2}", 1.0, "boxed LaTeX, math-verify"),
            ("DigitalLearningGmbH/MATH-lighteval", "the answer is 0.5", r"\frac{1}{2}", 1.0, "a plain expression counts"),
            ("HuggingFaceH4/MATH-500", r"\boxed{\sqrt{3}}", r"3\sqrt{3}", 0.0, "sqrt(3) != 3 sqrt(3)"),
        ]
        scores = reward(completions=[c[1] for c in cases], ground_truth=[c[2] for c in cases], data_source=[c[0] for c in cases])
        assert scores == [c[3] for c in cases], [(c[4], s) for c, s in zip(cases, scores) if s != c[3]]
    finally:
        reward.close()


def test_verl_default_refuses_an_unknown_data_source_naming_the_known_ones():
    with RewardSet.from_specs([{"name": "verl_default", "num_workers": 1}]) as rs:
        with pytest.raises(RewardError) as info:
            score(rs, ["#### 1", "#### 2"], ground_truth=["1", "2"], data_source=["openai/gsm8k", "my/dataset"])
    message = str(info.value)
    assert "no scorer for data_source 'my/dataset'; it knows openai/gsm8k, lighteval/MATH, " in message
    assert "DigitalLearningGmbH/MATH-lighteval" in message and "completion[1]: '#### 2'" in message
