"""Independent per-element Python-loop implementations agree with the vectorised ones."""

import math
import random

import pytest
import torch

from cohort.algorithms import aggregate_loss, compute_advantages, gae, policy_loss

TOL = 1e-5


def naive_mean_std(values):
    """Mean and Bessel std of a list (std 0 with fewer than two values)."""
    n = len(values)
    mean = sum(values) / n if n else 0.0
    if n < 2:
        return mean, 0.0
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))


def naive_advantages(name, rewards, group_size, scale, eps=1e-6):
    out = [0.0] * len(rewards)
    finite_all = [r for r in rewards if not math.isnan(r)]
    for start in range(0, len(rewards), group_size):
        idx = [i for i in range(start, start + group_size) if not math.isnan(rewards[i])]
        group = [rewards[i] for i in idx]
        if len(set(group)) < 2:
            continue  # constant group, group of one, or no finite reward: 0
        mean, std = naive_mean_std(group)
        for i in idx:
            if name in ("grpo", "dr_grpo"):
                out[i] = rewards[i] - mean
                if name == "grpo" and scale == "group":
                    out[i] /= std + eps
                if name == "grpo" and scale == "batch":
                    out[i] /= naive_mean_std(finite_all)[1] + eps
            elif name == "rloo":
                out[i] = rewards[i] - (sum(group) - rewards[i]) / (len(group) - 1)
    return out


@pytest.mark.parametrize("name, scale", [("grpo", "group"), ("grpo", "batch"), ("grpo", "none"), ("dr_grpo", "group"),
                                         ("rloo", "group")])
def test_advantages_match_naive_loops(name, scale):
    rng = random.Random(0)
    rewards = [rng.choice([0.0, 1.0, 0.5, rng.random(), float("nan")]) for _ in range(7 * 5)]
    rewards[5:10] = [1.0] * 5  # a constant group
    expected = naive_advantages(name, rewards, 5, scale)
    actual = compute_advantages(name, torch.tensor(rewards, dtype=torch.float64), 5, scale=scale)
    torch.testing.assert_close(actual, torch.tensor(expected, dtype=torch.float64), rtol=0, atol=TOL)


def naive_gae(rewards, values, mask, gamma, lam):
    """Textbook GAE on each row's active tokens, written element by element."""
    advantages = [[0.0] * len(row) for row in rewards]
    for b in range(len(rewards)):
        active = [t for t in range(len(rewards[b])) if mask[b][t]]
        running = 0.0
        for k in reversed(range(len(active))):
            t = active[k]
            next_value = values[b][active[k + 1]] if k + 1 < len(active) else 0.0
            delta = rewards[b][t] + gamma * next_value - values[b][t]
            running = delta + gamma * lam * running
            advantages[b][t] = running
    return advantages


def test_gae_matches_naive_loops():
    torch.manual_seed(0)
    rewards, values = torch.randn(5, 9, dtype=torch.float64), torch.randn(5, 9, dtype=torch.float64)
    mask = torch.rand(5, 9) > 0.3  # holes anywhere, not only right-padding
    mask[0] = False
    expected = naive_gae(rewards.tolist(), values.tolist(), mask.tolist(), 0.97, 0.9)
    actual, returns = gae(rewards, values, mask, gamma=0.97, lam=0.9)
    torch.testing.assert_close(actual, torch.tensor(expected, dtype=torch.float64), rtol=0, atol=TOL)
    torch.testing.assert_close(returns, (actual + values) * mask, rtol=0, atol=TOL)


def naive_ppo_token(log_ratio, advantage, eps_low, eps_high, dual_clip):
    ratio = math.exp(log_ratio)
    clipped = min(max(ratio, 1 - eps_low), 1 + eps_high)
    loss = max(-advantage * ratio, -advantage * clipped)
    if dual_clip is not None and advantage < 0:
        loss = min(loss, -advantage * dual_clip)
    return loss


def naive_aggregate(per_token, mask, mode, max_length):
    rows = [(sum(l for l, m in zip(lr, mr) if m), sum(mr)) for lr, mr in zip(per_token, mask)]
    rows = [(s, n) for s, n in rows if n > 0]
    if mode in ("token_mean", "bnpo"):
        return sum(s for s, _ in rows) / sum(n for _, n in rows)
    if mode == "seq_mean_token_mean":
        return sum(s / n for s, n in rows) / len(rows)
    if mode == "seq_mean_token_sum":
        return sum(s for s, _ in rows) / len(rows)
    return sum(s / max_length for s, _ in rows) / len(rows)  # seq_mean_token_sum_norm


@pytest.mark.parametrize("mode", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "seq_mean_token_sum_norm",
                                  "bnpo"])
def test_ppo_clip_loss_matches_naive_loops(mode):
    torch.manual_seed(1)
    logp = torch.randn(6, 8, dtype=torch.float64) * 0.1
    old_logp = logp + 0.3 * torch.randn(6, 8, dtype=torch.float64)
    advantages = torch.randn(6, 8, dtype=torch.float64)
    mask = torch.arange(8).unsqueeze(0) < torch.tensor([[8], [3], [0], [5], [1], [6]])
    per_token = [[naive_ppo_token(lp - olp, a, 0.2, 0.28, 3.0) for lp, olp, a in zip(r1, r2, r3)]
                 for r1, r2, r3 in zip(logp.tolist(), old_logp.tolist(), advantages.tolist())]
    expected = naive_aggregate(per_token, mask.tolist(), mode, max_length=10)
    loss, _ = policy_loss("ppo_clip", logp, old_logp, advantages, mask, eps_low=0.2, eps_high=0.28, dual_clip=3.0,
                          aggregation=mode, max_length=10)
    assert abs(loss.item() - expected) < TOL
    assert abs(aggregate_loss(torch.tensor(per_token, dtype=torch.float64), mask, mode, max_length=10).item()
               - expected) < TOL
