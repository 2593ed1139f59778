"""Advantages over runs of several samples (`compute_advantages(..., runs=)`, `AdvantageInputs.runs`): an agent run
that rewrote its history is one row per call; group statistics count each run once and every row gets its run's
advantage, while PPO scores each row in its own right (hand-derived numbers)."""

from __future__ import annotations

import pytest
import torch

from cohort.algorithms.advantages import compute_advantages, run_rewards
from cohort.algorithms.specs import ALGORITHMS, AdvantageInputs

# Two groups of G = 3 runs, 9 rows. Group 0: run 0 made 3 calls (rows 0, 1, 2), runs 1 and 2 one each (rows 3, 4);
# rewards 1, 0, 0.5. Group 1: runs 3, 4 (2 calls: rows 6, 7) and 5; rewards 0, 1, 1.
RUNS = torch.tensor([0, 0, 0, 1, 2, 3, 4, 4, 5])
REWARDS = torch.tensor([1.0, 1.0, 1.0, 0.0, 0.5, 0.0, 1.0, 1.0, 1.0])  # each row its run's reward


def test_the_runs_rewards_are_gathered_once_each_with_a_nan_tail():
    # 6 runs; the vector is 9 long (N rounded up to a multiple of G = 3): the tail is one whole group of NaN
    out = run_rewards(REWARDS, RUNS, 3)
    assert out[:6].tolist() == [1.0, 0.0, 0.5, 0.0, 1.0, 1.0] and torch.isnan(out[6:]).all()


def test_grpo_counts_each_run_once_and_gives_each_row_its_runs_advantage():
    # group 0 over runs (1, 0, 0.5): mean 0.5, Bessel std sqrt((0.25 + 0.25 + 0) / 2) = 0.5, so run 0: 0.5 / 0.500001
    # = 0.999998, run 1: -0.999998, run 2: 0. (Counting rows instead, 1 would enter three times: mean 0.7.)
    # group 1 over runs (0, 1, 1): mean 2/3, std sqrt((4/9 + 1/9 + 1/9) / 2) = sqrt(1/3) = 0.57735: run 3: -(2/3) /
    # 0.57735 = -1.154700, runs 4 and 5: (1/3) / 0.57735 = 0.577350.
    a0, a3, a4 = 0.5 / (0.5 + 1e-6), -(2 / 3) / (3 ** -0.5 + 1e-6), (1 / 3) / (3 ** -0.5 + 1e-6)
    out = compute_advantages("grpo", REWARDS, 3, runs=RUNS)
    expected = [a0, a0, a0, -a0, 0.0, a3, a4, a4, a4]
    assert out.tolist() == pytest.approx(expected, abs=1e-6)
    assert out[:3].tolist() == pytest.approx([0.999998] * 3, abs=1e-6)


def test_rloo_and_a_group_mean_over_runs():
    # rloo: r_i minus the mean of the other two runs. Group 0: 1 - 0.25 = 0.75, 0 - 0.75 = -0.75, 0.5 - 0.5 = 0;
    # group 1: 0 - 1 = -1, 1 - 0.5 = 0.5, 0.5. dr_grpo: r - run mean: 0.5, -0.5, 0; -2/3, 1/3, 1/3.
    assert compute_advantages("rloo", REWARDS, 3, runs=RUNS).tolist() == pytest.approx(
        [0.75, 0.75, 0.75, -0.75, 0.0, -1.0, 0.5, 0.5, 0.5], abs=1e-6)
    assert compute_advantages("dr_grpo", REWARDS, 3, runs=RUNS).tolist() == pytest.approx(
        [0.5, 0.5, 0.5, -0.5, 0.0, -2 / 3, 1 / 3, 1 / 3, 1 / 3], abs=1e-6)


def test_every_row_its_own_run_is_the_plain_estimator():
    rewards = torch.tensor([1.0, 0.0, 0.5, 0.0, 1.0, 1.0])
    for name in ("grpo", "rloo", "dr_grpo"):
        assert torch.equal(compute_advantages(name, rewards, 3, runs=torch.arange(6)), compute_advantages(name, rewards, 3))


def test_an_unscored_run_gets_zero_on_every_row_and_leaves_its_group_alone():
    # run 0 (3 rows) unscored: group 0 is runs 1 and 2 alone, rewards 0 and 0.5: mean 0.25, std sqrt(0.0625 * 2) =
    # 0.353553: -0.25 / 0.353554 = -0.707105 and +0.707105
    rewards = REWARDS.clone()
    rewards[:3] = float("nan")
    out = compute_advantages("grpo", rewards, 3, runs=RUNS)
    assert out[:5].tolist() == pytest.approx([0.0, 0.0, 0.0, -0.25 / (0.125 ** 0.5 + 1e-6), 0.25 / (0.125 ** 0.5 + 1e-6)],
                                             abs=1e-6)


def test_rloo_with_the_kl_in_the_reward_takes_the_runs_kl_over_all_its_rows():
    # group 0 only (5 rows, one token each). Per-row KL 0.1, 0.2, 0.3 on run 0's rows, 0 elsewhere; beta 0.5: run 0's
    # reward is 1 - 0.5 * (0.1 + 0.2 + 0.3) = 0.7, runs 1 and 2 keep 0 and 0.5. RLOO: 0.7 - (0 + 0.5) / 2 = 0.45,
    # 0 - (0.7 + 0.5) / 2 = -0.6, 0.5 - (0.7 + 0) / 2 = 0.15, on every row of each run
    x = AdvantageInputs(rewards=REWARDS[:5], mask=torch.ones(5, 1), group_size=3, runs=RUNS[:5],
                        kl=torch.tensor([[0.1], [0.2], [0.3], [0.0], [0.0]]), kl_coef=0.5)
    out = ALGORITHMS.get("rloo").advantages(x).advantages
    assert out[:, 0].tolist() == pytest.approx([0.45, 0.45, 0.45, -0.6, 0.15], abs=1e-6)


def test_ppo_scores_each_sample_row_with_its_own_values_and_the_runs_reward():
    # group 0, one token per row, gamma = lam = 1: each row's GAE is (its run's reward) - (its own value):
    # rewards 1, 1, 1, 0, 0.5 and values 0.2, 0.4, 0.6, 0.1, 0.3 give 0.8, 0.6, 0.4, -0.1, 0.2 (run 0's three calls
    # differ: each row is scored in its own right); returns = advantages + values = the run's reward.
    # Whitened over the 5 tokens: mean 0.38, deviations 0.42, 0.22, 0.02, -0.48, -0.18, squares summing to 0.488,
    # Bessel variance 0.122: each deviation * rsqrt(0.122 + 1e-8).
    values = torch.tensor([[0.2], [0.4], [0.6], [0.1], [0.3]])
    x = AdvantageInputs(rewards=REWARDS[:5], mask=torch.ones(5, 1), group_size=3, runs=RUNS[:5], values=values)
    out = ALGORITHMS.get("ppo").advantages(x)
    scale = (0.122 + 1e-8) ** -0.5
    assert out.advantages[:, 0].tolist() == pytest.approx([d * scale for d in (0.42, 0.22, 0.02, -0.48, -0.18)], abs=1e-5)
    assert out.returns[:, 0].tolist() == pytest.approx([1.0, 1.0, 1.0, 0.0, 0.5], abs=1e-6)


def test_reinforce_pp_baseline_subtracts_the_runs_group_mean():
    # one token per row, gamma 1, no KL: each row's return is its run's r - group mean over runs (0.5, 0.5, 0.5,
    # -0.5, 0 for group 0), then whitened over the 5 tokens: mean 0.2, deviations 0.3, 0.3, 0.3, -0.7, -0.2, squares
    # summing to 0.27 + 0.49 + 0.04 = 0.8, Bessel variance 0.2
    x = AdvantageInputs(rewards=REWARDS[:5], mask=torch.ones(5, 1), group_size=3, runs=RUNS[:5])
    out = ALGORITHMS.get("reinforce_pp_baseline").advantages(x).advantages
    scale = (0.2 + 1e-8) ** -0.5
    assert out[:, 0].tolist() == pytest.approx([d * scale for d in (0.3, 0.3, 0.3, -0.7, -0.2)], abs=1e-5)
