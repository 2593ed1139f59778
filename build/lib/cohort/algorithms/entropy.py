"""Token entropies from logits, and the high-entropy token mask.

`entropy_from_logits` computes ``H = -sum_v p_v log p_v`` per position with
``log p = log_softmax(logits)``; vocabulary entries with p = 0 (logit -inf,
e.g. banned tokens) contribute exactly 0, and so does their gradient.
Half-precision logits are computed in float32 and cast back, so the output
has the input's dtype. The caller chunks over positions: this function holds
one (..., V) softmax in memory.

`top_entropy_mask(entropies, mask, quantile)` keeps the active tokens whose
entropy is at or above the ``quantile`` of the active tokens' entropies
(linear interpolation between order statistics, as `torch.quantile`), the
"80/20" rule of Wang et al. 2025 ("Beyond the 80/20 rule"): ``quantile=0.8``
keeps the top ~20%. TRL's ``top_entropy_quantile`` is the fraction kept, so
``quantile = 1 - top_entropy_quantile`` (TRL's 1.0 = keep all = our 0.0).
The quantile is local to this batch; a trainer that wants a global one
gathers the entropies first. Ties at the threshold are kept.

Left out: the entropy bonus term (a trainer adds ``-coef * aggregate_loss(H)``).
"""

from __future__ import annotations

import torch
from torch import Tensor


def entropy_from_logits(logits: Tensor) -> Tensor:
    """Entropy (...,) of the softmax over the last dim of ``logits`` (..., V); in nats."""
    work = logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits
    log_probs = torch.log_softmax(work, dim=-1)
    probs = log_probs.exp()
    # 0 * (-inf) would be NaN; p = 0 entries contribute 0 (and no gradient).
    safe_log_probs = log_probs.masked_fill(probs == 0, 0.0)
    entropy = -(probs * safe_log_probs).sum(dim=-1)
    return entropy.to(logits.dtype)


def _quantile(values: Tensor, q: float) -> Tensor:
    """Linear-interpolation quantile of a 1-D tensor (no size limit, unlike torch.quantile)."""
    ordered = values.sort().values
    position = q * (ordered.numel() - 1)
    below = int(position)  # floor: position >= 0
    above = min(below + 1, ordered.numel() - 1)
    fraction = position - below
    return ordered[below] + fraction * (ordered[above] - ordered[below])


def top_entropy_mask(entropies: Tensor, mask: Tensor, quantile: float) -> Tensor:
    """Mask keeping active tokens with entropy >= the ``quantile`` of active entropies.

    ``entropies``, ``mask``: (B, T). Returns the mask's dtype (bool stays
    bool, float stays float); nothing is kept where ``mask`` is 0, and an
    all-padding batch gives an all-zero mask.
    """
    if not 0.0 <= quantile <= 1.0:
        raise ValueError(f"quantile must lie in [0, 1] (0.8 keeps the top 20%); got {quantile}")
    if entropies.shape != mask.shape:
        raise ValueError(f"entropies {tuple(entropies.shape)} and mask {tuple(mask.shape)} differ in shape")
    active = mask != 0
    values = entropies.detach()[active]
    if values.numel() == 0:
        return torch.zeros_like(mask)
    threshold = _quantile(values, quantile)
    keep = active & (entropies.detach() >= threshold)
    return keep.to(mask.dtype)
