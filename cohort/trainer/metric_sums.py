"""A step's metric sums, kept as tensors on the model's device until the step ends.

On a GPU each `float(t)` of a device tensor waits for the device (a host sync); a
step that read its metrics once per micro-batch would stall the GPU that often.
The update and the critic add their per-micro-batch sums as tensors (`sums[k] += t`,
`running_max`) and read them all at the end in one transfer (`host_values`);
`step_metrics` turns the host sums into the step's logged metrics.
"""

from __future__ import annotations

from typing import Any

import torch


def running_max(sums: dict[str, Any], key: str, values: torch.Tensor) -> None:
    """sums[key] = max(sums[key], values.max()), kept as a tensor on values' device (an empty `values` counts as 0)."""
    peak = values.detach().max() if values.numel() else values.new_zeros(())
    previous = sums[key]  # a float before the first (a clamp takes it as a kernel argument: no copy to the device)
    sums[key] = torch.maximum(previous, peak) if torch.is_tensor(previous) else peak.clamp(min=float(previous))


def host_values(sums: dict[str, Any]) -> dict[str, float]:
    """The step's metric sums as floats, the tensors among them read from their device in one transfer."""
    keys = [k for k, v in sums.items() if torch.is_tensor(v)]
    read = torch.stack([sums[k].detach().double().reshape(()) for k in keys]).tolist() if keys else []
    out = {k: float(v) for k, v in sums.items() if not torch.is_tensor(v)}
    out.update(zip(keys, read))
    return out


def step_metrics(sums: dict[str, float], grad_norm: float, learning_rate: float, *, staleness_shown: bool) -> dict[str, float]:
    """The update's logged metrics from its host sums: per-token means of what was summed per token (`tokens`), the
    staleness, importance-weight and mismatch statistics when present. `staleness_shown`: the run admits off-policy
    tokens (else the staleness rows appear only when some token was stale: an on-policy run shows no zeros)."""
    tokens = max(sums.pop("tokens"), 1.0)
    out = {"loss": sums.pop("loss"), "entropy": sums.pop("entropy") / tokens, "grad_norm": grad_norm,
           "learning_rate": learning_rate, "padding_fraction": sums.pop("padding") / max(sums.pop("cells"), 1.0)}
    if "kl" in sums:
        out["kl"] = sums.pop("kl") / tokens
    staleness_tokens = sums.pop("staleness_tokens", 0.0)
    staleness_sum, staleness_max = sums.pop("staleness_sum", 0.0), sums.pop("staleness_max", 0.0)
    off_tokens = sums.pop("off_policy_tokens", 0.0)
    if staleness_tokens and (staleness_shown or staleness_sum > 0):
        out.update({"staleness/mean": staleness_sum / staleness_tokens, "staleness/max": staleness_max,
                    "staleness/off_policy_frac": off_tokens / staleness_tokens})
    ess_w, ess_w2 = sums.pop("ess_w", 0.0), sums.pop("ess_w2", 0.0)
    if ess_w2 > 0:  # Kish's effective sample size of the importance weights, as a fraction of the tokens weighted
        out["correction/ess"] = ess_w * ess_w / ess_w2 / max(tokens, 1.0)
    mismatch_tokens = sums.pop("mismatch_tokens", 0.0)
    mismatch_sum, mismatch_max = sums.pop("mismatch_sum", 0.0), sums.pop("mismatch_max", 0.0)
    if mismatch_tokens:
        out["mismatch/logprob_abs_mean"] = mismatch_sum / mismatch_tokens
        out["mismatch/logprob_abs_max"] = mismatch_max
    if "inert_micro_batches" in sums:  # micro-batches whose gradient was exactly zero: scored, not backpropagated
        out["update/inert_micro_batches"] = sums.pop("inert_micro_batches")
    for key, value in sums.items():
        out[key] = value / tokens
    if "clip_ratio/region" in out:
        out["clip_ratio/region_mean"] = out["clip_ratio/region"]
    return out
