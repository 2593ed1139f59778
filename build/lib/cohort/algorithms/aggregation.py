"""Reducing a per-token loss (B, T) to the scalar that is back-propagated.

Every mode is written as ``numerator / count``:

| mode                      | numerator (this micro-batch)                 | count (`aggregation_count`)   |
|---------------------------|----------------------------------------------|-------------------------------|
| `token_mean`              | sum of active token losses                   | active tokens                 |
| `seq_mean_token_mean`     | sum over rows of (row sum / row tokens)      | rows with >= 1 active token   |
| `seq_mean_token_sum`      | sum over rows of row sums                    | rows with >= 1 active token   |
| `seq_mean_token_sum_norm` | sum over rows of (row sum / max_length)      | rows with >= 1 active token   |
| `bnpo`                    | sum of active token losses / active tokens   | 1 (one per micro-batch)       |

``num_items``, when given, replaces the count: pass the sum of
`aggregation_count` over every micro-batch of the optimizer step, and summing
the micro-batch losses (gradient accumulation) gives exactly the gradient of
the whole batch at once, for every mode whose numerator adds up across
micro-batches: `token_mean`, `seq_mean_token_mean`, `seq_mean_token_sum`, and
`seq_mean_token_sum_norm` when `max_length` is given (with ``max_length=None``
the padded width is used, which differs between micro-batches padded
separately). `bnpo` is TRL's "batch-normalised" loss: a token mean over each
micro-batch, divided by the number of micro-batches; it is deliberately not
equal to the whole-batch token mean (use `token_mean` for that; TRL's `dapo`).

Rows with no active token add nothing and are not counted in sequence means.
A zero count gives a loss of 0 (still attached to the graph).

If the distributed backend averages gradients over W ranks (DDP, FSDP), pass
``num_items = global count / W`` (TRL divides by the number of processes the
same way), so that the average of the rank losses is the global mean.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor

from .registry import Registry
from .stats import float_mask, masked_sum


@dataclass(frozen=True)
class Aggregation:
    """``numerator(per_token, mask, width) / count(mask)``; ``width`` is the length normaliser."""

    numerator: Callable[[Tensor, Tensor, int], Tensor]
    count: Callable[[Tensor], Tensor]


AGGREGATIONS: Registry[Aggregation] = Registry("loss aggregation")


def _tokens(mask: Tensor) -> Tensor:
    return mask.sum()


def _rows(mask: Tensor) -> Tensor:
    return (mask.sum(dim=-1) > 0).to(mask.dtype).sum()


def _one(mask: Tensor) -> Tensor:
    return torch.ones((), dtype=mask.dtype, device=mask.device)


def _token_sum(per_token: Tensor, mask: Tensor, width: int) -> Tensor:
    return masked_sum(per_token, mask)


def _row_means(per_token: Tensor, mask: Tensor, width: int) -> Tensor:
    row_sums = masked_sum(per_token, mask, dim=-1)
    return (row_sums / mask.sum(dim=-1).clamp(min=1)).sum()


def _row_sums_over_width(per_token: Tensor, mask: Tensor, width: int) -> Tensor:
    return masked_sum(per_token, mask) / width


def _local_token_mean(per_token: Tensor, mask: Tensor, width: int) -> Tensor:
    return masked_sum(per_token, mask) / mask.sum().clamp(min=1)


AGGREGATIONS.add("token_mean", Aggregation(_token_sum, _tokens))
AGGREGATIONS.add("seq_mean_token_mean", Aggregation(_row_means, _rows))
AGGREGATIONS.add("seq_mean_token_sum", Aggregation(_token_sum, _rows))
AGGREGATIONS.add("seq_mean_token_sum_norm", Aggregation(_row_sums_over_width, _rows))
AGGREGATIONS.add("bnpo", Aggregation(_local_token_mean, _one))


def aggregation_count(mask: Tensor, mode: str) -> Tensor:
    """The 0-d count that ``num_items`` expects for ``mode``, for this micro-batch.

    Active tokens (`token_mean`), rows with an active token (sequence modes),
    or 1 (`bnpo`). Sum it over the micro-batches of an optimizer step and pass
    the sum as ``num_items``. Float (the mask's float dtype, else float32).
    """
    mask_f = (mask != 0).to(mask.dtype if mask.is_floating_point() else torch.float32)
    return AGGREGATIONS.get(mode).count(mask_f)


def aggregate_loss(
    per_token: Tensor,
    mask: Tensor,
    mode: str,
    *,
    max_length: int | None = None,
    num_items: Tensor | float | None = None,
) -> Tensor:
    """Scalar loss from ``per_token`` (B, T) over the active positions of ``mask`` (B, T).

    ``mode``: token_mean | seq_mean_token_mean | seq_mean_token_sum |
    seq_mean_token_sum_norm | bnpo (see the module docstring).
    ``max_length``: length normaliser of seq_mean_token_sum_norm (Dr. GRPO);
    the padded width T when None. ``num_items``: the optimizer step's total
    `aggregation_count`, for gradient accumulation; this micro-batch's count
    when None.
    """
    aggregation = AGGREGATIONS.get(mode)
    if per_token.dim() != 2:
        raise ValueError(f"per_token must be (B, T); got shape {tuple(per_token.shape)}")
    mask_f = float_mask(mask, per_token)
    width = per_token.shape[-1] if max_length is None else max_length
    numerator = aggregation.numerator(per_token, mask_f, width)
    if num_items is None:
        count = aggregation.count(mask_f)
    elif not torch.is_tensor(num_items):  # a host number divides as a kernel argument: no copy to the device
        return numerator / (float(num_items) if num_items > 0 else 1.0)
    else:
        count = num_items.to(device=per_token.device, dtype=numerator.dtype)
    return numerator / torch.where(count > 0, count, torch.ones_like(count))
