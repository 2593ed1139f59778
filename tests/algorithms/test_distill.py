"""On-policy distillation's per-token advantage (cohort/algorithms/distill.py), by hand and as the reverse KL's gradient."""

import math

import torch

from cohort.algorithms import distill_advantages, policy_loss


def t64(values):
    return torch.tensor(values, dtype=torch.float64)


def close(actual, expected, atol=1e-12):
    torch.testing.assert_close(actual, t64(expected) if not torch.is_tensor(expected) else expected, rtol=0, atol=atol)


def test_advantage_and_metrics_by_hand():
    # token 1: student −2, teacher −1: log π_T − log π_S = +1 (the teacher likes it more: pushed up)
    # token 2: student −1, teacher −2: −1 (pushed down); token 3 is masked out (padding): advantage 0, in no metric.
    # reverse KL (k1, s − q) over the two tokens: (−1 + 1) / 2 = 0; teacher_prob: (e^−1 + e^−2) / 2 = 0.251607...;
    # neither teacher log-prob is above log 0.5 = −0.693: majority 0; nothing reaches the clip of 10.
    student, teacher = t64([[-2.0, -1.0, -0.5]]), t64([[-1.0, -2.0, -9.0]])
    mask = t64([[1.0, 1.0, 0.0]])
    adv, metrics = distill_advantages(torch.zeros_like(student), student, teacher, mask, clip=10.0)
    close(adv, [[1.0, -1.0, 0.0]])
    close(metrics["distill/reverse_kl"], 0.0)
    close(metrics["distill/teacher_prob"], (math.exp(-1) + math.exp(-2)) / 2)
    close(metrics["distill/teacher_majority_frac"], 0.0)
    close(metrics["distill/clip_frac"], 0.0)


def test_rewards_mix_in_by_their_weight():
    # reward advantage 0.5 on every token, reward_weight 2, kl_coef 0.5, log-ratios (+1, −1):
    # 2·0.5 + 0.5·1 = 1.5 and 2·0.5 + 0.5·(−1) = 0.5; the masked token stays 0.
    student, teacher = t64([[-2.0, -1.0, -0.5]]), t64([[-1.0, -2.0, -0.5]])
    rewards = t64([[0.5, 0.5, 0.5]])
    adv, _ = distill_advantages(rewards, student, teacher, t64([[1.0, 1.0, 0.0]]), kl_coef=0.5, reward_weight=2.0)
    close(adv, [[1.5, 0.5, 0.0]])


def test_the_log_ratio_is_clipped_but_the_reverse_kl_is_not():
    # a token the teacher finds impossible: q = −30, s = −1, log-ratio −29 → clipped to −10 (advantage −10);
    # a token with log-ratio +3 stays. reverse KL (unclipped): (29 + (−3)) / 2 = 13; clip_frac 1/2.
    student, teacher = t64([[-1.0, -4.0]]), t64([[-30.0, -1.0]])
    adv, metrics = distill_advantages(torch.zeros_like(student), student, teacher, torch.ones_like(student), clip=10.0)
    close(adv, [[-10.0, 3.0]])
    close(metrics["distill/reverse_kl"], 13.0)
    close(metrics["distill/clip_frac"], 0.5)
    unclipped, _ = distill_advantages(torch.zeros_like(student), student, teacher, torch.ones_like(student), clip=None)
    close(unclipped, [[-29.0, 3.0]])


def test_teacher_equal_to_student_leaves_the_rewards_alone_and_majority_counts_confident_tokens():
    # q = s: the distillation part is 0, so the advantage is the reward part times its weight (1.0 here): [0.3, −0.7].
    # teacher probabilities 0.9 and 0.4: only the first exceeds one half (it is then the teacher's argmax): 1/2.
    logp = t64([[math.log(0.9), math.log(0.4)]])
    rewards = t64([[0.3, -0.7]])
    adv, metrics = distill_advantages(rewards, logp, logp, torch.ones_like(logp), reward_weight=1.0)
    close(adv, [[0.3, -0.7]])
    close(metrics["distill/reverse_kl"], 0.0)
    close(metrics["distill/teacher_majority_frac"], 0.5)


def test_no_gradient_flows_through_the_advantage():
    student = t64([[-1.0, -2.0]]).requires_grad_()
    teacher = t64([[-1.5, -0.5]]).requires_grad_()
    adv, metrics = distill_advantages(torch.zeros(1, 2, dtype=torch.float64), student, teacher, torch.ones(1, 2))
    assert not adv.requires_grad and not any(m.requires_grad for m in metrics.values())


def test_the_advantage_in_the_clipped_loss_is_the_reverse_kl_gradient():
    # Exactly, with no sampling: over a 5-token categorical π = softmax(θ) and a teacher q, weighting each token's
    # on-policy loss −A·ratio (ratio = 1, gradient −A·∇log π) by π(x) gives
    #   ∇ Σ_x π(x)·(−A_x·ratio_x) = −Σ_x π(x)(q_x − s_x)∇s_x = Σ_x π(x)(s_x − q_x)∇s_x = ∇ KL(π ‖ q),
    # since ∇KL = Σ ∇π (s − q) + Σ π ∇s and Σ_x π(x)∇s_x = ∇Σπ = 0. So descending the loss descends the reverse KL.
    theta = t64([0.3, -1.2, 2.0, 0.1, -0.4]).requires_grad_()
    q = torch.log_softmax(t64([1.0, 0.5, -1.0, 0.0, 2.0]), -1)
    s = torch.log_softmax(theta, -1)
    adv, _ = distill_advantages(torch.zeros(1, 5, dtype=torch.float64), s[None], q[None], torch.ones(1, 5))
    weights = s.exp().detach()[None]  # π(x), the probability each token is the sampled one
    loss, _ = policy_loss("ppo_clip", s[None], s.detach()[None], adv, torch.ones(1, 5), token_weights=weights,
                          aggregation="token_mean")
    (grad_loss,) = torch.autograd.grad(loss * 5, theta)  # token_mean divided by the 5 tokens
    theta2 = theta.detach().clone().requires_grad_()
    s2 = torch.log_softmax(theta2, -1)
    (grad_kl,) = torch.autograd.grad((s2.exp() * (s2 - q)).sum(), theta2)
    torch.testing.assert_close(grad_loss, grad_kl, rtol=0, atol=1e-12)
