"""Policy-gradient losses: per-token surrogate losses behind one registry.

Every entry takes one `LossInputs` and returns `TokenLosses` (the per-token
loss and which tokens its clipping touched); `policy_loss` builds the inputs,
calls the entry, aggregates with `aggregate_loss` and computes the metrics.

Entries (r = pi_theta / pi_old per token, A = advantage, all losses minimised):
- ``ppo_clip``: ``max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high))`` (PPO,
  asymmetric "clip-higher" from DAPO). Optional dual clip (Ye et al. 2020):
  for A < 0 the loss is capped at ``-A c`` (``dual_clip=c`` > 1; off by
  default, whereas verl always applies c = 3). Optional ``delta`` (TRL's
  two-sided clipping): the unclipped ratio is capped at delta (> 1 + eps_high).
- ``gspo``: the ppo_clip objective on the sequence-level ratio
  ``s = exp(mean over the row's active tokens of (logp - old_logp))``, written
  per token as ``s_t = sg(s) * exp(logp_t - sg(logp_t))`` (GSPO-token, Zheng et
  al. 2025): its value is s on every token and its gradient per token is
  ``s * grad logp_t``. With a per-sequence advantage this has exactly the
  gradient of TRL's ``importance_sampling_level="sequence"`` under every
  aggregation. GSPO uses tiny epsilons (paper: eps_low=3e-4, eps_high=4e-4).
- ``seq_sum_clip``: the ppo_clip objective on the sequence ratio
  ``s = exp(sum over the row's active tokens of (logp - old_logp))``, the
  product of the token ratios: the completion is one action, as in TRL's
  RLOO. Written like gspo (gradient ``s * grad logp_t`` on every token), and
  each token carries ``1/T_row`` of the sequence loss's value, so the row sum
  is TRL's per-sequence loss in value and gradient (``seq_mean_token_sum``
  aggregation gives TRL's mean over sequences exactly).
- ``cispo``: ``-sg(min(r, c)) * A * logp`` (MiniMax-M1): the IS weight is
  capped from above only and never blocks the gradient. ``c = cispo_cap``
  when given (TRL passes its ``epsilon_high`` itself: ScaleRL's eps_max,
  recommended 5.0), else ``1 + eps_high`` (MiniMax's form). eps_low is not
  used (MiniMax set no lower bound; TRL's cispo neither).
- ``sapo``: ``-A * 4/tau * sigmoid(tau (r - 1))`` (SAPO, Gao et al. 2025), a soft
  gate instead of a hard clip; ``tau = sapo_tau_pos`` if A > 0 else
  ``sapo_tau_neg`` (defaults 1.0 / 1.05 as in the paper and TRL). At r = 1 its
  gradient equals the unclipped policy gradient. No hard clip: clip metrics 0.
- ``luspo``: the gspo objective with each token's loss multiplied by its row's
  active-token count ``|y|`` (LUSPO): under ``seq_mean_token_mean`` a row
  contributes ``|y| * l(s)`` instead of GSPO's ``l(s)``, so long completions
  are no longer down-weighted (TRL's ``luspo``: per-sequence sums, averaged).
- ``vespo``: ``-sg(phi(w)) * A * logp`` (VESPO) with the sequence ratio
  ``w = exp(sum of the row's token log-ratios)`` (clamped to [1e-8, e^20])
  and the Gamma-shaped weight ``phi(w) = exp(lam + k log w - lam w)``
  (= 1 at w = 1, largest there for k = lam, falling off on both sides);
  ``k, lam = vespo_k_pos, vespo_lambda_pos`` where A >= 0, else the ``_neg``
  pair (TRL's defaults 2, 3 and 3, 2). No hard clip; ``ratio`` is w.

- ``gmpo``: GMPO (Zhao et al. 2025, arXiv 2507.20673, verl's ``geo_mean``): the
  sequence ratio is the geometric mean of the token ratios with each token's
  log-ratio clipped sign-aware in log space, ``c_t = sgn(A) min(sgn(A) lr_t,
  sgn(A) clamp(lr_t, -eps_low, eps_high))`` (the pessimistic side, as PPO's
  min), ``s = exp(mean over the row's active tokens of c_t)``, and the
  sequence loss is ``-A_row s`` with ``A_row`` the row's mean advantage.
  Written per token like seq_sum_clip: each active token carries ``1/T_row``
  of the row's loss value, and the gradient is the sequence loss's
  (``-A_row s dc_t / T_row`` per token, zero where c_t is clipped), so
  ``seq_mean_token_sum`` aggregation is the mean over sequences (verl
  averages the batch's rows and ignores loss_agg_mode). Its eps are bounds of
  the log-ratio (the paper: 0.4, a ratio range of (e^-0.4, e^0.4)).

The log-ratio is clamped to [-20, 20] before every exp so a wild token cannot
produce inf * 0 = NaN; at that size the clip has long zeroed its gradient.

Metrics (0-d tensors, detached, means over this micro-batch's active tokens):
``clip_ratio/low`` (r < 1 - eps_low with A < 0: the clip removed the gradient),
``clip_ratio/high`` (r > 1 + eps_high with A > 0; for cispo: the weight was
capped), ``clip_ratio/region`` (either), ``clip_ratio/dual`` (the dual clip
or delta cap engaged), ``ratio/mean``, ``ratio/max`` (of the ratio the entry
uses: per token, or per sequence for gspo) and ``approx_kl``, the mean of
``r - 1 - log r`` with the per-token r: an estimate of KL(pi_old || pi_theta).

``token_weights`` (e.g. the `rollout_correction` weights) multiply the
per-token loss before aggregation, as TRL multiplies its importance-sampling
ratio into ``per_token_loss``. The mask is read as 0/1; weights go here, not
into the mask.

Left out: the KL-to-reference term (add ``beta * aggregate_loss(kl_penalty(...))``,
aggregation is linear) and the entropy bonus (the trainer subtracts
``coef * aggregate_loss(entropy, ...)``). cispo, sapo and vespo exist at the
token level only (TRL also allows cispo and sapo on GSPO's sequence ratio).
TRL folds the engine-mismatch weights into VESPO's w; here every entry's
``token_weights`` multiply the per-token loss alike.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Callable

import torch
from torch import Tensor

from .aggregation import aggregate_loss
from .registry import Registry
from .stats import float_mask, masked_max, masked_mean, masked_sum

LOG_RATIO_LIMIT = 20.0
VESPO_MIN_LOG_WEIGHT = math.log(1e-8)  # VESPO's floor of w (its reference code's)


@dataclass(frozen=True)
class LossParams:
    """Every policy loss's parameters with their defaults, declared once: `LossInputs` carries them, `policy_loss`
    takes them as keywords, the trainer fills them from `cfg.algorithm` (cohort/trainer/algorithms.py `loss_params`,
    whose defaults map onto these: tests/algorithms/test_loss_params.py). Each entry reads only its own (module
    docstring)."""

    eps_low: float = 0.2
    eps_high: float = 0.2
    dual_clip: float | None = None
    delta: float | None = None
    sapo_tau_pos: float = 1.0
    sapo_tau_neg: float = 1.05
    cispo_cap: float | None = None  # None: 1 + eps_high
    vespo_k_pos: float = 2.0
    vespo_lambda_pos: float = 3.0
    vespo_k_neg: float = 3.0
    vespo_lambda_neg: float = 2.0


LOSS_PARAMETERS = tuple(f.name for f in fields(LossParams))


@dataclass(frozen=True, kw_only=True)
class LossInputs(LossParams):
    """What every policy-loss entry receives: the tensors, (B, T) each, ``mask`` float 0/1, and the `LossParams`."""

    logp: Tensor
    old_logp: Tensor
    advantages: Tensor  # (B, T): per-sequence advantages already broadcast
    mask: Tensor


@dataclass(frozen=True)
class TokenLosses:
    """What every policy-loss entry returns. All (B, T); only ``loss`` carries gradient."""

    loss: Tensor
    ratio: Tensor  # the ratio the entry used, detached
    clipped_low: Tensor  # bool
    clipped_high: Tensor  # bool
    capped: Tensor  # bool: dual clip / delta engaged


PolicyLoss = Callable[[LossInputs], TokenLosses]
POLICY_LOSSES: Registry[PolicyLoss] = Registry("policy loss")


def _log_ratio(inputs: LossInputs) -> Tensor:
    return (inputs.logp - inputs.old_logp).clamp(min=-LOG_RATIO_LIMIT, max=LOG_RATIO_LIMIT)


def _clipped_surrogate(log_ratio: Tensor, inputs: LossInputs) -> TokenLosses:
    """PPO's pessimistic clipped objective for a given (B, T) log-ratio."""
    ratio = torch.exp(log_ratio)
    adv = inputs.advantages
    unclipped = ratio if inputs.delta is None else ratio.clamp(max=inputs.delta)
    clipped = ratio.clamp(min=1.0 - inputs.eps_low, max=1.0 + inputs.eps_high)
    loss = torch.maximum(-adv * unclipped, -adv * clipped)
    no = torch.zeros_like(adv, dtype=torch.bool)
    capped = no if inputs.delta is None else (adv < 0) & (ratio > inputs.delta)
    if inputs.dual_clip is not None:
        dual_cap = -adv * inputs.dual_clip
        loss = torch.where(adv < 0, torch.minimum(loss, dual_cap), loss)
        capped = capped | ((adv < 0) & (ratio > inputs.dual_clip))
    ratio = ratio.detach()
    low = (ratio < 1.0 - inputs.eps_low) & (adv < 0)
    high = (ratio > 1.0 + inputs.eps_high) & (adv > 0)
    return TokenLosses(loss, ratio, low, high, capped)


@POLICY_LOSSES.register("ppo_clip")
def ppo_clip(inputs: LossInputs) -> TokenLosses:
    """Token-level clipped surrogate (PPO / GRPO / DAPO clip-higher)."""
    return _clipped_surrogate(_log_ratio(inputs), inputs)


def sequence_log_ratio(logp: Tensor, old_logp: Tensor, mask: Tensor) -> Tensor:
    """(B, 1) mean over each row's active tokens of ``logp - old_logp`` (0 for an empty row)."""
    return masked_mean(logp - old_logp, mask, dim=-1).unsqueeze(-1)


@POLICY_LOSSES.register("gspo")
def gspo(inputs: LossInputs) -> TokenLosses:
    """GSPO-token: sequence-level ratio value, per-token gradient ``s * grad logp_t``."""
    seq = sequence_log_ratio(inputs.logp, inputs.old_logp, inputs.mask)
    seq = seq.detach().clamp(min=-LOG_RATIO_LIMIT, max=LOG_RATIO_LIMIT)
    log_ratio = seq + inputs.logp - inputs.logp.detach()  # value: seq; gradient: grad logp
    return _clipped_surrogate(log_ratio, inputs)


@POLICY_LOSSES.register("seq_sum_clip")
def seq_sum_clip(inputs: LossInputs) -> TokenLosses:
    """Sequence ratio ``exp(sum of token log-ratios)`` (TRL's RLOO); the row's loss value split evenly over its tokens."""
    seq = masked_sum(inputs.logp - inputs.old_logp, inputs.mask, dim=-1).unsqueeze(-1)  # (B, 1)
    seq = seq.detach().clamp(min=-LOG_RATIO_LIMIT, max=LOG_RATIO_LIMIT)
    out = _clipped_surrogate(seq + inputs.logp - inputs.logp.detach(), inputs)  # value: seq; gradient: grad logp
    tokens = inputs.mask.sum(dim=-1, keepdim=True).clamp(min=1)  # (B, 1)
    loss = out.loss - out.loss.detach() + out.loss.detach() / tokens  # gradient unchanged, row sum = sequence loss
    return TokenLosses(loss, out.ratio, out.clipped_low, out.clipped_high, out.capped)


@POLICY_LOSSES.register("cispo")
def cispo(inputs: LossInputs) -> TokenLosses:
    """CISPO: stop-gradient IS weight ``min(r, cap)`` times ``-A * logp``; cap = cispo_cap or 1 + eps_high."""
    cap = inputs.cispo_cap if inputs.cispo_cap is not None else 1.0 + inputs.eps_high
    ratio = torch.exp(_log_ratio(inputs)).detach()
    loss = -ratio.clamp(max=cap) * inputs.advantages * inputs.logp
    no = torch.zeros_like(ratio, dtype=torch.bool)
    return TokenLosses(loss, ratio, no, ratio > cap, no)


@POLICY_LOSSES.register("sapo")
def sapo(inputs: LossInputs) -> TokenLosses:
    """SAPO: soft gate ``4/tau * sigmoid(tau (r - 1))`` in place of the hard clip."""
    ratio = torch.exp(_log_ratio(inputs))
    adv = inputs.advantages
    tau_pos = torch.full_like(ratio, inputs.sapo_tau_pos)
    tau = torch.where(adv > 0, tau_pos, torch.full_like(ratio, inputs.sapo_tau_neg))
    gate = torch.sigmoid(tau * (ratio - 1.0)) * 4.0 / tau
    no = torch.zeros_like(ratio, dtype=torch.bool)
    return TokenLosses(-adv * gate, ratio.detach(), no, no, no)


@POLICY_LOSSES.register("luspo")
def luspo(inputs: LossInputs) -> TokenLosses:
    """LUSPO: gspo's per-token loss times the row's active-token count (each sequence's loss scaled by its length)."""
    out = gspo(inputs)
    length = inputs.mask.sum(dim=-1, keepdim=True)  # (B, 1)
    return TokenLosses(out.loss * length, out.ratio, out.clipped_low, out.clipped_high, out.capped)


@POLICY_LOSSES.register("vespo")
def vespo(inputs: LossInputs) -> TokenLosses:
    """VESPO: stop-gradient Gamma weight ``phi(w)`` of the sequence ratio w times ``-A * logp``."""
    token = _log_ratio(inputs).detach()
    log_w = masked_sum(token, inputs.mask, dim=-1).unsqueeze(-1)  # (B, 1): log of the product of token ratios
    log_w = log_w.clamp(min=VESPO_MIN_LOG_WEIGHT, max=LOG_RATIO_LIMIT)
    adv = inputs.advantages
    nonneg = adv >= 0
    k = torch.where(nonneg, inputs.vespo_k_pos, inputs.vespo_k_neg).to(adv.dtype)  # (B, T)
    lam = torch.where(nonneg, inputs.vespo_lambda_pos, inputs.vespo_lambda_neg).to(adv.dtype)
    phi = torch.exp(lam + k * log_w - lam * torch.exp(log_w)).nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)
    no = torch.zeros_like(adv, dtype=torch.bool)
    return TokenLosses(-phi * adv * inputs.logp, torch.exp(log_w).expand_as(adv), no, no, no)


@POLICY_LOSSES.register("gmpo")
def gmpo(inputs: LossInputs) -> TokenLosses:
    """GMPO: the geometric mean of sign-aware log-clipped token ratios per sequence, times the row's advantage."""
    log_ratio, adv, mask = _log_ratio(inputs), inputs.advantages, inputs.mask  # (B, T) each
    sign = torch.sign(adv)
    bounded = log_ratio.clamp(min=-inputs.eps_low, max=inputs.eps_high)
    clipped_lr = sign * torch.minimum(sign * log_ratio, sign * bounded)  # the pessimistic side; 0 where A = 0
    tokens = mask.sum(dim=-1, keepdim=True).clamp(min=1)  # (B, 1)
    seq_ratio = torch.exp(masked_sum(clipped_lr, mask, dim=-1).unsqueeze(-1) / tokens)  # (B, 1)
    seq_adv = masked_sum(adv, mask, dim=-1).unsqueeze(-1) / tokens  # (B, 1): the sequence-level advantage
    seq_loss = -seq_adv * seq_ratio  # (B, 1)
    term = -seq_adv * seq_ratio.detach() * clipped_lr / tokens  # (B, T): carries the sequence loss's gradient
    loss = (seq_loss / tokens).detach().expand_as(adv) + term - term.detach()
    low = (adv < 0) & (log_ratio < -inputs.eps_low)
    high = (adv > 0) & (log_ratio > inputs.eps_high)
    no = torch.zeros_like(adv, dtype=torch.bool)
    return TokenLosses(loss, seq_ratio.detach().expand_as(adv), low.detach(), high.detach(), no)


def _check(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor) -> Tensor:
    """Validate shapes; return advantages broadcast to (B, T)."""
    if logp.dim() != 2 or old_logp.shape != logp.shape or mask.shape != logp.shape:
        raise ValueError(
            f"logp, old_logp and mask must share a (B, T) shape; got {tuple(logp.shape)}, "
            f"{tuple(old_logp.shape)}, {tuple(mask.shape)}"
        )
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(-1)
    if advantages.shape not in ((logp.shape[0], 1), logp.shape):
        raise ValueError(f"advantages must be (B,) or (B, T); got {tuple(advantages.shape)}")
    return advantages.detach().to(logp.dtype).expand(logp.shape)


def _metrics(out: TokenLosses, inputs: LossInputs) -> dict[str, Tensor]:
    mask = inputs.mask
    token_log_ratio = _log_ratio(inputs).detach()

    def frac(flags: Tensor) -> Tensor:
        return masked_mean(flags.to(mask.dtype), mask)

    return {
        "clip_ratio/low": frac(out.clipped_low),
        "clip_ratio/high": frac(out.clipped_high),
        "clip_ratio/region": frac(out.clipped_low | out.clipped_high),
        "clip_ratio/dual": frac(out.capped),
        "ratio/mean": masked_mean(out.ratio, mask),
        "ratio/max": masked_max(out.ratio, mask),
        "approx_kl": masked_mean(torch.expm1(token_log_ratio) - token_log_ratio, mask),
    }


def _check_params(x: LossInputs) -> None:
    """The entries' parameters in range (the config is checked before anything loads; this guards direct calls)."""
    if x.dual_clip is not None and x.dual_clip <= 1.0:
        raise ValueError(f"dual_clip must be > 1 (verl uses 3.0); got {x.dual_clip}")
    if x.delta is not None and x.delta <= 1.0 + x.eps_high:
        raise ValueError(f"delta must be > 1 + eps_high = {1.0 + x.eps_high}; got {x.delta}")
    if min(x.vespo_lambda_pos, x.vespo_lambda_neg) <= 0 or min(x.vespo_k_pos, x.vespo_k_neg) < 0:
        raise ValueError("vespo's lambdas must be > 0 and its k's >= 0 (TRL: k 2/3, lambda 3/2); got "
                         f"k {x.vespo_k_pos}/{x.vespo_k_neg}, lambda {x.vespo_lambda_pos}/{x.vespo_lambda_neg}")


def policy_loss(
    name: str,
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    token_weights: Tensor | None = None,
    aggregation: str = "token_mean",
    max_length: int | None = None,
    num_items: Tensor | float | None = None,
    **params: float | None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Scalar policy loss and its metrics.

    ``name``: ppo_clip | gspo | seq_sum_clip | cispo | sapo | luspo | vespo | gmpo (the
    per-entry parameters, ``**params``, are `LossParams`' fields, each read only by its entry; module docstring). ``logp`` (B, T) carries the
    gradient; ``old_logp`` (B, T) is the sampling policy's (pass
    ``logp.detach()`` on-policy); ``advantages`` (B,) or (B, T); ``mask``
    (B, T) bool or float, read as 0/1. ``token_weights`` (B, T), optional:
    detached per-token multipliers of the loss before aggregation (the
    `rollout_correction` weights). ``aggregation``, ``max_length``,
    ``num_items``: see `aggregate_loss`. Metrics are detached 0-d tensors
    (module docstring).
    """
    entry = POLICY_LOSSES.get(name)
    unknown = sorted(set(params) - set(LOSS_PARAMETERS))
    if unknown:
        raise TypeError(f"policy_loss got unknown parameters {unknown}; the loss parameters are {list(LOSS_PARAMETERS)}")
    inputs = LossInputs(logp=logp, old_logp=old_logp.detach(), advantages=_check(logp, old_logp, advantages, mask),
                        mask=float_mask(mask, logp), **params)
    _check_params(inputs)
    out = entry(inputs)
    per_token = out.loss
    if token_weights is not None:
        if token_weights.shape != logp.shape:
            raise ValueError(f"token_weights must be (B, T) = {tuple(logp.shape)}; got {tuple(token_weights.shape)}")
        per_token = per_token * token_weights.detach().to(per_token.dtype)
    loss = aggregate_loss(per_token, inputs.mask, aggregation, max_length=max_length, num_items=num_items)
    return loss, _metrics(out, inputs)
