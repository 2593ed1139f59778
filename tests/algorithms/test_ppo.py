"""GAE, discounted returns, the clipped value loss and the KL controllers."""

import math

import pytest
import torch

from cohort.algorithms import AdaptiveKLController, FixedKLController, discounted_returns, gae, value_loss


def t64(values):
    return torch.tensor(values, dtype=torch.float64)


def close(actual, expected, atol=1e-12):
    torch.testing.assert_close(actual, t64(expected), rtol=0, atol=atol)


def test_gae_three_tokens_by_hand():
    # gamma = 0.9, lam = 0.8 (gamma * lam = 0.72); rewards [0, 0, 1]; values [0.5, 0.6, 0.7].
    # t=2 (last): delta = 1 + 0.9 * 0 - 0.7 = 0.3;                 A2 = 0.3
    # t=1: delta = 0 + 0.9 * 0.7 - 0.6 = 0.03;  A1 = 0.03 + 0.72 * 0.3   = 0.246
    # t=0: delta = 0 + 0.9 * 0.6 - 0.5 = 0.04;  A0 = 0.04 + 0.72 * 0.246 = 0.21712
    # returns = A + V = [0.71712, 0.846, 1.0]
    advantages, returns = gae(t64([[0.0, 0.0, 1.0]]), t64([[0.5, 0.6, 0.7]]), torch.ones(1, 3), gamma=0.9, lam=0.8)
    close(advantages, [[0.21712, 0.246, 0.3]])
    close(returns, [[0.71712, 0.846, 1.0]])


def test_gae_padding_does_not_leak():
    # The same 3 tokens, right-padded with garbage reward 100 and value 50 (and a NaN):
    # results on active tokens are unchanged, padded positions are 0.
    rewards = t64([[0.0, 0.0, 1.0, 100.0, float("nan")]])
    values = t64([[0.5, 0.6, 0.7, 50.0, 50.0]])
    mask = torch.tensor([[True, True, True, False, False]])
    advantages, returns = gae(rewards, values, mask, gamma=0.9, lam=0.8)
    close(advantages, [[0.21712, 0.246, 0.3, 0.0, 0.0]])
    close(returns, [[0.71712, 0.846, 1.0, 0.0, 0.0]])


def test_gae_skips_holes_in_the_mask():
    # A masked hole (e.g. tool output) between active tokens is skipped: [a, hole, b] behaves as [a, b].
    # Two tokens, gamma = 0.9, lam = 0.8, rewards [0, 1], values [0.5, 0.7]:
    # t=b: delta = 1 - 0.7 = 0.3 = A_b; t=a: delta = 0.9 * 0.7 - 0.5 = 0.13, A_a = 0.13 + 0.72 * 0.3 = 0.346.
    advantages, returns = gae(t64([[0.0, 5.0, 1.0]]), t64([[0.5, 9.0, 0.7]]), t64([[1.0, 0.0, 1.0]]),
                              gamma=0.9, lam=0.8)
    close(advantages, [[0.346, 0.0, 0.3]])
    close(returns, [[0.846, 0.0, 1.0]])


def test_gae_with_lam_one_and_zero_values_is_the_reward_to_go():
    # gamma = 0.5, rewards [1, 2, 4]: G2 = 4, G1 = 2 + 0.5 * 4 = 4, G0 = 1 + 0.5 * 4 = 3.
    rewards, mask = t64([[1.0, 2.0, 4.0]]), torch.ones(1, 3)
    close(discounted_returns(rewards, mask, gamma=0.5), [[3.0, 4.0, 4.0]])
    advantages, _ = gae(rewards, torch.zeros(1, 3, dtype=torch.float64), mask, gamma=0.5, lam=1.0)
    close(advantages, [[3.0, 4.0, 4.0]])


def test_gae_outputs_are_detached_and_keep_dtype():
    values = torch.zeros(2, 3, dtype=torch.float64, requires_grad=True)
    advantages, returns = gae(torch.ones(2, 3, dtype=torch.float64), values, torch.ones(2, 3), gamma=1.0, lam=0.95)
    assert advantages.dtype == returns.dtype == torch.float64
    assert not advantages.requires_grad and not returns.requires_grad
    with pytest.raises(ValueError, match=r"\(B, T\) shape"):
        gae(torch.ones(2, 3), torch.ones(2, 4), torch.ones(2, 3), gamma=1.0, lam=1.0)


def test_value_loss_by_hand():
    # Token 1: V = 1.5, V_old = 1.0, R = 2.0, c = 0.2: V_clip = 1.2.
    #   unclipped (1.5 - 2)^2 = 0.25, clipped (1.2 - 2)^2 = 0.64 -> 0.5 * 0.64 = 0.32, no gradient.
    # Token 2: V = 1.1, V_old = 1.0, R = 2.0: inside the clip, both 0.81 -> 0.405, gradient V - R = -0.9.
    # token_mean: (0.32 + 0.405) / 2 = 0.3625; gradients (0, -0.9) / 2.
    values = torch.tensor([[1.5, 1.1]], dtype=torch.float64, requires_grad=True)
    loss, metrics = value_loss(values, t64([[1.0, 1.0]]), t64([[2.0, 2.0]]), torch.ones(1, 2), cliprange_value=0.2)
    loss.backward()
    assert loss.item() == pytest.approx(0.3625, abs=1e-12)
    close(values.grad, [[0.0, -0.45]])
    assert metrics["value/clip_frac"].item() == pytest.approx(0.5, abs=1e-12)
    assert metrics["value/error"].item() == pytest.approx((0.25 + 0.81) / 2, abs=1e-12)


def test_adaptive_kl_controller_by_hand():
    # init 0.2, target 6, horizon 10000, n_steps 256.
    # KL 9: error 9/6 - 1 = 0.5, clipped to 0.2 -> beta = 0.2 * (1 + 0.2 * 256 / 10000) = 0.201024.
    controller = AdaptiveKLController(0.2, target=6.0, horizon=10000)
    controller.update(9.0, 256)
    assert controller.value == pytest.approx(0.201024, abs=1e-15)
    # KL 5.7 (as a tensor): error -0.05 -> beta *= 1 - 0.05 * 256 / 10000 = 0.99872.
    controller.update(torch.tensor(5.7), 256)
    assert controller.value == pytest.approx(0.201024 * 0.99872, rel=1e-7)
    # KL 0: error -1 clipped to -0.2 -> beta *= 1 - 0.2 * 256 / 10000.
    before = controller.value
    controller.update(0.0, 256)
    assert controller.value == pytest.approx(before * (1 - 0.2 * 256 / 10000), abs=1e-15)


def test_controllers_state_dict_round_trip():
    controller = AdaptiveKLController(0.1, target=6.0, horizon=100)
    controller.update(12.0, 10)
    restored = AdaptiveKLController(0.1, target=6.0, horizon=100)
    restored.load_state_dict(controller.state_dict())
    assert restored.value == controller.value == pytest.approx(0.1 * 1.02, abs=1e-15)
    fixed = FixedKLController(0.05)
    fixed.update(100.0, 10)
    assert fixed.value == 0.05
    other = FixedKLController(0.0)
    other.load_state_dict(fixed.state_dict())
    assert other.value == 0.05
    with pytest.raises(ValueError, match="must be > 0"):
        AdaptiveKLController(0.1, target=0.0, horizon=100)
    assert math.isfinite(controller.value)
