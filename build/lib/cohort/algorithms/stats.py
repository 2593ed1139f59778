"""Masked statistics shared by the other modules, and `whiten`.

Choices:
- A mask may be bool or any number type; `float_mask` turns it into the
  floating dtype of the data it masks, so float64 data stays float64.
- Variances are Bessel-corrected (divide by n - 1), as `torch.var` does by
  default, and as TRL and verl do. With fewer than two active entries the
  variance is 0, not NaN.
- `whiten` uses the PPO convention ``(x - mean) * rsqrt(var + epsilon)`` with
  epsilon = 1e-8 inside the square root (OpenAI baselines, TRL's PPO trainer,
  verl). Outcome-reward z-scores in `advantages.py` instead follow TRL's GRPO
  convention ``(x - mean) / (std + epsilon)``; both are documented in
  docs/algorithms.md.
- Masked-out positions of every returned per-position tensor are 0.

Left out: distributed reductions. These are local statistics; a trainer that
wants global ones reduces sums and counts itself.
"""

from __future__ import annotations

import torch
from torch import Tensor


def float_mask(mask: Tensor, like: Tensor) -> Tensor:
    """``mask`` as 0/1 values in ``like``'s floating dtype (float32 if ``like`` is not floating)."""
    dtype = like.dtype if like.is_floating_point() else torch.float32
    if mask.shape != like.shape:
        raise ValueError(f"mask shape {tuple(mask.shape)} does not match data shape {tuple(like.shape)}")
    return (mask != 0).to(dtype)


def masked_sum(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Sum of ``x`` over active positions (``mask`` already float)."""
    # torch.where, not x * mask, so a NaN/inf at a padded position cannot leak in.
    picked = torch.where(mask > 0, x, torch.zeros_like(x))
    return picked.sum() if dim is None else picked.sum(dim)


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean of ``x`` over active positions; 0 where there are none."""
    count = mask.sum() if dim is None else mask.sum(dim)
    return masked_sum(x, mask, dim) / count.clamp(min=1)


def masked_var(x: Tensor, mask: Tensor) -> Tensor:
    """Bessel-corrected variance of ``x`` over all active positions; 0 with fewer than two."""
    count = mask.sum()
    centred = x - masked_mean(x, mask)
    return masked_sum(centred.square(), mask) / (count - 1).clamp(min=1)


def masked_max(x: Tensor, mask: Tensor) -> Tensor:
    """Largest active entry of ``x``; 0 when nothing is active."""
    active = mask > 0
    filled = torch.where(active, x, torch.full_like(x, float("-inf")))
    return torch.where(active.any(), filled.max(), torch.zeros((), dtype=x.dtype, device=x.device))


def whiten(x: Tensor, mask: Tensor, shift_mean: bool = True, *, epsilon: float = 1e-8) -> Tensor:
    """Scale ``x`` to unit variance over the active positions of ``mask``.

    ``(x - mean) * rsqrt(var + epsilon)``, with mean and the Bessel-corrected
    variance taken over active positions only. With ``shift_mean=False`` the
    mean is added back (only the scale changes). Padded positions come out 0.

    Shapes: ``x`` and ``mask`` the same shape, any rank; returns that shape.
    """
    mask_f = float_mask(mask, x)
    mean = masked_mean(x, mask_f)
    var = masked_var(x, mask_f)
    whitened = (x - mean) * torch.rsqrt(var + epsilon)
    if not shift_mean:
        whitened = whitened + mean
    return torch.where(mask_f > 0, whitened, torch.zeros_like(whitened))
