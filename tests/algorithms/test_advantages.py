"""Outcome advantages: hand-computed groups, the std convention, NaN handling, properties."""

import math

import pytest
import torch

from cohort.algorithms import ADVANTAGE_ESTIMATORS, advantage_stats, compute_advantages

NAN = float("nan")
EPS = 1e-6


def t64(values):
    return torch.tensor(values, dtype=torch.float64)


def close(actual, expected, atol=1e-12):
    torch.testing.assert_close(actual, t64(expected), rtol=0, atol=atol)


def test_grpo_uses_bessel_std_with_epsilon_outside_the_sqrt():
    # Group [1, 0, 0, 1]: mean 0.5, deviations +-0.5.
    # Bessel variance = 4 * 0.25 / (4 - 1) = 1/3, std = sqrt(1/3) = 0.57735...
    # advantage = +-0.5 / (sqrt(1/3) + 1e-6) = +-0.866024...
    # (The population std 0.5 would give +-1 / (1 + 2e-6): this pins Bessel.)
    a = 0.5 / (math.sqrt(1 / 3) + EPS)
    close(compute_advantages("grpo", t64([1, 0, 0, 1]), 4), [a, -a, -a, a])


def test_grpo_nan_is_excluded_from_mean_std_and_count():
    # Finite rewards [0, 1, 1]: mean 2/3, Bessel var = (4/9 + 1/9 + 1/9) / (3 - 1) = 1/3.
    # advantage(0) = -(2/3) / (sqrt(1/3) + eps); advantage(1) = (1/3) / (sqrt(1/3) + eps); NaN -> 0.
    std = math.sqrt(1 / 3) + EPS
    close(compute_advantages("grpo", t64([0, 1, NAN, 1]), 4), [-(2 / 3) / std, (1 / 3) / std, 0, (1 / 3) / std])
    # The same finite rewards without the NaN give the same advantages.
    close(compute_advantages("grpo", t64([0, 1, 1]), 3), [-(2 / 3) / std, (1 / 3) / std, (1 / 3) / std])


def test_grpo_batch_scale_by_hand():
    # Rewards [1, 0 | 3, 3]: batch mean 1.75, squared deviations .5625 + 3.0625 + 1.5625 + 1.5625 = 6.75,
    # Bessel var 6.75 / 3 = 2.25, batch std 1.5. Group 1: mean .5 -> +-0.5 / (1.5 + eps).
    # Group 2 is constant -> 0.
    a = 0.5 / (1.5 + EPS)
    close(compute_advantages("grpo", t64([1, 0, 3, 3]), 2, scale="batch"), [a, -a, 0, 0])


def test_grpo_scale_none_equals_dr_grpo():
    rewards = t64([1, 0, 0, 1, 0.2, 0.7, 0.9, NAN])
    close(compute_advantages("grpo", rewards, 4, scale="none"), [0.5, -0.5, -0.5, 0.5, -0.4, 0.1, 0.3, 0])
    close(compute_advantages("dr_grpo", rewards, 4), [0.5, -0.5, -0.5, 0.5, -0.4, 0.1, 0.3, 0])


def test_rloo_by_hand_and_leave_one_out_identity():
    # [1, 0, 0, 1]: for a 1 the other three average 1/3, so 1 - 1/3 = 2/3; for a 0, 0 - 2/3.
    close(compute_advantages("rloo", t64([1, 0, 0, 1]), 4), [2 / 3, -2 / 3, -2 / 3, 2 / 3])
    # Identity: r_i - mean_{j != i} r_j = n / (n - 1) * (r_i - mean), n = finite rewards in the group.
    torch.manual_seed(0)
    rewards = torch.rand(5 * 6, dtype=torch.float64)
    rewards[[3, 7, 8]] = NAN
    rloo = compute_advantages("rloo", rewards, 6)
    centred = compute_advantages("dr_grpo", rewards, 6)
    n = (~torch.isnan(rewards.reshape(5, 6))).sum(1, keepdim=True).double()
    torch.testing.assert_close(rloo, (centred.reshape(5, 6) * n / (n - 1)).reshape(-1), rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo"])
def test_group_advantages_sum_to_zero(name):
    torch.manual_seed(1)
    rewards = torch.randn(8 * 5, dtype=torch.float64)
    advantages = compute_advantages(name, rewards, 5)
    torch.testing.assert_close(advantages.reshape(8, 5).sum(1), torch.zeros(8, dtype=torch.float64), rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", ADVANTAGE_ESTIMATORS.names())
def test_constant_group_gives_exact_zeros(name):
    # 0.1 * 3 / 3 != 0.1 in floating point; the constant-group rule still gives exact zeros.
    rewards = t64([0.1, 0.1, 0.1, 0.1, 0.1, 0.1])
    assert (compute_advantages(name, rewards, 3) == 0).all()


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo"])
def test_group_of_one_gives_zero(name):
    assert (compute_advantages(name, t64([1.0, 0.0, 3.0]), 1) == 0).all()
    # Also a group with a single finite reward.
    assert (compute_advantages(name, t64([1.0, NAN, 0.0, 1.0]), 2)[:2] == 0).all()


@pytest.mark.parametrize("name", ADVANTAGE_ESTIMATORS.names())
def test_nan_rewards_get_zero_and_all_nan_groups_are_harmless(name):
    rewards = t64([NAN, NAN, NAN, 1.0, 0.0, NAN])
    advantages = compute_advantages(name, rewards, 3)
    assert torch.isfinite(advantages).all()
    assert (advantages[torch.isnan(rewards)] == 0).all()


@pytest.mark.parametrize("name", ADVANTAGE_ESTIMATORS.names())
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_dtype_is_preserved(name, dtype):
    out = compute_advantages(name, torch.tensor([1.0, 0.0, 0.5, 0.25], dtype=dtype), 2)
    assert out.dtype == dtype and out.shape == (4,)


def test_integer_rewards_become_float32_and_output_is_detached():
    assert compute_advantages("grpo", torch.tensor([1, 0, 1, 1]), 2).dtype == torch.float32
    rewards = torch.tensor([1.0, 0.0], requires_grad=True)
    assert not compute_advantages("grpo", rewards, 2).requires_grad


def test_bad_inputs_raise_with_fix_it_messages():
    with pytest.raises(ValueError, match="valid names: grpo"):
        compute_advantages("ppo", t64([1, 0]), 2)
    with pytest.raises(ValueError, match="valid: group, batch, none"):
        compute_advantages("grpo", t64([1, 0]), 2, scale="std")
    with pytest.raises(ValueError, match="multiple of group_size; got 3 and 2"):
        compute_advantages("grpo", t64([1, 0, 1]), 2)
    with pytest.raises(ValueError, match="1-D"):
        compute_advantages("grpo", t64([[1, 0]]), 2)


def test_advantage_stats_by_hand():
    # Groups: [1, 1, 1] constant; [0, 1, NaN] std of [0, 1] = sqrt(0.5); [NaN]*3 no finite reward;
    # [2, 2, 2] constant. Zero-std groups: 1st, 3rd (vacuously), 4th -> 3/4.
    # reward_std: mean over the 3 groups with a finite reward of (0, sqrt(.5), 0) = sqrt(.5) / 3.
    # reward_mean: (1+1+1 + 0+1 + 2+2+2) / 8 = 10/8. frac_reward_nan = 4/12.
    rewards = t64([1, 1, 1, 0, 1, NAN, NAN, NAN, NAN, 2, 2, 2])
    stats = advantage_stats(rewards, 3)
    close(stats["frac_reward_zero_std"], 0.75)
    close(stats["reward_std"], math.sqrt(0.5) / 3)
    close(stats["reward_mean"], 10 / 8)
    close(stats["frac_reward_nan"], 4 / 12)
