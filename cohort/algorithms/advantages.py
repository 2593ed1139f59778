"""Outcome-reward advantages: one scalar per completion, from rewards of groups.

``rewards`` is a flat (N,) tensor, N = groups x group_size, and consecutive
entries form a group (the completions sampled for one prompt).

Runs of several samples (``runs``): an agent run that rewrote its history is one
row per model call, all its rows carrying the run's reward. ``runs`` (N,) names
the run of each row, runs numbered 0..R-1 so that consecutive ``group_size`` runs
form a group (run r is in group r // group_size); the statistics are taken over
the runs' rewards (each run counted once, whatever its number of rows) and every
row gets its run's advantage. The runs' rewards are gathered into a vector of
length N rounded up to a multiple of group_size (no host read of R), its unused
tail NaN: whole groups of NaN, which every estimator already leaves out.
``runs=None`` is each row its own run (the reshape, no gather).

Conventions (pinned in tests/algorithms/test_advantages.py):
- std is Bessel-corrected (divide by n - 1), as `torch.std` and TRL do: with
  G = 4..16 samples the group std is a sample estimate, and matching TRL makes
  runs comparable. epsilon is added to the std, outside the square root:
  ``(r - mean) / (std + epsilon)``, epsilon = 1e-6 by default (TRL's 1e-4 is
  one config value away).
- NaN rewards mean "no reward function could score this completion": their
  advantage is 0 and they are left out of every statistic (means, stds and the
  counts n inside them). A group is judged by its finite rewards only.
- A group whose finite rewards are all equal (this includes a group of one, or
  a group with at most one finite reward) gets advantage exactly 0, not a tiny
  rounding residue: it carries no signal about which answer was better.
- A group of one gets advantage 0 from every estimator.
- ``scale`` ("group" | "batch" | "none") only changes ``grpo``; the other
  estimators accept and ignore it, so callers never special-case an entry.

Left out: token-level advantages. GAE lives in `ppo.py`; REINFORCE++ (the
trainer's `algorithm.name = reinforce_pp` and `reinforce_pp_baseline`) whitens
the reward-to-go of token rewards over the batch's tokens, in
`cohort.algorithms.specs` (an outcome-only, per-completion REINFORCE++ was
registered here once; nothing trained with it, and its whitening differed from
the trainer's, so it went).
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import torch
from torch import Tensor

from .registry import Registry

SCALES = ("group", "batch", "none")

# An estimator maps grouped rewards (groups, group_size), NaN = unscorable,
# to advantages of the same shape with 0 at NaN rewards.
AdvantageEstimator = Callable[..., Tensor]
ADVANTAGE_ESTIMATORS: Registry[AdvantageEstimator] = Registry("advantage estimator")


class GroupStats(NamedTuple):
    """NaN-aware statistics of each row of a (groups, group_size) reward tensor."""

    valid: Tensor  # (G, S) bool: reward is finite (not NaN)
    count: Tensor  # (G, 1) number of valid rewards
    mean: Tensor  # (G, 1) mean of valid rewards (0 if none)
    std: Tensor  # (G, 1) Bessel-corrected std of valid rewards (0 if fewer than 2)
    constant: Tensor  # (G, 1) bool: all valid rewards equal (true if fewer than 2)


def group_stats(grouped: Tensor) -> GroupStats:
    """Per-row statistics over the non-NaN entries of ``grouped`` (G, S)."""
    valid = ~torch.isnan(grouped)
    zeros = torch.zeros_like(grouped)
    count = valid.sum(dim=1, keepdim=True).to(grouped.dtype)
    mean = torch.where(valid, grouped, zeros).sum(dim=1, keepdim=True) / count.clamp(min=1)
    sq_dev = torch.where(valid, (grouped - mean).square(), zeros)
    std = (sq_dev.sum(dim=1, keepdim=True) / (count - 1).clamp(min=1)).sqrt()
    inf = torch.full_like(grouped, float("inf"))
    high = torch.where(valid, grouped, -inf).amax(dim=1, keepdim=True)
    low = torch.where(valid, grouped, inf).amin(dim=1, keepdim=True)
    constant = (count < 2) | (high == low)
    return GroupStats(valid, count, mean, std, constant)


def _batch_mean_std(values: Tensor, valid: Tensor) -> tuple[Tensor, Tensor]:
    """Mean and Bessel-corrected std of ``values[valid]`` (0 and 0 if too few)."""
    stats = group_stats(torch.where(valid, values, torch.full_like(values, float("nan"))).reshape(1, -1))
    return stats.mean.reshape(()), stats.std.reshape(())


def _finish(advantages: Tensor, stats: GroupStats) -> Tensor:
    """Zero the advantages of NaN rewards and of constant groups."""
    keep = stats.valid & ~stats.constant
    return torch.where(keep, advantages, torch.zeros_like(advantages))


@ADVANTAGE_ESTIMATORS.register("grpo")
def grpo(grouped: Tensor, *, scale: str, epsilon: float) -> Tensor:
    """GRPO: ``(r - group mean) / (std + epsilon)``; std of the group, of the batch, or none."""
    stats = group_stats(grouped)
    centred = grouped - stats.mean
    if scale == "group":
        return _finish(centred / (stats.std + epsilon), stats)
    if scale == "batch":
        _, batch_std = _batch_mean_std(grouped, stats.valid)
        return _finish(centred / (batch_std + epsilon), stats)
    return _finish(centred, stats)  # scale == "none": Dr. GRPO


@ADVANTAGE_ESTIMATORS.register("dr_grpo")
def dr_grpo(grouped: Tensor, *, scale: str, epsilon: float) -> Tensor:
    """Dr. GRPO: ``r - group mean`` (no division by a std)."""
    stats = group_stats(grouped)
    return _finish(grouped - stats.mean, stats)


@ADVANTAGE_ESTIMATORS.register("rloo")
def rloo(grouped: Tensor, *, scale: str, epsilon: float) -> Tensor:
    """RLOO: ``r_i - mean of the other n - 1 valid rewards`` = n/(n-1) (r_i - mean)."""
    stats = group_stats(grouped)
    total = stats.mean * stats.count
    others_mean = (total - grouped) / (stats.count - 1).clamp(min=1)
    return _finish(grouped - others_mean, stats)


def _grouped(rewards: Tensor, group_size: int) -> Tensor:
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D (N,); got shape {tuple(rewards.shape)}")
    if group_size < 1 or rewards.numel() % group_size:
        raise ValueError(
            f"the number of rewards must be a multiple of group_size; got {rewards.numel()} and {group_size}"
        )
    if not rewards.is_floating_point():
        rewards = rewards.to(torch.float32)
    return rewards.detach().reshape(-1, group_size)


def run_rewards(rewards: Tensor, runs: Tensor, group_size: int) -> Tensor:
    """(M,) each run's reward from its rows' ``rewards`` (N,) (which share it), M = N rounded up to a multiple of
    ``group_size``; NaN for the numbers no row names (module docstring: "Runs of several samples")."""
    length = -(-rewards.numel() // group_size) * group_size
    out = rewards.new_full((length,), float("nan"))
    return out.scatter_reduce(0, runs, rewards, reduce="amax", include_self=False)  # (equal values: exact)


def compute_advantages(
    name: str, rewards: Tensor, group_size: int, *, scale: str = "group", epsilon: float = 1e-6,
    runs: Tensor | None = None,
) -> Tensor:
    """Advantages (N,) for outcome ``rewards`` (N,) whose consecutive ``group_size`` entries form a group.

    ``name`` is one of ``ADVANTAGE_ESTIMATORS.names()``: grpo, dr_grpo, rloo.
    ``scale`` picks grpo's std: the
    group's ("group"), the whole batch's ("batch"), or none ("none"); other
    estimators ignore it. Bessel-corrected std, ``(r - mean) / (std + epsilon)``;
    NaN rewards get 0 and are excluded from every statistic; constant groups
    and groups of one get 0. The result is detached, in the rewards' dtype.
    ``runs`` (N,) long: the run each entry is a sample of (module docstring); the statistics count runs and each
    entry gets its run's advantage. None: every entry is its own run.
    """
    estimator = ADVANTAGE_ESTIMATORS.get(name)
    if scale not in SCALES:
        raise ValueError(f"unknown advantage scale {scale!r}; valid: {', '.join(SCALES)}")
    if runs is None:
        return estimator(_grouped(rewards, group_size), scale=scale, epsilon=epsilon).reshape(-1)
    if runs.shape != rewards.shape:
        raise ValueError(f"runs must name one run per reward; got shapes {tuple(runs.shape)} and {tuple(rewards.shape)}")
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1; got {group_size}")
    per_run = run_rewards(rewards.detach() if rewards.is_floating_point() else rewards.detach().float(), runs, group_size)
    return estimator(_grouped(per_run, group_size), scale=scale, epsilon=epsilon).reshape(-1)[runs]


def advantage_stats(rewards: Tensor, group_size: int) -> dict[str, Tensor]:
    """Reward metrics, as 0-d tensors.

    - ``frac_reward_zero_std``: fraction of groups whose finite rewards all
      equal (groups that teach nothing; groups with no finite reward count).
    - ``reward_std``: mean within-group Bessel std, over groups with at least
      one finite reward (a group with one finite reward has std 0).
    - ``reward_mean``: mean finite reward; ``frac_reward_nan``: share of NaNs.
    """
    grouped = _grouped(rewards, group_size)
    stats = group_stats(grouped)
    scored = (stats.count > 0).to(grouped.dtype)
    return {
        "frac_reward_zero_std": stats.constant.to(grouped.dtype).mean(),
        "reward_std": (stats.std * scored).sum() / scored.sum().clamp(min=1),
        "reward_mean": (stats.mean * stats.count).sum() / stats.count.sum().clamp(min=1),
        "frac_reward_nan": (~stats.valid).to(grouped.dtype).mean(),
    }
