"""The configured algorithm resolved for the driver loop: every `auto` filled in from its spec, and beta's schedule.

`resolve(cfg)` turns `cfg.algorithm` plus the algorithm's `AlgorithmSpec`
(`cohort.algorithms.specs`: the advantage function, the default ratio level and
KL placement, whether a critic exists) into the `AlgorithmChoice` the loop reads;
`kl_controller(cfg)` builds beta's schedule (fixed or adaptive);
`LOSS_AGGREGATION` maps `algorithm.loss_type` to the aggregation of
`cohort.algorithms.aggregate_loss`. The loop never looks at the algorithm's name.
"""

from __future__ import annotations

from dataclasses import dataclass

from cohort.algorithms import AdaptiveKLController, FixedKLController
from cohort.algorithms.specs import ALGORITHMS, AlgorithmSpec

LOSS_AGGREGATION = {"grpo": "seq_mean_token_mean", "dapo": "token_mean", "bnpo": "bnpo", "dr_grpo": "seq_mean_token_sum_norm"}

POLICY_LOSS_OF_LEVEL = {"token": "ppo_clip", "sequence": "gspo", "sequence_sum": "seq_sum_clip"}


@dataclass(frozen=True)
class AlgorithmChoice:
    """The configured algorithm with every `auto` resolved: what the loop reads."""

    spec: AlgorithmSpec
    loss_name: str  # entry of cohort.algorithms.POLICY_LOSSES
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
    spec = ALGORITHMS.get(a.name)
    level = spec.ratio_level if a.importance_sampling_level == "auto" else a.importance_sampling_level
    placement = None if a.beta == 0 else (spec.kl_placement if a.kl_placement == "auto" else a.kl_placement)
    estimator = a.kl_estimator if a.kl_estimator != "auto" else ("k3" if placement == "loss" else "k1")
    measures_kl = placement == "reward" or (placement is not None and a.kl_controller == "adaptive")
    return AlgorithmChoice(spec, POLICY_LOSS_OF_LEVEL[level], placement, estimator, off_policy or measures_kl)


def kl_controller(cfg) -> FixedKLController | AdaptiveKLController:
    """beta's schedule: fixed, or adaptive towards algorithm.kl_target (Ziegler et al. 2019)."""
    a = cfg.algorithm
    if a.kl_controller == "adaptive":
        return AdaptiveKLController(a.beta, target=a.kl_target, horizon=a.kl_horizon)
    return FixedKLController(a.beta)
