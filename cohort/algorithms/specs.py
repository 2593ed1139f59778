"""What each algorithm changes in the driver loop, as data: one `AlgorithmSpec` per `algorithm.name`.

The registry `ALGORITHMS` lives here, beside the maths it names, so the config's
checks and the planner read it without importing the trainer; turning a config
into the loop's resolved choices is `cohort.trainer.algorithms`.

The trainer (cohort/trainer/trainer.py) is the same for every algorithm. It asks the spec of the
configured algorithm for four things and never looks at the name:

- `advantages`: a function `AdvantageInputs -> AdvantageOutputs` turning the
  generation batch's outcome rewards (plus, when present, the KL to the
  reference and the critic's values) into per-token advantages (N, T) and, for
  a critic, its targets. All of them share one signature; an algorithm that
  needs a new input widens `AdvantageInputs`.
- `ratio_level`: the importance ratio used when `algorithm.importance_sampling_level`
  is `auto` (token, sequence = GSPO's geometric mean, sequence_sum = TRL's RLOO).
- `kl_placement`: where the KL term goes when `algorithm.kl_placement` is `auto`.
- `needs_critic`: whether a value model is built and trained (one more timed
  phase of the same loop, `timing/critic_s`).

`cohort.trainer.algorithms.resolve(cfg)` turns the config plus the spec into the
`AlgorithmChoice` the loop reads (every `auto` filled in). Whether a reference model exists is not per algorithm: it is loaded
exactly when `algorithm.beta != 0`. The KL reaches the advantage functions
already estimated per token (`AdvantageInputs.kl`, the configured estimator of
the sampling policy's log-probs against the reference's, computed by the loop). Every spec is built from
its facts: validation and the planner read them
(`min_group_size`, `needs_critic`, `group_local`, `zero_for_constant_group`), written once in
cohort/algorithm_facts.py (pure data, so the planner reads them without torch).

The advantage functions (shapes: N completions, T = the batch's longest
completion; `mask` (N, T) is 1 on completion tokens that enter the loss):

- grpo / rloo (`_outcome`): with the KL in the reward, each completion's reward
  becomes ``r_i - beta * sum_t kl_t`` (TRL's RLOO form, k1 by default); then the
  outcome estimator of `cohort.algorithms` (grpo honours
  `algorithm.scale_rewards`; rloo is the leave-one-out baseline), broadcast over
  the completion's tokens.
- reinforce_pp / reinforce_pp_baseline (`_reinforce_pp`): token rewards are
  ``-beta * kl_t`` on every token plus the outcome reward (for _baseline: the
  reward minus its group mean) on the last; the reward-to-go with discount
  `gamma` is whitened over all active tokens of the batch (verl's form; the
  outcome-only per-completion estimators in `cohort.algorithms` whiten per
  completion instead).
- distill: the rewards' part only, GRPO's (`_outcome("grpo")`: 0 for a group of one or
  unscored completions); the teacher's per-token part, which needs the proximal
  policy's log-probs of each micro-batch, joins it in the loss
  (`cohort.algorithms.distill.distill_advantages`, weighted by teacher.reward_weight
  and teacher.kl_coef), so on-policy no forward pass is paid for the student's log-probs.
- ppo (`_ppo`): the same token rewards; GAE (`gamma`, `lam`) against the
  critic's values; advantages whitened over the batch's active tokens; returns
  = advantages (before whitening) + values are the critic's targets.

Runs of several samples (`AdvantageInputs.runs`: an agent run that rewrote its history is one row per model
call, every row with the run's reward): the group-relative parts (grpo, rloo, distill's rewards part,
reinforce_pp_baseline's group mean) take their statistics over runs, each run counted once, and give every row its
run's value (`compute_advantages(..., runs=)`); with the KL in an outcome reward, a run's KL is the sum over all its
rows' tokens. The per-token algorithms (reinforce_pp's reward-to-go, ppo's GAE against the critic's values of each
row) score every row in its own right, the run's reward on its last trained token, and whiten over every row's
tokens.

A completion no reward function could score (NaN) gets advantage 0 everywhere;
for ppo its returns are set to its own values, so the critic is not pulled
anywhere by it.

`LOSS_TYPES` is the other table the trainer reads: `algorithm.loss_type` (TRL's
names and meanings) to the policy-loss entry and the aggregation of
`cohort.algorithms`. grpo, dapo, bnpo and dr_grpo are aggregations of the
clipped surrogate whose ratio follows `importance_sampling_level`
(`POLICY_LOSS_OF_LEVEL`); cispo, sapo, luspo, vespo and gmpo name their own entry,
which fixes the ratio level (`importance_sampling_level` must be `auto` or that
level). Aggregations as TRL's: sapo and luspo average per sequence first (luspo's
entry already scales each sequence by its length), cispo and vespo take the
token mean of the whole step, gmpo the mean over sequences of its sequence loss.

Left out: process (per-step) rewards. (REINFORCE++'s k2-in-the-loss variant
needs no code: `algorithm.kl_placement=loss`, `algorithm.kl_estimator=k2`.)
"""


from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import Tensor

from cohort.algorithm_facts import FACTS
from cohort.algorithms.advantages import compute_advantages
from cohort.algorithms.kl import kl_in_reward
from cohort.algorithms.ppo import discounted_returns, gae
from cohort.algorithms.registry import Registry
from cohort.algorithms.stats import masked_mean, whiten


@dataclass(frozen=True)
class AdvantageInputs:
    """Everything an advantage function may use; tensors are (N, T) unless noted, detached."""

    rewards: Tensor  # (N,) outcome rewards, NaN = no reward function applied
    mask: Tensor  # float 0/1: completion tokens that enter the loss
    group_size: int
    kl: Tensor | None = None  # per-token estimate of KL(sampling policy || reference), when a reference exists
    kl_coef: float = 0.0  # beta for the KL in the reward (0: the KL is in the loss, or off)
    values: Tensor | None = None  # the critic's values at generation time
    scale: str = "group"  # grpo's std: group | batch | none
    gamma: float = 1.0
    lam: float = 1.0
    runs: Tensor | None = None  # (N,) long: the run each row is a sample of (runs 0..R-1, group_size per group); None: one each

    @property
    def kl_in_reward(self) -> bool:
        return self.kl_coef != 0 and self.kl is not None


@dataclass(frozen=True)
class AdvantageOutputs:
    advantages: Tensor  # (N, T), 0 at padding
    returns: Tensor | None = None  # (N, T) critic targets, or None without a critic
    metrics: dict[str, Tensor] = field(default_factory=dict)  # 0-d tensors


AdvantageFn = Callable[[AdvantageInputs], AdvantageOutputs]


@dataclass(frozen=True)
class AlgorithmSpec:
    name: str
    advantages: AdvantageFn
    ratio_level: str  # token | sequence | sequence_sum, used when importance_sampling_level = auto
    kl_placement: str  # loss | reward, used when kl_placement = auto
    needs_critic: bool
    min_group_size: int  # completions per prompt the advantages need (rollout.num_generations at least this)
    summary: str
    group_local: bool = False  # a group's advantages read only its own rewards (a streamed update is exact)
    zero_for_constant_group: bool = False  # a group whose rewards are all equal gets advantage 0 (dynamic sampling)


ALGORITHMS: Registry[AlgorithmSpec] = Registry("algorithm")


@dataclass(frozen=True)
class LossType:
    """What one `algorithm.loss_type` means: its policy-loss entry and aggregation."""

    policy_loss: str | None  # entry of POLICY_LOSSES; None: POLICY_LOSS_OF_LEVEL[the ratio level]
    aggregation: str  # entry of AGGREGATIONS
    ratio_level: str | None  # the ratio level the entry fixes (token | sequence); None: importance_sampling_level's
    hard_clip: bool  # the ppo clip applies: epsilon_low, delta and clip_ratio_c mean something


POLICY_LOSS_OF_LEVEL = {"token": "ppo_clip", "sequence": "gspo", "sequence_sum": "seq_sum_clip"}

LOSS_TYPES: dict[str, LossType] = {
    "grpo": LossType(None, "seq_mean_token_mean", None, hard_clip=True),
    "dapo": LossType(None, "token_mean", None, hard_clip=True),
    "bnpo": LossType(None, "bnpo", None, hard_clip=True),
    "dr_grpo": LossType(None, "seq_mean_token_sum_norm", None, hard_clip=True),
    "cispo": LossType("cispo", "token_mean", "token", hard_clip=False),
    "sapo": LossType("sapo", "seq_mean_token_mean", "token", hard_clip=False),
    "luspo": LossType("luspo", "seq_mean_token_mean", "sequence", hard_clip=True),
    "vespo": LossType("vespo", "token_mean", "token", hard_clip=False),
    # GMPO clips in log space (its eps bound the log-ratio); delta and the dual clip have nothing to cap there
    "gmpo": LossType("gmpo", "seq_mean_token_sum", "sequence", hard_clip=False),
}


def _outcome(estimator: str) -> AdvantageFn:
    """One advantage per completion from `compute_advantages(estimator)`, broadcast over its tokens."""

    def run(x: AdvantageInputs) -> AdvantageOutputs:
        rewards = x.rewards
        if x.kl_in_reward:
            kl = torch.where(x.mask > 0, x.kl, torch.zeros_like(x.kl)).sum(dim=-1)  # (N,)
            if x.runs is not None:  # a run's KL: the sum over all its rows, on each of them
                kl = torch.zeros_like(kl).index_add(0, x.runs, kl)[x.runs]
            rewards = rewards - x.kl_coef * kl  # NaN rewards stay NaN
        advantages = compute_advantages(estimator, rewards, x.group_size, scale=x.scale, runs=x.runs)  # (N,)
        return AdvantageOutputs(advantages[:, None] * x.mask)

    return run


def _token_rewards(x: AdvantageInputs, outcome: Tensor, mask: Tensor) -> Tensor:
    """(N, T): `outcome` (N,) on each row's last active token, minus beta * kl on every active token."""
    zeros = torch.zeros_like(mask)  # kl_in_reward with equal log-probs and beta 0 only places the outcome
    rewards = kl_in_reward(outcome, zeros, zeros, mask, beta=0.0)
    if x.kl_in_reward:
        rewards = rewards - x.kl_coef * torch.where(mask > 0, x.kl, torch.zeros_like(x.kl))
    return rewards


def _scorable(x: AdvantageInputs) -> tuple[Tensor, Tensor]:
    """(N,) bool: some reward function scored the completion; and the mask without the rows that none did."""
    finite = torch.isfinite(x.rewards)
    return finite, x.mask * finite[:, None].to(x.mask.dtype)


def _reinforce_pp(group_baseline: bool) -> AdvantageFn:
    """REINFORCE++: the whitened reward-to-go of the token rewards; optionally a group-mean baseline first."""

    def run(x: AdvantageInputs) -> AdvantageOutputs:
        finite, mask = _scorable(x)
        outcome = (compute_advantages("dr_grpo", x.rewards, x.group_size, runs=x.runs) if group_baseline  # r - group mean
                   else x.rewards)
        outcome = torch.where(finite, outcome, torch.zeros_like(outcome))
        returns = discounted_returns(_token_rewards(x, outcome, mask), mask, gamma=x.gamma)
        return AdvantageOutputs(whiten(returns, mask))

    return run


def _ppo(x: AdvantageInputs) -> AdvantageOutputs:
    """GAE against the critic's values, whitened; returns are the critic's targets."""
    if x.values is None:
        raise ValueError("ppo needs the critic's values in AdvantageInputs.values")
    finite, mask = _scorable(x)
    outcome = torch.where(finite, x.rewards, torch.zeros_like(x.rewards))
    advantages, returns = gae(_token_rewards(x, outcome, mask), x.values, mask, gamma=x.gamma, lam=x.lam)
    returns = torch.where(finite[:, None], returns, x.values * x.mask)  # unscorable: the critic keeps its values
    return AdvantageOutputs(whiten(advantages, mask), returns, {"critic/returns_mean": masked_mean(returns, mask)})


_ADVANTAGES = {"grpo": _outcome("grpo"), "rloo": _outcome("rloo"), "reinforce_pp": _reinforce_pp(group_baseline=False),
               "reinforce_pp_baseline": _reinforce_pp(group_baseline=True), "ppo": _ppo,
               "distill": _outcome("grpo")}  # the rewards' part; the teacher's per-token part joins in the loss (distill.py)
for _name, _facts in FACTS.items():  # the facts are written once, in cohort/algorithm_facts.py
    ALGORITHMS.add(_name, AlgorithmSpec(_name, _ADVANTAGES[_name], **dataclasses.asdict(_facts)))
