"""Training precision: which dtype the weights are kept in, and which dtype the maths runs in.

`model.dtype` names the precision the model computes in (and generates in,
unless `rollout.dtype` says otherwise); `train.precision` names what the
optimizer updates:

- `mixed` (the default): float32 master weights, float32 gradients and AdamW
  moments, with the forward and backward run in `model.dtype` under
  `torch.autocast` — what TRL's `bf16=True` (through accelerate) and verl's FSDP
  mixed precision do. An update of 1e-6 × a weight of 1 survives (float32 keeps
  24 bits of mantissa; bfloat16 keeps 8, so it rounds such an update away).
- `pure`: the weights and the optimizer state are held in `model.dtype` itself.
  Half the memory of the weights and optimizer, but lossy: at lr 1e-6 most of
  an update rounds away (measured here on the tiny model: 1.2% of the bfloat16
  weights changed after one AdamW step; docs/runs.md).

With `model.dtype = float32` both are the same plain float32 training.

float16 mixed precision would need loss scaling (a GradScaler) to keep small
gradients from underflowing; that is not built, so validation refuses
`model.dtype=float16` with `train.precision=mixed` and says what to use instead.
Out of scope: float8, and keeping the LM head in float32 under autocast.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class Precision:
    """Where the trained weights live and what the forward/backward computes in."""

    weights_dtype: torch.dtype  # the dtype of the parameters the optimizer updates (and of the checkpoints' weights)
    compute_dtype: torch.dtype  # the dtype of the forward/backward (and of final/ and of the engine's copy)

    @property
    def mixed(self) -> bool:
        """True when the maths runs in a lower precision than the weights are kept in (autocast)."""
        return self.compute_dtype != self.weights_dtype

    def autocast(self, device_type: str = "cpu") -> contextlib.AbstractContextManager:
        """The context every forward pass of the trained models runs in: autocast when mixed, else nothing."""
        if not self.mixed:
            return contextlib.nullcontext()
        return torch.autocast(device_type=device_type, dtype=self.compute_dtype)


def resolve_precision(model_dtype: str, precision: str) -> Precision:
    """`model.dtype` + `train.precision` -> Precision. float32 is float32 either way."""
    compute = DTYPES[model_dtype]
    if precision == "mixed":
        return Precision(weights_dtype=torch.float32, compute_dtype=compute)
    if precision == "pure":
        return Precision(weights_dtype=compute, compute_dtype=compute)
    raise ValueError(f"train.precision = {precision!r}: choose mixed or pure")
