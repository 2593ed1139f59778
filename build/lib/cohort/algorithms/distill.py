"""On-policy distillation's per-token advantage: the teacher's log-prob minus the student's at each sampled token.

The student samples a completion; the teacher scores the same token ids. With
``s_t = log π_student(y_t | y_<t)`` and ``q_t = log π_teacher(y_t | y_<t)`` at the
sampled token ``y_t``, the per-token reverse KL ``KL(π_student ‖ π_teacher)`` at that
position is estimated by ``s_t − q_t`` (k1: unbiased because ``y_t`` was drawn from
the student), and its policy gradient is ``E[∇ s_t · (s_t − q_t)]``. So the advantage of
token t is ``−(s_t − q_t) = q_t − s_t``, a reward with no gradient through it, fed
to the same clipped policy loss as every other advantage: minimising the loss with
this advantage descends the reverse KL. Choices, as the peers make them:

- discount 0: each token's advantage is its own log-ratio, not the sum of the
  log-ratios after it (Thinking Machines' on-policy distillation and verl's
  `use_policy_gradient` with k1 do the same; MiniLLM's reward-to-go has more variance);
- the student's log-prob is the proximal policy's, the ratio's denominator the loop
  already holds: the sampling policy's log-probs where they are computed (several
  updates per generation batch), else the current policy's detached, which equal the
  sampling policy's on-policy and cost no forward pass;
- the log-ratio is clipped to ``±clip`` nats before it is weighted (verl's
  distillation recipes clamp at 10): one token the teacher finds impossible cannot
  take the whole step;
- mixing with rewards: ``reward_weight · A_reward + kl_coef · clip(q − s)``, where
  ``A_reward`` is the advantage the algorithm's spec made from the rewards (GRPO's
  group advantage for `distill`); prime-rl's adv_tau/teacher_tau and slime's
  opd-kl-coef add the two the same way.

Where it sits: `algorithm.name = distill` is an entry of the algorithm registry (specs.py), because it
changes what the advantage is; its facts (a group of one is enough, group-local, a constant-reward group
still has a signal) are what the planner and validation read. The teacher is a model only this algorithm
holds, as PPO holds a critic, so it has its own config section (`teacher.*`), and the rewards mix in by a
weight there rather than as a teacher beside every estimator: one way to ask for each mix
(docs/algorithms.md, "On-policy distillation", argues it at length).

Metrics (0-d tensors, means over the mask's tokens): ``distill/reverse_kl`` (the k1
estimate ``s − q``, unclipped), ``distill/teacher_prob`` (the teacher's probability of
the sampled token: how often the teacher, sampling there, would have picked the same
token), ``distill/teacher_majority_frac`` (tokens to which the teacher gives more than
half its mass; each is then the teacher's argmax, so this is a lower bound on the
fraction of sampled tokens that are the teacher's argmax, read without the teacher's
logits) and ``distill/clip_frac``.

Left out: the full-distribution KL over the vocabulary (needs both models' (B, T, V)
logits; the chunked scorer never forms them), and teachers with another tokenizer.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .stats import float_mask, masked_mean

HALF = math.log(0.5)


def distill_advantages(advantages: Tensor, student_logp: Tensor, teacher_logp: Tensor, mask: Tensor, *,
                       kl_coef: float = 1.0, reward_weight: float = 0.0,
                       clip: float | None = None) -> tuple[Tensor, dict[str, Tensor]]:
    """(B, T) advantages ``reward_weight · advantages + kl_coef · clip(teacher − student)``, 0 where `mask` is 0,
    detached, in `advantages`' dtype (computed in float32, or float64 when a log-prob is); and the metrics of the module
    docstring.

    advantages: (B, T) the rewards' advantages; student_logp, teacher_logp: (B, T) log-probs of the sampled tokens
    (finite at padding); mask: (B, T) tokens that enter the loss.
    """
    dtype = torch.promote_types(torch.promote_types(student_logp.dtype, teacher_logp.dtype), torch.float32)  # ≥ float32
    student, teacher = student_logp.detach().to(dtype), teacher_logp.detach().to(dtype)
    m = float_mask(mask, student)
    log_ratio = teacher - student  # (B, T) = −(s − q)
    clipped = log_ratio.clamp(-clip, clip) if clip is not None else log_ratio
    mixed = reward_weight * advantages.detach().to(dtype) + kl_coef * clipped
    out = torch.where(m > 0, mixed, torch.zeros_like(mixed)).to(advantages.dtype)
    metrics = {
        "distill/reverse_kl": masked_mean(-log_ratio, m),
        "distill/teacher_prob": masked_mean(teacher.exp(), m),
        "distill/teacher_majority_frac": masked_mean((teacher > HALF).to(dtype), m),
        "distill/clip_frac": masked_mean((clipped != log_ratio).to(dtype), m),
    }
    return out, metrics
