"""Per-token estimators of KL(pi_theta || pi_ref), and the KL-in-reward form.

The tokens were sampled from pi_theta (on-policy), so with the log-ratio
``d = logp - ref_logp`` (and ``x = -d = ref_logp - logp``) the estimators of
Schulman's note "Approximating KL divergence" (2020) are:

- ``k1``: ``d``. Unbiased, high variance, can be negative per token.
- ``k2``: ``d^2 / 2``. Biased, low variance, >= 0; its gradient is that of
  the KL when used as a loss.
- ``k3``: ``exp(x) - x - 1``. Unbiased, >= 0 per token, 0 iff log-probs agree.
  Not clamped: large negative ``d`` gives large values, as the maths says.
- ``low_var_kl``: k3 with ``x`` clamped to [-20, 20] before the exp and the
  result clamped to [-10, 10], as verl does; the inner clamp keeps exp finite so
  the gradient of a clamped value is 0 instead of NaN.

Every estimator has the signature ``(logp, ref_logp) -> (B, T)`` and does not
mask; the caller aggregates with a mask (see `aggregation.py`).

`kl_in_reward` builds the token rewards of RLOO / REINFORCE++ / PPO:
``-beta * kl`` on every active token, plus the outcome reward on each row's
last active token. It is a reward, so it is detached.

Left out: the full-distribution KL (needs (B, T, V) logits of both models).
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

from .registry import Registry
from .stats import float_mask

KLEstimator = Callable[[Tensor, Tensor], Tensor]
KL_ESTIMATORS: Registry[KLEstimator] = Registry("KL estimator")


@KL_ESTIMATORS.register("k1")
def k1(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """``logp - ref_logp``."""
    return logp - ref_logp


@KL_ESTIMATORS.register("k2")
def k2(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """``(logp - ref_logp)^2 / 2``."""
    return 0.5 * (logp - ref_logp).square()


@KL_ESTIMATORS.register("k3")
def k3(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """``exp(x) - x - 1`` with ``x = ref_logp - logp``; unclamped."""
    x = ref_logp - logp
    return torch.expm1(x) - x


@KL_ESTIMATORS.register("low_var_kl")
def low_var_kl(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """k3 with ``x`` clamped to [-20, 20] and the result to [-10, 10] (verl)."""
    x = (ref_logp - logp).clamp(min=-20.0, max=20.0)
    return (torch.expm1(x) - x).clamp(min=-10.0, max=10.0)


def kl_penalty(logp: Tensor, ref_logp: Tensor, kind: str) -> Tensor:
    """Per-token KL(pi_theta || pi_ref) estimate, same shape as ``logp``.

    ``kind`` is one of ``KL_ESTIMATORS.names()``: k1, k2, k3, low_var_kl.
    Differentiable in both inputs; no mask is applied.
    """
    if logp.shape != ref_logp.shape:
        raise ValueError(f"logp {tuple(logp.shape)} and ref_logp {tuple(ref_logp.shape)} differ in shape")
    return KL_ESTIMATORS.get(kind)(logp, ref_logp)


def last_active_index(mask: Tensor) -> Tensor:
    """(B,) index of each row's last active position; -1 for a row with none."""
    positions = torch.arange(mask.shape[-1], device=mask.device).expand(mask.shape)
    return torch.where(mask != 0, positions, torch.full_like(positions, -1)).amax(dim=-1)


def kl_in_reward(
    outcome_rewards: Tensor,
    logp: Tensor,
    ref_logp: Tensor,
    mask: Tensor,
    *,
    beta: float,
    kind: str = "k1",
) -> Tensor:
    """Token rewards (B, T): ``-beta * kl`` per active token, outcome reward on the last one.

    ``outcome_rewards`` (B,); ``logp``, ``ref_logp``, ``mask`` (B, T). Padded
    positions are 0, a row without active tokens gets nothing. Detached: this
    is a reward, not a loss. NaN outcome rewards propagate; replace them first
    if NaN means "unscorable" in your pipeline.
    """
    if outcome_rewards.shape != logp.shape[:1]:
        raise ValueError(
            f"outcome_rewards must be (B,) = {tuple(logp.shape[:1])}; got {tuple(outcome_rewards.shape)}"
        )
    mask_f = float_mask(mask, logp)
    kl = kl_penalty(logp.detach(), ref_logp.detach(), kind)
    token_rewards = torch.where(mask_f > 0, -beta * kl, torch.zeros_like(kl))
    last = last_active_index(mask_f).unsqueeze(-1)  # (B, 1); -1 for a row without tokens
    positions = torch.arange(logp.shape[-1], device=logp.device)
    is_last = positions == last  # (B, T), all False for a row without tokens
    outcome = outcome_rewards.detach().to(token_rewards.dtype).unsqueeze(-1).expand_as(token_rewards)
    return token_rewards + torch.where(is_last, outcome, torch.zeros_like(outcome))
