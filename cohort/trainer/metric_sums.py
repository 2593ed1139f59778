"""A step's metric sums, kept as tensors on the model's device until the step ends.

On a GPU each `float(t)` of a device tensor waits for the device (a host sync); a
step that read its metrics once per micro-batch would stall the GPU that often.
The update and the critic add their per-micro-batch sums as tensors (`sums[k] += t`,
`running_max`) and read them all at the end in one transfer (`host_values`).
"""

from __future__ import annotations

from typing import Any

import torch


def running_max(sums: dict[str, Any], key: str, values: torch.Tensor) -> None:
    """sums[key] = max(sums[key], values.max()), kept as a tensor on values' device (an empty `values` counts as 0)."""
    peak = values.detach().max() if values.numel() else values.new_zeros(())
    sums[key] = torch.maximum(torch.as_tensor(sums[key], dtype=peak.dtype, device=peak.device), peak)


def host_values(sums: dict[str, Any]) -> dict[str, float]:
    """The step's metric sums as floats, the tensors among them read from their device in one transfer."""
    keys = [k for k, v in sums.items() if torch.is_tensor(v)]
    read = torch.stack([sums[k].detach().double().reshape(()) for k in keys]).tolist() if keys else []
    out = {k: float(v) for k, v in sums.items() if not torch.is_tensor(v)}
    out.update(zip(keys, read))
    return out
