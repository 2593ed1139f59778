"""KL estimators and the KL-in-reward token rewards."""

import math

import pytest
import torch

from cohort.algorithms import KL_ESTIMATORS, kl_in_reward, kl_penalty


def t64(values):
    return torch.tensor(values, dtype=torch.float64)


def close(actual, expected, atol=1e-12):
    torch.testing.assert_close(actual, t64(expected), rtol=0, atol=atol)


def test_estimators_by_hand():
    # pi_theta(y) = 0.5, pi_ref(y) = 0.25: d = logp - ref_logp = log 2 = 0.693147...
    # k1 = log 2; k2 = (log 2)^2 / 2 = 0.240227...; k3 with x = -log 2: e^x - x - 1 = 0.5 + log 2 - 1 = 0.193147...
    logp, ref_logp = t64([math.log(0.5)]), t64([math.log(0.25)])
    close(kl_penalty(logp, ref_logp, "k1"), [math.log(2)])
    close(kl_penalty(logp, ref_logp, "k2"), [math.log(2) ** 2 / 2])
    close(kl_penalty(logp, ref_logp, "k3"), [math.log(2) - 0.5])
    close(kl_penalty(logp, ref_logp, "low_var_kl"), [math.log(2) - 0.5])


def test_k1_and_k3_are_unbiased_for_the_exact_kl():
    # Expectation under p of the per-sample estimate, summed exactly over a 5-way categorical:
    # E_p[k1] = KL(p||q) and E_p[k3] = sum_i q_i - 1 + KL = KL(p||q).
    torch.manual_seed(0)
    logp = torch.log_softmax(torch.randn(5, dtype=torch.float64), 0)
    ref_logp = torch.log_softmax(torch.randn(5, dtype=torch.float64), 0)
    exact = (logp.exp() * (logp - ref_logp)).sum()
    for kind in ("k1", "k3"):
        estimate = (logp.exp() * kl_penalty(logp, ref_logp, kind)).sum()
        torch.testing.assert_close(estimate, exact, rtol=0, atol=1e-12)


def test_k3_is_nonnegative_and_zero_when_logprobs_agree():
    torch.manual_seed(1)
    logp, ref_logp = torch.randn(4, 50, dtype=torch.float64), torch.randn(4, 50, dtype=torch.float64)
    assert (kl_penalty(logp, ref_logp, "k3") >= 0).all()
    assert (kl_penalty(logp, ref_logp, "k2") >= 0).all()
    assert (kl_penalty(logp, logp.clone(), "k3") == 0).all()
    assert (kl_penalty(logp, logp.clone(), "low_var_kl") == 0).all()


def test_low_var_kl_clamps_and_keeps_gradients_finite_while_k3_does_not_clamp():
    # x = ref_logp - logp = 30: k3 = e^30 - 31 (huge), low_var_kl = 10 with a zero, finite gradient.
    logp = torch.tensor([-30.0], dtype=torch.float64, requires_grad=True)
    ref_logp = t64([0.0])
    close(kl_penalty(logp.detach(), ref_logp, "k3"), [math.exp(30) - 31], atol=1e-3)
    value = kl_penalty(logp, ref_logp, "low_var_kl")
    close(value.detach(), [10.0])
    value.sum().backward()
    assert torch.isfinite(logp.grad).all() and logp.grad.item() == 0.0


@pytest.mark.parametrize("kind", KL_ESTIMATORS.names())
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_dtype_is_preserved(kind, dtype):
    out = kl_penalty(torch.zeros(2, 3, dtype=dtype), torch.full((2, 3), -0.1, dtype=dtype), kind)
    assert out.dtype == dtype and out.shape == (2, 3)


def test_unknown_kind_and_shape_mismatch_raise():
    with pytest.raises(ValueError, match="valid names: k1, k2, k3, low_var_kl"):
        kl_penalty(t64([0.0]), t64([0.0]), "k4")
    with pytest.raises(ValueError, match="differ in shape"):
        kl_penalty(t64([0.0]), t64([0.0, 1.0]), "k1")


def test_kl_in_reward_by_hand():
    # beta = 0.5, k1 = logp - ref_logp. Row 0 has 2 active tokens, row 1 has 3, row 2 none.
    # Row 0: [-0.5*0.1, -0.5*0.2 + 1.0, 0 (padding: its 9.0 is ignored)] = [-0.05, 0.9, 0]
    # Row 1: [-0.5*0.3, -0.5*0.0, -0.5*0.1 + 2.0] = [-0.15, 0, 1.95]
    # Row 2: no active token -> all 0, outcome reward dropped.
    ref_logp = torch.zeros(3, 3, dtype=torch.float64)
    logp = t64([[0.1, 0.2, 9.0], [0.3, 0.0, 0.1], [0.4, 0.4, 0.4]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [0, 0, 0]])
    rewards = kl_in_reward(t64([1.0, 2.0, 5.0]), logp, ref_logp, mask, beta=0.5)
    close(rewards, [[-0.05, 0.9, 0.0], [-0.15, 0.0, 1.95], [0.0, 0.0, 0.0]])


def test_kl_in_reward_is_detached_and_uses_the_kind():
    logp = torch.tensor([[math.log(0.5)]], dtype=torch.float64, requires_grad=True)
    ref_logp = t64([[math.log(0.25)]])
    rewards = kl_in_reward(t64([1.0]), logp, ref_logp, torch.ones(1, 1), beta=1.0, kind="k3")
    assert not rewards.requires_grad
    close(rewards, [[1.0 - (math.log(2) - 0.5)]])  # outcome 1 minus k3 (see test_estimators_by_hand)
