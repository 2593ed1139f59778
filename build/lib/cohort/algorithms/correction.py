"""Importance weights for the train/inference mismatch (rollout correction).

The rollout engine (vLLM) samples from pi_rollout, whose log-probs differ a
little from the trainer's pi_train for the same weights (kernels, precision,
batching). The policy gradient wants samples of pi_train, so each sample is
re-weighted by ``w = pi_train / pi_rollout``:

- ``level="token"``: ``w_t = exp(trainer_logp_t - rollout_logp_t)`` per token.
- ``level="sequence"``: one weight per row, the product of its active tokens'
  ratios, ``exp(sum_t (trainer_logp_t - rollout_logp_t))``, broadcast to every
  token of the row.
- ``mode="truncate"`` (TIS, truncated importance sampling): ``min(w, cap)``.
- ``mode="mask"`` (MIS, masked importance sampling): ``w`` where ``w <= cap``,
  0 above it (the token, or the whole sequence, is dropped), as TRL's
  ``*_mask`` modes do.

The weights are detached and 0 at padded positions; multiply them into the
per-token policy loss (``per_token_loss * weights``) before aggregation, or
into the advantages. The log-ratio (per token, or the row sum) is clamped to
[-20, 20] before the exp, so ratios saturate at e^20 instead of overflowing.

Metrics (0-d tensors, detached; fractions are over active tokens, so a dropped
sequence counts once per token):
- ``mismatch/kl``: mean of ``exp(x) - x - 1``, x = trainer_logp - rollout_logp,
  an unbiased, non-negative-per-token estimate of KL(pi_rollout || pi_train)
  from the rollout's samples;
- ``mismatch/ratio_max``, ``mismatch/ratio_mean``: of the raw ratio at the
  chosen level, before the cap;
- ``mismatch/frac_masked``: weights set to 0 by ``mask`` mode (0 for truncate);
- ``mismatch/frac_capped``: ratios above ``cap`` (truncated or masked).

Left out: a lower cap, and staleness correction for off-policy reuse (that is
the policy loss's ratio to ``old_logp``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from .stats import float_mask, masked_max, masked_mean, masked_sum

LEVELS = ("token", "sequence")
MODES = ("truncate", "mask")
LOG_RATIO_LIMIT = 20.0


def _ratio(log_ratio: Tensor, mask: Tensor, level: str) -> Tensor:
    """(B, T) importance ratio at ``level``; padded positions hold 1 and are masked later."""
    if level == "sequence":
        log_ratio = masked_sum(log_ratio, mask, dim=-1).unsqueeze(-1).expand_as(log_ratio)
    return torch.exp(log_ratio.clamp(min=-LOG_RATIO_LIMIT, max=LOG_RATIO_LIMIT))


def rollout_correction(
    trainer_logp: Tensor,
    rollout_logp: Tensor,
    mask: Tensor,
    *,
    level: str = "token",
    mode: str = "truncate",
    cap: float = 2.0,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Detached importance weights (B, T) and mismatch metrics (module docstring).

    ``trainer_logp``, ``rollout_logp``, ``mask``: (B, T). ``level``: token |
    sequence. ``mode``: truncate (TIS) | mask (MIS). ``cap`` > 0.
    """
    if level not in LEVELS:
        raise ValueError(f"unknown rollout-correction level {level!r}; valid: {', '.join(LEVELS)}")
    if mode not in MODES:
        raise ValueError(f"unknown rollout-correction mode {mode!r}; valid: {', '.join(MODES)}")
    if cap <= 0:
        raise ValueError(f"cap must be > 0 (TRL's default is 2.0); got {cap}")
    if rollout_logp.shape != trainer_logp.shape:
        raise ValueError(
            f"trainer_logp {tuple(trainer_logp.shape)} and rollout_logp {tuple(rollout_logp.shape)} differ"
        )
    mask_f = float_mask(mask, trainer_logp)
    log_ratio = (trainer_logp - rollout_logp).detach()
    ratio = _ratio(log_ratio, mask_f, level)
    above = ratio > cap
    if mode == "truncate":
        weights = ratio.clamp(max=cap)
        masked = torch.zeros_like(above)
    else:
        weights = torch.where(above, torch.zeros_like(ratio), ratio)
        masked = above
    weights = torch.where(mask_f > 0, weights, torch.zeros_like(weights))
    token_log_ratio = log_ratio.clamp(min=-LOG_RATIO_LIMIT, max=LOG_RATIO_LIMIT)
    metrics = {
        "mismatch/kl": masked_mean(torch.expm1(token_log_ratio) - token_log_ratio, mask_f),
        "mismatch/ratio_max": masked_max(ratio, mask_f),
        "mismatch/ratio_mean": masked_mean(ratio, mask_f),
        "mismatch/frac_masked": masked_mean(masked.to(mask_f.dtype), mask_f),
        "mismatch/frac_capped": masked_mean(above.to(mask_f.dtype), mask_f),
    }
    return weights, metrics
