"""What the planner and validation know of each algorithm, as pure data (no torch, nothing else of cohort).

`cohort.algorithms.specs` builds each `AlgorithmSpec` from these facts and its advantage function, so every fact is
written once, here; `cohort.plan` and `cohort.plan.validate` read them without loading torch (`cohort plan` and the
config checks stay light).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class AlgorithmFacts:
    ratio_level: str  # token | sequence | sequence_sum, used when algorithm.importance_sampling_level = auto
    kl_placement: str  # loss | reward, used when algorithm.kl_placement = auto
    needs_critic: bool  # a value model is built and trained beside the policy
    min_group_size: int  # completions per prompt the advantages need (rollout.num_generations at least this)
    summary: str
    group_local: bool = False  # a group's advantages read only its own rewards (a streamed update is exact)
    zero_for_constant_group: bool = False  # a group whose rewards are all equal gets advantage 0 (dynamic sampling)


FACTS: dict[str, AlgorithmFacts] = {
    "grpo": AlgorithmFacts("token", "loss", False, 2, "group-relative advantages (r − group mean) / group std; no critic",
                           group_local=True, zero_for_constant_group=True),
    "rloo": AlgorithmFacts("sequence_sum", "reward", False, 2,
                           "leave-one-out baseline; one ratio per completion; KL (k1, summed) in the reward",
                           group_local=True, zero_for_constant_group=True),
    "reinforce_pp": AlgorithmFacts("token", "reward", False, 1,
                                   "REINFORCE++: token KL in the reward, reward-to-go whitened over the batch"),
    "reinforce_pp_baseline": AlgorithmFacts("token", "reward", False, 2,
                                            "REINFORCE++ after subtracting each group's mean reward",
                                            zero_for_constant_group=True),
    "ppo": AlgorithmFacts("token", "reward", True, 1,
                          "a learned critic; GAE over completion tokens; KL in the reward, fixed or adaptive coefficient"),
    # on-policy distillation: the teacher's per-token signal needs no group (G = 1 is fine without rewards); the rewards'
    # part, when teacher.reward_weight > 0, is GRPO's group advantage (validation asks for G >= 2 then)
    "distill": AlgorithmFacts("token", "loss", False, 1,
                              "on-policy distillation: per-token advantage log π_teacher − log π_student at the sampled tokens "
                              "(+ teacher.reward_weight × the rewards' GRPO advantage)", group_local=True),
}
