"""Loss aggregation: hand-computed modes, empty rows, gradient-accumulation equivalence."""

import pytest
import torch

from cohort.algorithms import AGGREGATIONS, aggregate_loss, aggregation_count


def t64(values):
    return torch.tensor(values, dtype=torch.float64)


# Row 0: losses 1, 2, 3 all active (sum 6, mean 2). Row 1: loss 4 active, then padding
# whose values (0 and NaN) must not matter (sum 4, mean 4). Row 2: no active token.
PER_TOKEN = t64([[1.0, 2.0, 3.0], [4.0, 0.0, float("nan")], [9.0, 9.0, 9.0]])
MASK = torch.tensor([[1, 1, 1], [1, 0, 0], [0, 0, 0]], dtype=torch.bool)


@pytest.mark.parametrize(
    "mode, kwargs, expected",
    [
        ("token_mean", {}, 10 / 4),  # (6 + 4) / 4 active tokens
        ("seq_mean_token_mean", {}, (2 + 4) / 2),  # mean of row means; the empty row is left out
        ("seq_mean_token_sum", {}, (6 + 4) / 2),  # mean of row sums
        ("seq_mean_token_sum_norm", {"max_length": 4}, (6 / 4 + 4 / 4) / 2),  # row sums / max_length
        ("seq_mean_token_sum_norm", {}, (6 / 3 + 4 / 3) / 2),  # padded width 3 when max_length is None
        ("bnpo", {}, 10 / 4),  # one micro-batch: the local token mean
    ],
)
def test_modes_by_hand(mode, kwargs, expected):
    loss = aggregate_loss(PER_TOKEN, MASK, mode, **kwargs)
    torch.testing.assert_close(loss, t64(expected), rtol=0, atol=1e-12)


def test_counts_by_hand():
    assert aggregation_count(MASK, "token_mean").item() == 4
    for mode in ("seq_mean_token_mean", "seq_mean_token_sum", "seq_mean_token_sum_norm"):
        assert aggregation_count(MASK, mode).item() == 2  # rows with an active token
    assert aggregation_count(MASK, "bnpo").item() == 1  # one per micro-batch
    assert aggregation_count(MASK.double(), "token_mean").dtype == torch.float64


@pytest.mark.parametrize("mode", AGGREGATIONS.names())
def test_float_mask_equals_bool_mask_and_dtype_is_kept(mode):
    bool_loss = aggregate_loss(PER_TOKEN, MASK, mode)
    float_loss = aggregate_loss(PER_TOKEN, MASK.double(), mode)
    assert float_loss.dtype == torch.float64
    torch.testing.assert_close(bool_loss, float_loss, rtol=0, atol=0)


@pytest.mark.parametrize("mode", AGGREGATIONS.names())
def test_all_padding_gives_zero_loss_with_a_graph(mode):
    per_token = torch.ones(2, 3, dtype=torch.float64, requires_grad=True)
    loss = aggregate_loss(per_token, torch.zeros(2, 3), mode, num_items=aggregation_count(torch.zeros(2, 3), mode) * 0)
    assert loss.item() == 0.0
    loss.backward()
    assert (per_token.grad == 0).all()


def _batch():
    """(6, 7) leaf of per-token losses with ragged lengths, one empty row."""
    torch.manual_seed(0)
    leaf = torch.randn(6, 7, dtype=torch.float64, requires_grad=True)
    lengths = torch.tensor([7, 3, 0, 5, 1, 4])
    mask = torch.arange(7).unsqueeze(0) < lengths.unsqueeze(1)  # right-padded
    return leaf, mask, lengths


def _accumulated_grad(leaf, mask, lengths, mode, splits, max_length):
    """Gradient of the summed micro-batch losses; each micro-batch padded to its own width."""
    parts = []
    for rows in splits:
        width = max(int(lengths[rows].max()), 1)
        parts.append((rows, width))
    num_items = sum(aggregation_count(mask[rows, :width], mode) for rows, width in parts)
    leaf.grad = None
    for rows, width in parts:
        per_token = leaf[rows, :width].square()  # any per-token function of the parameters
        aggregate_loss(per_token, mask[rows, :width], mode, max_length=max_length, num_items=num_items).backward()
    return leaf.grad.clone()


SPLITS = [[0, 1], [2, 3, 4, 5]], [[0], [1, 2], [3, 4, 5]], [[5, 1, 3], [0, 4, 2]]


@pytest.mark.parametrize("mode", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "seq_mean_token_sum_norm"])
@pytest.mark.parametrize("splits", SPLITS)
def test_gradient_accumulation_equals_one_batch(mode, splits):
    leaf, mask, lengths = _batch()
    max_length = 7  # seq_mean_token_sum_norm needs a fixed max_length for the identity (see below)
    aggregate_loss(leaf.square(), mask, mode, max_length=max_length).backward()
    full = leaf.grad.clone()
    accumulated = _accumulated_grad(leaf, mask, lengths, mode, splits, max_length)
    torch.testing.assert_close(accumulated, full, rtol=0, atol=1e-12)


def test_sum_norm_without_max_length_depends_on_padding():
    # Documented limit: with max_length=None the normaliser is each micro-batch's padded width,
    # so micro-batches padded to different widths do not reproduce the whole batch ...
    leaf, mask, lengths = _batch()
    aggregate_loss(leaf.square(), mask, "seq_mean_token_sum_norm").backward()
    full = leaf.grad.clone()
    accumulated = _accumulated_grad(leaf, mask, lengths, "seq_mean_token_sum_norm", SPLITS[0], None)
    assert not torch.allclose(accumulated, full)
    # ... but micro-batches kept at the full width do.
    num_items = aggregation_count(mask, "seq_mean_token_sum_norm")
    leaf.grad = None
    for rows in SPLITS[0]:
        aggregate_loss(leaf[rows].square(), mask[rows], "seq_mean_token_sum_norm", num_items=num_items).backward()
    torch.testing.assert_close(leaf.grad, full, rtol=0, atol=1e-12)


def test_bnpo_is_trl_mean_of_micro_batch_token_means():
    # bnpo deliberately differs from token_mean under accumulation: with num_items = the number of
    # micro-batches k (the sum of its count, 1 each), the summed loss is (1/k) sum_j local_token_mean_j.
    leaf, mask, _ = _batch()
    per_token = leaf.detach().square()
    splits = SPLITS[1]  # 7, 3 and 10 active tokens: unequal, so the two means differ
    k = sum(aggregation_count(mask[rows], "bnpo") for rows in splits)
    assert k.item() == 3
    total = sum(aggregate_loss(per_token[rows], mask[rows], "bnpo", num_items=k) for rows in splits)
    local_means = [(per_token[rows] * mask[rows]).sum() / mask[rows].sum() for rows in splits]
    torch.testing.assert_close(total, sum(local_means) / 3, rtol=0, atol=1e-12)
    assert not torch.allclose(total, aggregate_loss(per_token, mask, "token_mean"))


def test_unknown_mode_and_bad_shape_raise():
    with pytest.raises(ValueError, match="valid names: token_mean"):
        aggregate_loss(PER_TOKEN, MASK, "dapo")
    with pytest.raises(ValueError, match="valid names"):
        aggregation_count(MASK, "grpo")
    with pytest.raises(ValueError, match=r"\(B, T\)"):
        aggregate_loss(PER_TOKEN[0], MASK[0], "token_mean")
