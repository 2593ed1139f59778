"""GMPO (verl's geo_mean): the geometric mean of sign-aware log-clipped token ratios, hand-derived values and gradients."""

from __future__ import annotations

import math

import pytest
import torch

from cohort.algorithms.losses import policy_loss
from cohort.algorithms.specs import LOSS_TYPES


def _gmpo(logp, advantages, mask=None, eps=0.4):
    logp = torch.tensor([logp], dtype=torch.float64, requires_grad=True)
    mask = torch.ones_like(logp) if mask is None else torch.tensor([mask], dtype=torch.float64)
    loss, metrics = policy_loss("gmpo", logp, torch.zeros_like(logp), torch.tensor([advantages], dtype=torch.float64),
                                mask, eps_low=eps, eps_high=eps, aggregation=LOSS_TYPES["gmpo"].aggregation)
    loss.backward()
    return loss.item(), logp.grad[0].tolist(), metrics


def test_a_positive_advantage_clips_the_log_ratio_from_above_only():
    # log-ratios 0.2 and 0.6 (old log-probs 0); A = +1: c = min(lr, clamp(lr, -0.4, 0.4)) = (0.2, 0.4)
    # s = exp((0.2 + 0.4) / 2) = exp(0.3); loss = -A s = -1.3498588
    # d/dlogp_0 = -A s / T = -exp(0.3) / 2 = -0.6749294; token 1 is clipped: 0
    loss, grad, metrics = _gmpo([0.2, 0.6], 1.0)
    assert loss == pytest.approx(-math.exp(0.3), abs=1e-12)
    assert grad == pytest.approx([-math.exp(0.3) / 2, 0.0], abs=1e-12)
    assert metrics["clip_ratio/high"].item() == pytest.approx(0.5) and metrics["clip_ratio/low"].item() == 0.0
    assert metrics["ratio/mean"].item() == pytest.approx(math.exp(0.3))


def test_a_negative_advantage_clips_from_below_only():
    # A = -1, log-ratios 0.2 and 0.6: c = max(lr, clamp(lr)) = (0.2, 0.6), nothing clipped
    # loss = -A exp(0.4) = 1.4918247; each gradient +exp(0.4) / 2 = 0.7459123
    loss, grad, _ = _gmpo([0.2, 0.6], -1.0)
    assert loss == pytest.approx(math.exp(0.4), abs=1e-12)
    assert grad == pytest.approx([math.exp(0.4) / 2] * 2, abs=1e-12)
    # log-ratios -0.6 and 0: c = (max(-0.6, -0.4), 0) = (-0.4, 0): s = exp(-0.2) = 0.8187308, token 0 clipped
    loss, grad, metrics = _gmpo([-0.6, 0.0], -1.0)
    assert loss == pytest.approx(math.exp(-0.2), abs=1e-12)
    assert grad == pytest.approx([0.0, math.exp(-0.2) / 2], abs=1e-12)
    assert metrics["clip_ratio/low"].item() == pytest.approx(0.5)


def test_sequences_are_averaged_whatever_their_length():
    # row 0: one active token, log-ratio 0.1, A = 2: loss -2 e^0.1; row 1: two tokens at 0, A = -1: loss +1
    # mean over the two sequences: (-2 e^0.1 + 1) / 2 = -0.6051709 (verl averages rows, ignoring loss_agg_mode)
    logp = torch.tensor([[0.1, 5.0], [0.0, 0.0]], dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([[1.0, 0.0], [1.0, 1.0]], dtype=torch.float64)
    loss, _ = policy_loss("gmpo", logp, torch.zeros_like(logp), torch.tensor([2.0, -1.0], dtype=torch.float64), mask,
                          eps_low=0.4, eps_high=0.4, aggregation="seq_mean_token_sum")
    assert loss.item() == pytest.approx((-2 * math.exp(0.1) + 1) / 2, abs=1e-12)
    loss.backward()
    # the padded token (log-ratio 5) gets no gradient; row 0's token: -A s / T / 2 rows = -2 e^0.1 / 2 = -1.1051709
    assert logp.grad[0].tolist() == pytest.approx([-math.exp(0.1), 0.0], abs=1e-12)
    assert logp.grad[1].tolist() == pytest.approx([0.25, 0.25], abs=1e-12)  # +1 × 1 / 2 tokens / 2 rows


def test_on_policy_it_is_the_sequence_mean_of_the_advantage_gradient():
    # at ratio 1 every token is unclipped and s = 1: the gradient is -A / T per token, the loss -A
    loss, grad, _ = _gmpo([0.0, 0.0, 0.0, 0.0], 0.5)
    assert loss == pytest.approx(-0.5) and grad == pytest.approx([-0.125] * 4)
