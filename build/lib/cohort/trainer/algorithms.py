"""The configured algorithm resolved for the driver loop: every `auto` filled in from its spec, and beta's schedule.

`resolve(cfg)` turns `cfg.algorithm` plus the algorithm's `AlgorithmSpec`
(`cohort.algorithms.specs`: the advantage function, the default ratio level and
KL placement, whether a critic exists) into the `AlgorithmChoice` the loop reads;
`kl_controller(cfg)` builds beta's schedule (fixed or adaptive). `algorithm.loss_type`
picks the policy loss and its aggregation from `LOSS_TYPES` (specs.py), and
`loss_params` are the keyword arguments of `cohort.algorithms.policy_loss` from
the config. The loop never looks at the algorithm's or the loss type's name.
"""

from __future__ import annotations

from dataclasses import dataclass

from cohort.algorithms import AdaptiveKLController, FixedKLController
from cohort.algorithms.specs import ALGORITHMS, LOSS_TYPES, POLICY_LOSS_OF_LEVEL, AlgorithmSpec


@dataclass(frozen=True)
class AlgorithmChoice:
    """The configured algorithm with every `auto` resolved: what the loop reads."""

    spec: AlgorithmSpec
    loss_name: str  # entry of cohort.algorithms.POLICY_LOSSES
    aggregation: str  # entry of cohort.algorithms.AGGREGATIONS
    loss_params: dict  # policy_loss's keyword arguments from the config (clip ranges, dual clip, per-entry parameters)
    kl_placement: str | None  # loss | reward; None when beta = 0 (no KL term, no reference model)
    kl_estimator: str  # entry of cohort.algorithms.KL_ESTIMATORS
    score_old_logp: bool  # compute the sampling policy's log-probs at generation time (one no-grad pass)


def resolve(cfg, *, off_policy: bool) -> AlgorithmChoice:
    """Fill in the `auto` fields of `cfg.algorithm` from the spec of `cfg.algorithm.name`.

    The sampling policy's log-probs are computed at generation time when a batch is
    reused off-policy (the ratio's denominator) and whenever the KL to the reference
    is measured there: in the reward, or for the adaptive controller.
    """
    a = cfg.algorithm
    spec, loss_type = ALGORITHMS.get(a.name), LOSS_TYPES[a.loss_type]
    level = spec.ratio_level if a.importance_sampling_level == "auto" else a.importance_sampling_level
    loss_name = loss_type.policy_loss or POLICY_LOSS_OF_LEVEL[level]
    placement = None if a.beta == 0 else (spec.kl_placement if a.kl_placement == "auto" else a.kl_placement)
    estimator = a.kl_estimator if a.kl_estimator != "auto" else ("k3" if placement == "loss" else "k1")
    measures_kl = placement == "reward" or (placement is not None and a.kl_controller == "adaptive")
    return AlgorithmChoice(spec, loss_name, loss_type.aggregation, loss_params(a), placement, estimator,
                           off_policy or measures_kl)


def loss_params(a) -> dict:
    """`policy_loss`'s keyword arguments from `cfg.algorithm` (each entry reads its own; TRL's cispo caps at epsilon_high)."""
    return dict(eps_low=a.epsilon_low, eps_high=a.epsilon_high, delta=a.delta, dual_clip=a.clip_ratio_c,
                sapo_tau_pos=a.sapo_temperature_pos, sapo_tau_neg=a.sapo_temperature_neg, cispo_cap=a.epsilon_high,
                vespo_k_pos=a.vespo_k_pos, vespo_lambda_pos=a.vespo_lambda_pos, vespo_k_neg=a.vespo_k_neg,
                vespo_lambda_neg=a.vespo_lambda_neg)


def kl_controller(cfg) -> FixedKLController | AdaptiveKLController:
    """beta's schedule: fixed, or adaptive towards algorithm.kl_target (Ziegler et al. 2019)."""
    a = cfg.algorithm
    if a.kl_controller == "adaptive":
        return AdaptiveKLController(a.beta, target=a.kl_target, horizon=a.kl_horizon)
    return FixedKLController(a.beta)
