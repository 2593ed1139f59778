"""TRL's loss types: cispo's cap, LUSPO and VESPO by hand, and every `LOSS_TYPES` row against TRL's formula.

TRL 1.16 (trl/trainer/grpo_trainer.py, `_compute_loss`) computes, with
r = exp(logp - old_logp) per token (the sequence-level ratio
s = exp(mean of the row's log-ratios) for luspo), A the row's advantage and M the mask:

- grpo, dapo, bnpo, dr_grpo, luspo: l = -min(r A, clip(r, 1 - eps_low, 1 + eps_high) A);
- cispo: l = -sg(min(r, epsilon_high)) A logp;
- sapo:  l = -A 4/tau sigmoid(tau (r - 1)), tau = tau_pos if A > 0 else tau_neg;
- vespo: l = -sg(phi) A logp, phi = exp(lam + k log w - lam w), w = exp(sum_t log-ratio),
  log w clamped to [log 1e-8, 20], (k, lam) = pos pair if A >= 0 else the neg pair;

aggregated as: grpo, sapo: mean over rows of (row sum / row tokens); bnpo: sum / tokens
(one micro-batch); dr_grpo: sum / (B * max_completion_length); dapo, cispo, vespo:
sum / tokens of the step; luspo: mean over rows of the row sum of the (B, 1) loss
broadcast over the row's tokens. `trl_loss` below writes that down again, naively (per
row, with the sequence ratio as one number: no GSPO-token trick), and the test compares
cohort's `policy_loss` with the row's entry and aggregation to it, in value and gradient.
"""

from __future__ import annotations

import math

import pytest
import torch

from cohort.algorithms import policy_loss
from cohort.algorithms.specs import LOSS_TYPES, POLICY_LOSS_OF_LEVEL

MAX_LEN = 7


def t64(values):
    return torch.tensor(values, dtype=torch.float64)


def one_row(log_ratios, advantage, name, **kwargs):
    """Loss and d loss / d logp of one row (old_logp = 0, so logp is the log-ratio), every token active."""
    logp = t64([log_ratios]).requires_grad_(True)
    loss, metrics = policy_loss(name, logp, torch.zeros_like(logp), t64([advantage]), torch.ones_like(logp), **kwargs)
    loss.backward()
    return loss.item(), logp.grad[0].tolist(), {k: v.item() for k, v in metrics.items()}


def test_cispo_cap_is_absolute_when_given():
    # TRL's cispo: weight = min(r, epsilon_high). r = e^0.5 = 1.6487, cap 5: weight r (not capped);
    # A = 2, logp = 0.5: loss = -r * 2 * 0.5 = -r; gradient = -2r.
    r = math.exp(0.5)
    loss, grad, metrics = one_row([0.5], 2.0, "cispo", cispo_cap=5.0)
    assert loss == pytest.approx(-r, abs=1e-12) and grad[0] == pytest.approx(-2 * r, abs=1e-12)
    assert metrics["clip_ratio/high"] == 0.0
    # Cap 0.2 (TRL's default epsilon_high with cispo): even r = 1 is capped: loss = -0.2 * A * logp = 0 at logp 0,
    # gradient -0.2 * A = -0.4: on-policy, the whole gradient is scaled by the cap.
    loss, grad, metrics = one_row([0.0], 2.0, "cispo", cispo_cap=0.2)
    assert loss == 0.0 and grad[0] == pytest.approx(-0.4, abs=1e-12) and metrics["clip_ratio/high"] == 1.0


def test_luspo_by_hand():
    # One row, log-ratios [0.1, -0.1, 0.3]: s = exp(0.3 / 3) = e^0.1 = 1.10517, inside [0.8, 1.2].
    # GSPO: per-token value -A s = -1.10517 (A = 1). LUSPO multiplies each by |y| = 3: -3.31551 per token;
    # under seq_mean_token_mean the row is worth 3 * (-s) = -3.31551 (TRL: the row sum of the broadcast loss).
    # Gradient of the row loss -3 s w.r.t. logp_t: -3 * s * 1/3 = -s on each token.
    s = math.exp(0.1)
    loss, grad, _ = one_row([0.1, -0.1, 0.3], 1.0, "luspo", aggregation="seq_mean_token_mean")
    assert loss == pytest.approx(-3 * s, abs=1e-12)
    assert grad == pytest.approx([-s] * 3, abs=1e-12)
    # Clipped: log-ratios [0.6, 0.6]: s = e^0.6 = 1.822 > 1.2 with A = 1: row loss 2 * -1.2 = -2.4, no gradient.
    loss, grad, metrics = one_row([0.6, 0.6], 1.0, "luspo", aggregation="seq_mean_token_mean")
    assert loss == pytest.approx(-2.4, abs=1e-12) and grad == [0.0, 0.0] and metrics["clip_ratio/high"] == 1.0


def test_vespo_by_hand():
    # On-policy (w = 1): phi = exp(lam + k*0 - lam*1) = 1 for any (k, lam): plain REINFORCE, -A logp per token.
    # logp = 0 at the log-ratio 0 rows, so the loss is 0 and the gradient -A per token (token_mean over 2 tokens: -A/2).
    loss, grad, _ = one_row([0.0, 0.0], 1.5, "vespo")
    assert loss == 0.0 and grad == pytest.approx([-0.75, -0.75], abs=1e-12)
    # log-ratios [0.2, 0.3]: log w = 0.5, w = e^0.5 = 1.648721. A = 1 >= 0: k = 2, lam = 3:
    # log phi = 3 + 2 * 0.5 - 3 * 1.648721 = -0.946164; phi = 0.388227.
    # Token losses -phi * 1 * [0.2, 0.3]; token_mean: -phi * 0.25 = -0.097057; gradient -phi / 2 per token.
    phi = math.exp(3 + 2 * 0.5 - 3 * math.exp(0.5))
    assert phi == pytest.approx(0.388227, abs=1e-6)
    loss, grad, metrics = one_row([0.2, 0.3], 1.0, "vespo")
    assert loss == pytest.approx(-phi * 0.25, abs=1e-12) and grad == pytest.approx([-phi / 2] * 2, abs=1e-12)
    assert metrics["ratio/mean"] == pytest.approx(math.exp(0.5), abs=1e-12)  # the sequence ratio w
    # Same row, A = -1 < 0: k = 3, lam = 2: log phi = 2 + 1.5 - 2 * 1.648721 = 0.202557; phi = 1.224530 (> 1: the
    # negative pair peaks at w = k / lam = 1.5). Loss +phi * 0.25, gradient +phi / 2.
    phi = math.exp(2 + 3 * 0.5 - 2 * math.exp(0.5))
    loss, grad, _ = one_row([0.2, 0.3], -1.0, "vespo")
    assert loss == pytest.approx(phi * 0.25, abs=1e-12) and grad == pytest.approx([phi / 2] * 2, abs=1e-12)


def test_vespo_far_off_policy_weight_vanishes_and_bad_shape_is_refused():
    # log w = 25 clamps to 20: phi = exp(3 + 40 - 3 e^20) = 0 (underflow, not NaN): the row is dropped.
    loss, grad, _ = one_row([25.0], 1.0, "vespo")
    assert loss == 0.0 and grad == [0.0]
    with pytest.raises(ValueError, match="vespo's lambdas must be > 0"):
        one_row([0.0], 1.0, "vespo", vespo_lambda_neg=0.0)


# --------------------------------------------------------------------------- every loss type against TRL's formula

TRL_DEFAULTS = dict(eps_low=0.2, eps_high=0.28, tau_pos=1.0, tau_neg=1.05, k_pos=2.0, lam_pos=3.0, k_neg=3.0, lam_neg=2.0)


def trl_loss(loss_type, logp, old_logp, adv, mask, p):
    """TRL 1.16's scalar loss for one micro-batch (no accumulation), written row by row."""
    rows = []
    for i in range(logp.shape[0]):
        m = mask[i] > 0
        lp, lr, a = logp[i][m], (logp[i] - old_logp[i])[m], adv[i]
        if loss_type in ("grpo", "dapo", "bnpo", "dr_grpo"):
            r = torch.exp(lr)
            per = -torch.minimum(r * a, r.clamp(1 - p["eps_low"], 1 + p["eps_high"]) * a)
        elif loss_type == "luspo":  # sequence level, as TRL recommends: one (B, 1) loss broadcast over the row
            s = torch.exp(lr.mean())
            per = (-torch.minimum(s * a, s.clamp(1 - p["eps_low"], 1 + p["eps_high"]) * a)).expand(lr.shape)
        elif loss_type == "cispo":
            per = -torch.exp(lr).clamp(max=p["eps_high"]).detach() * a * lp
        elif loss_type == "sapo":
            tau = p["tau_pos"] if a > 0 else p["tau_neg"]
            per = -torch.sigmoid(tau * (torch.exp(lr) - 1)) * 4 / tau * a
        else:  # vespo
            log_w = lr.clamp(-20, 20).sum().clamp(math.log(1e-8), 20).detach()
            k, lam = (p["k_pos"], p["lam_pos"]) if a >= 0 else (p["k_neg"], p["lam_neg"])
            per = -torch.exp(lam + k * log_w - lam * torch.exp(log_w)) * a * lp
        rows.append(per)
    tokens = sum(len(r) for r in rows)
    if loss_type in ("grpo", "sapo"):
        return sum(r.sum() / len(r) for r in rows) / len(rows)
    if loss_type in ("dapo", "bnpo", "cispo", "vespo"):  # one micro-batch: the step's tokens are this batch's
        return sum(r.sum() for r in rows) / tokens
    if loss_type == "dr_grpo":
        return sum(r.sum() for r in rows) / (len(rows) * MAX_LEN)
    return sum(r.sum() for r in rows) / len(rows)  # luspo


@pytest.mark.parametrize("loss_type", [t for t in LOSS_TYPES if t != "gmpo"])  # (TRL has no GMPO: test_gmpo.py)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_every_loss_type_matches_trls_formula(loss_type, seed):
    g = torch.Generator().manual_seed(seed)
    lengths = [7, 3, 5, 1]
    mask = torch.tensor([[1.0] * n + [0.0] * (MAX_LEN - n) for n in lengths], dtype=torch.float64)
    old_logp = -torch.rand(4, MAX_LEN, generator=g, dtype=torch.float64) * 3
    logp = (old_logp + 0.3 * torch.randn(4, MAX_LEN, generator=g, dtype=torch.float64)).requires_grad_(True)
    adv = torch.tensor([1.3, -0.7, 0.0, -1.9], dtype=torch.float64)  # every sign, and A = 0 (vespo's pos pair)
    row = LOSS_TYPES[loss_type]
    name = row.policy_loss or POLICY_LOSS_OF_LEVEL["token"]
    p = TRL_DEFAULTS | ({"eps_high": 1.5} if loss_type == "cispo" else {})  # some weights capped, some not
    ours, _ = policy_loss(name, logp, old_logp, adv, mask, eps_low=p["eps_low"], eps_high=p["eps_high"],
                          cispo_cap=p["eps_high"], aggregation=row.aggregation, max_length=MAX_LEN)
    (our_grad,) = torch.autograd.grad(ours, logp)
    theirs = trl_loss(loss_type, logp, old_logp.detach(), adv, mask, p)
    (their_grad,) = torch.autograd.grad(theirs, logp)
    assert abs(ours.item() - theirs.item()) < 1e-6
    torch.testing.assert_close(our_grad, their_grad, rtol=0, atol=1e-6)
    assert their_grad.abs().sum() > 0  # the comparison is not between two zeros
