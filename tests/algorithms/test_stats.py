"""Masked statistics and whiten."""

import math

import torch

from cohort.algorithms import whiten
from cohort.algorithms.stats import float_mask, masked_max, masked_mean, masked_var


def t64(values):
    return torch.tensor(values, dtype=torch.float64)


def test_whiten_by_hand():
    # Active values 1, 2, 3 (the 100 is padding): mean 2, Bessel var = (1 + 0 + 1) / 2 = 1,
    # so whitened = (x - 2) / sqrt(1 + 1e-8) = [-1, 0, 1] (times 1 / sqrt(1 + 1e-8)).
    x = t64([[1.0, 2.0, 3.0, 100.0]])
    mask = torch.tensor([[True, True, True, False]])
    scale = 1.0 / math.sqrt(1.0 + 1e-8)
    torch.testing.assert_close(whiten(x, mask), t64([[-scale, 0.0, scale, 0.0]]), rtol=0, atol=1e-12)
    # shift_mean=False adds the mean 2 back on active positions only.
    torch.testing.assert_close(
        whiten(x, mask, shift_mean=False), t64([[2 - scale, 2.0, 2 + scale, 0.0]]), rtol=0, atol=1e-12
    )


def test_whiten_keeps_dtype_and_ignores_nan_padding():
    x = t64([[1.0, float("nan")], [3.0, float("inf")]])
    mask = t64([[1.0, 0.0], [1.0, 0.0]])
    out = whiten(x, mask)
    assert out.dtype == torch.float64
    assert torch.isfinite(out).all()


def test_masked_helpers():
    x = t64([[1.0, 5.0], [3.0, -7.0]])
    mask = float_mask(torch.tensor([[1, 0], [1, 0]]), x)
    assert mask.dtype == torch.float64
    assert masked_mean(x, mask).item() == 2.0
    assert masked_var(x, mask).item() == 2.0  # (1 + 1) / (2 - 1)
    assert masked_max(x, mask).item() == 3.0
    empty = torch.zeros_like(mask)
    assert masked_mean(x, empty).item() == 0.0 and masked_max(x, empty).item() == 0.0
    assert masked_var(x, float_mask(torch.tensor([[1, 0], [0, 0]]), x)).item() == 0.0  # one value
