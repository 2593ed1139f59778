"""cohort.algorithms: the maths of RL from verifiable rewards, as pure tensor functions.

Tensors in, tensors (and tensor metrics) out: no config objects, no
``.item()``, no collectives. Each kind of piece sits behind one registry whose
entries share a signature, so the trainer picks them by name:

- outcome advantages (`advantages.py`): grpo, dr_grpo, rloo via
  `compute_advantages`; `advantage_stats` (REINFORCE++'s token-level ones are
  in `specs.py`);
- policy losses (`losses.py`): ppo_clip, gspo, seq_sum_clip, cispo, sapo, luspo, vespo via
  `policy_loss`;
- KL estimators (`kl.py`): k1, k2, k3, low_var_kl via `kl_penalty`; `kl_in_reward`;
- aggregations (`aggregation.py`): token_mean, seq_mean_token_mean,
  seq_mean_token_sum, seq_mean_token_sum_norm, bnpo via `aggregate_loss`;
- on-policy distillation's per-token advantage (`distill.py`): `distill_advantages`;
- rollout correction (`correction.py`), entropies (`entropy.py`), PPO's GAE,
  value loss and KL controllers (`ppo.py`), masked statistics (`stats.py`);
- what each algorithm (grpo, rloo, reinforce_pp, ppo, ...) changes in the driver loop,
  as data (`specs.py`: `ALGORITHMS`, `AdvantageInputs`), imported from there.

The conventions (which std, where epsilon sits, NaN rewards, what "sequence
level" means) are in each module's docstring and in docs/algorithms.md.
"""

from .advantages import ADVANTAGE_ESTIMATORS, advantage_stats, compute_advantages
from .aggregation import AGGREGATIONS, aggregate_loss, aggregation_count
from .correction import rollout_correction
from .distill import distill_advantages
from .entropy import entropy_from_logits, top_entropy_mask
from .kl import KL_ESTIMATORS, kl_in_reward, kl_penalty
from .losses import LOSS_PARAMETERS, POLICY_LOSSES, LossInputs, LossParams, TokenLosses, policy_loss
from .ppo import AdaptiveKLController, FixedKLController, discounted_returns, gae, value_loss
from .registry import Registry
from .stats import masked_mean, whiten

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "AGGREGATIONS",
    "AdaptiveKLController",
    "FixedKLController",
    "KL_ESTIMATORS",
    "LOSS_PARAMETERS",
    "LossInputs",
    "LossParams",
    "POLICY_LOSSES",
    "Registry",
    "TokenLosses",
    "advantage_stats",
    "aggregate_loss",
    "aggregation_count",
    "compute_advantages",
    "discounted_returns",
    "distill_advantages",
    "entropy_from_logits",
    "gae",
    "kl_in_reward",
    "kl_penalty",
    "masked_mean",
    "policy_loss",
    "rollout_correction",
    "top_entropy_mask",
    "value_loss",
    "whiten",
]
