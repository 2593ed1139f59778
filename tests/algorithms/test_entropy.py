"""Token entropies and the high-entropy token mask."""

import math

import pytest
import torch

from cohort.algorithms import entropy_from_logits, top_entropy_mask


def t64(values):
    return torch.tensor(values, dtype=torch.float64)


def test_entropy_by_hand():
    # Uniform over 4 -> log 4; two equal logits and a banned (-inf) one -> log 2;
    # a near one-hot [1000, 0] -> ~0 (and not NaN).
    logits = t64([[0.0, 0.0, 0.0, 0.0], [5.0, 5.0, float("-inf"), float("-inf")], [1000.0, 0.0, 0.0, 0.0]])
    torch.testing.assert_close(entropy_from_logits(logits), t64([math.log(4), math.log(2), 0.0]), rtol=0, atol=1e-12)


def test_entropy_matches_the_definition_and_has_finite_gradients():
    torch.manual_seed(0)
    logits = torch.randn(2, 3, 11, dtype=torch.float64)
    probs = torch.softmax(logits, -1)
    torch.testing.assert_close(entropy_from_logits(logits), -(probs * probs.log()).sum(-1), rtol=0, atol=1e-12)
    banned = logits.clone()
    banned[..., :3] = float("-inf")
    banned.requires_grad_()
    entropy_from_logits(banned).sum().backward()
    assert torch.isfinite(banned.grad).all() and (banned.grad[..., :3] == 0).all()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float64])
def test_entropy_keeps_dtype(dtype):
    out = entropy_from_logits(torch.zeros(2, 8, dtype=dtype))
    assert out.dtype == dtype and out.shape == (2,)
    assert out.float().sub(math.log(8)).abs().max() < 1e-2


# Active entropies 0.1, 0.5, 0.9, 0.3, 0.7 (sorted 0.1 0.3 0.5 0.7 0.9); the 99 is padding.
ENTROPIES = t64([[0.1, 0.5, 0.9, 0.3], [0.7, 99.0, 99.0, 99.0]])
MASK = torch.tensor([[1, 1, 1, 1], [1, 0, 0, 0]], dtype=torch.bool)


def test_top_entropy_mask_by_hand():
    # quantile 0.5: position 0.5 * (5 - 1) = 2 -> 0.5; keep >= 0.5: 0.5, 0.9, 0.7.
    keep = top_entropy_mask(ENTROPIES, MASK, 0.5)
    assert keep.tolist() == [[False, True, True, False], [True, False, False, False]]
    # quantile 0.8: position 3.2 -> 0.7 + 0.2 * (0.9 - 0.7) = 0.74; keep only 0.9.
    assert top_entropy_mask(ENTROPIES, MASK, 0.8).tolist() == [[False, False, True, False], [False] * 4]
    # quantile 0 keeps every active token (TRL's top_entropy_quantile = 1.0); never padding.
    assert top_entropy_mask(ENTROPIES, MASK, 0.0).tolist() == MASK.tolist()


def test_top_entropy_mask_matches_torch_quantile_and_keeps_mask_dtype():
    torch.manual_seed(1)
    entropies = torch.rand(4, 9, dtype=torch.float64)
    mask = (torch.rand(4, 9) > 0.3).double()
    for q in (0.0, 0.2, 0.5, 0.77, 1.0):
        threshold = torch.quantile(entropies[mask > 0], q)
        keep = top_entropy_mask(entropies, mask, q)
        assert keep.dtype == torch.float64
        assert torch.equal(keep, ((entropies >= threshold) & (mask > 0)).double())


def test_top_entropy_mask_edge_cases():
    assert not top_entropy_mask(ENTROPIES, torch.zeros_like(MASK), 0.5).any()
    with pytest.raises(ValueError, match=r"quantile must lie in \[0, 1\]"):
        top_entropy_mask(ENTROPIES, MASK, 80)
