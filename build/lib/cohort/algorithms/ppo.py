"""PPO pieces: GAE, discounted returns, the clipped value loss, KL controllers.

GAE (Schulman et al. 2016), per row, walking backwards over active tokens:
``delta_t = r_t + gamma * V_next - V_t``, ``A_t = delta_t + gamma * lam * A_next``,
where "next" is the next *active* token (0 after the last one: the episode
ends there). Masked positions are skipped, not treated as episode ends, so a
mask with holes (tool output inside a multi-turn completion) carries the
running values across the hole; with ordinary right-padding this is the
textbook recursion. Padded rewards and values never enter the sums, and the
outputs are 0 at padded positions. ``returns = advantages + values``. The
advantages are raw; whiten them with `whiten` if wanted. Both are detached:
they are targets.

`discounted_returns` is GAE with zero values and lam = 1: the reward-to-go
``G_t = sum_k gamma^k r_{t+k}``, which REINFORCE++ with a KL-in-reward term
whitens into token advantages.

`value_loss`: ``0.5 * max((V - R)^2, (V_clip - R)^2)`` per token with
``V_clip = V_old + clip(V - V_old, -c, c)`` (the PPO2 / verl / TRL form; the
1/2 makes the gradient ``V - R``), aggregated like the policy loss.

KL controllers (Ziegler et al. 2019, "Fine-Tuning Language Models from Human
Preferences"): `FixedKLController` keeps beta; `AdaptiveKLController` moves it
by ``beta *= 1 + clip(KL / target - 1, -0.2, 0.2) * n_steps / horizon``. They
hold one float of state and are not pure functions; ``update`` takes a float
or a 0-d tensor (converted with ``float()``; call it once per step, outside
the maths). ``state_dict()`` saves the current coefficient; ``load_state_dict``
restores only that, so a changed target or horizon in the config wins on resume.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .aggregation import aggregate_loss
from .stats import float_mask, masked_mean


def gae(
    token_rewards: Tensor, values: Tensor, mask: Tensor, *, gamma: float, lam: float
) -> tuple[Tensor, Tensor]:
    """Generalised advantage estimates and returns, both (B, T), 0 at padded positions.

    ``token_rewards``, ``values``, ``mask``: (B, T); the mask is bool or float,
    right-padded or with holes (skipped). Detached outputs.
    """
    if not (token_rewards.shape == values.shape == mask.shape) or token_rewards.dim() != 2:
        raise ValueError(
            f"token_rewards, values and mask must share a (B, T) shape; got {tuple(token_rewards.shape)}, "
            f"{tuple(values.shape)}, {tuple(mask.shape)}"
        )
    rewards = token_rewards.detach()
    values = values.detach().to(rewards.dtype)
    active = mask != 0
    advantages = torch.zeros_like(rewards)
    next_value = torch.zeros_like(rewards[:, 0])  # (B,) value of the next active token
    next_advantage = torch.zeros_like(rewards[:, 0])  # (B,) its advantage
    for t in reversed(range(rewards.shape[1])):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        advantage = delta + gamma * lam * next_advantage
        here = active[:, t]
        next_value = torch.where(here, values[:, t], next_value)
        next_advantage = torch.where(here, advantage, next_advantage)
        advantages[:, t] = torch.where(here, advantage, torch.zeros_like(advantage))
    returns = torch.where(active, advantages + values, torch.zeros_like(advantages))
    return advantages, returns


def discounted_returns(token_rewards: Tensor, mask: Tensor, *, gamma: float = 1.0) -> Tensor:
    """Reward-to-go (B, T) over active tokens (holes skipped); 0 at padded positions."""
    advantages, _ = gae(token_rewards, torch.zeros_like(token_rewards), mask, gamma=gamma, lam=1.0)
    return advantages


def value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    mask: Tensor,
    *,
    cliprange_value: float,
    aggregation: str = "token_mean",
    max_length: int | None = None,
    num_items: Tensor | float | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Clipped value loss ``0.5 * max((V - R)^2, (V_clip - R)^2)``, aggregated; and metrics.

    All inputs (B, T); ``values`` carries the gradient. Metrics (0-d, detached):
    ``value/clip_frac`` (tokens where the clipped error is the larger one),
    ``value/mean``, ``value/error`` (mean squared error of the unclipped values).
    """
    if not (values.shape == old_values.shape == returns.shape == mask.shape):
        raise ValueError("values, old_values, returns and mask must share a (B, T) shape")
    mask_f = float_mask(mask, values)
    old_values = old_values.detach()
    returns = returns.detach()
    clipped = old_values + (values - old_values).clamp(min=-cliprange_value, max=cliprange_value)
    error = (values - returns).square()
    error_clipped = (clipped - returns).square()
    per_token = 0.5 * torch.maximum(error, error_clipped)
    loss = aggregate_loss(per_token, mask_f, aggregation, max_length=max_length, num_items=num_items)
    metrics = {
        "value/clip_frac": masked_mean((error_clipped > error).to(mask_f.dtype), mask_f),
        "value/mean": masked_mean(values.detach(), mask_f),
        "value/error": masked_mean(error.detach(), mask_f),
    }
    return loss, metrics


class FixedKLController:
    """A constant KL coefficient with the controller interface."""

    def __init__(self, coef: float) -> None:
        self.value = float(coef)

    def update(self, current_kl: float | Tensor, n_steps: int) -> None:
        """No change: the coefficient is fixed."""

    def state_dict(self) -> dict[str, float]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.value = float(state["value"])


class AdaptiveKLController:
    """Ziegler et al. 2019: steer the KL towards ``target`` over ``horizon`` samples."""

    def __init__(self, init_coef: float, target: float, horizon: float) -> None:
        if target <= 0 or horizon <= 0:
            raise ValueError(f"target and horizon must be > 0; got {target} and {horizon}")
        self.value = float(init_coef)
        self.target = float(target)
        self.horizon = float(horizon)

    def update(self, current_kl: float | Tensor, n_steps: int) -> None:
        """``value *= 1 + clip(current_kl / target - 1, -0.2, 0.2) * n_steps / horizon``."""
        proportional_error = min(max(float(current_kl) / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + proportional_error * n_steps / self.horizon

    def state_dict(self) -> dict[str, float]:
        return {"value": self.value, "target": self.target, "horizon": self.horizon}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.value = float(state["value"])
