"""cohort/trainer/agent_samples.py's `with_seats`: multi-seat agent runs widened into one row per seat before the
advantages, grouped seat by seat (hand-built runs, no engine: the pure layout and its GRPO advantages). The episode
that makes such runs from a real verifiers package is tests/agents/test_verifiers.py's two-seat test; the training run
is its vLLM test."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from cohort.algorithms.advantages import compute_advantages
from cohort.rewards.reward_set import RewardOutput
from cohort.agents.runs import AgentRun
from cohort.rollout.base import Trajectory
from cohort.rollout.collect import Collected
from cohort.trainer.agent_samples import with_seats

STOP = 9


class Tokens:  # decode_completion's tokenizer: ids -> text
    def decode(self, ids, skip_special_tokens=True):
        return " ".join(map(str, ids))


def seat(name, ids, reward):
    return Trajectory(list(ids) + [STOP], [-0.5] * (len(ids) + 1), "stop", 0, prompt_ids=[100 + len(name), 1],
                      episode=AgentRun(outcome={"reward": reward, "payoff": reward}, turns=1, seat=name))


def episode(row, payoff0, ids0, ids1):
    """A two-seat zero-sum episode: player0 nets payoff0, player1 -payoff0; the run's reward is their mean, 0."""
    seats = [seat("player0", ids0, payoff0), seat("player1", ids1, -payoff0)]
    run = AgentRun(outcome={"reward": 0.0, "payoff": 0.0}, turns=2, seats=seats)
    return Trajectory([1, 2, STOP], [-0.1] * 3, "stop", 0, prompt_ids=[7], episode=run)


def collected(outs, rows):
    total = np.array([t.episode.outcome["reward"] if t.episode.outcome else np.nan for t in outs])
    return Collected(rows, [t.prompt_ids for t in outs], outs, ["run"] * len(outs),
                     RewardOutput(per_function=total[:, None].copy(), total=total, metrics={"rewards/verifiers_reward/mean": 0.0}))


def test_each_group_becomes_one_group_per_seat_with_the_seat_s_own_reward():
    # two tasks (rows 0 and 1), G = 2 episodes each. Task 0: player0 wins one (+1) and loses one (-1); task 1: player0
    # wins both (+2, +1). Narrow, every run's reward is the seats' mean: 0, 0, 0, 0.
    outs = [episode(0, 1.0, [11], [21]), episode(0, -1.0, [12], [22]), episode(1, 2.0, [13], [23]), episode(1, 1.0, [14], [24])]
    before = collected(outs, [0, 0, 1, 1])
    assert compute_advantages("grpo", torch.tensor(before.scored.total), 2).tolist() == [0.0, 0.0, 0.0, 0.0]  # nothing to learn
    wide = with_seats(before, 2, Tokens())
    # rows: task 0's player0 x2, task 0's player1 x2, task 1's player0 x2, task 1's player1 x2
    assert wide.rows == [0, 0, 0, 0, 1, 1, 1, 1]
    assert [t.token_ids[0] for t in wide.outs] == [11, 12, 21, 22, 13, 14, 23, 24]
    assert [t.episode.seat for t in wide.outs] == ["player0", "player0", "player1", "player1"] * 2
    assert wide.scored.total.tolist() == [1.0, -1.0, -1.0, 1.0, 2.0, 1.0, -2.0, -1.0]
    assert wide.scored.per_function[:, 0].tolist() == wide.scored.total.tolist()
    assert wide.prompts[0] == [107, 1] and wide.texts[0] == "11"  # the seat's own prompt; its text without the stop
    # GRPO per group of 2 (Bessel std): [1, -1] -> mean 0, std sqrt(2): +-1/sqrt(2); [2, 1] -> mean 1.5, std
    # sqrt(0.5): +-0.5/sqrt(0.5) = +-1/sqrt(2); the same magnitudes for player1's mirrored groups
    a = 1 / math.sqrt(2)
    advantages = compute_advantages("grpo", torch.tensor(wide.scored.total), 2).tolist()
    assert advantages == pytest.approx([a, -a, -a, a, a, -a, -a, a], abs=1e-5)
    # each seat's mean reward: player0 (1 - 1 + 2 + 1) / 4 = 0.75, player1 -0.75
    assert wide.scored.metrics["agent/seat/player0/reward"] == 0.75
    assert wide.scored.metrics["agent/seat/player1/reward"] == -0.75
    assert wide.scored.metrics["rewards/verifiers_reward/mean"] == 0.0  # the episodes' own metric, as it was


def test_a_failed_episode_fills_each_seat_s_slot_without_a_reward():
    ok = episode(0, 1.0, [11], [21])
    failed = Trajectory([5, STOP], [-0.2, -0.2], "stop", 0, prompt_ids=[7],
                        episode=AgentRun(error="the episode failed", status="error", turns=1))
    wide = with_seats(collected([ok, failed], [0, 0]), 2, Tokens())
    assert [t.token_ids for t in wide.outs] == [[11, STOP], [5, STOP], [21, STOP], [5, STOP]]
    assert [t.episode.seat for t in wide.outs] == ["player0", "player0", "player1", "player1"]
    total = wide.scored.total
    assert total[0] == 1.0 and math.isnan(total[1]) and total[2] == -1.0 and math.isnan(total[3])
    # a group with one finite reward teaches nothing: advantage 0 everywhere (NaN rows are left out)
    assert compute_advantages("grpo", torch.tensor(total), 2).tolist() == [0.0, 0.0, 0.0, 0.0]


def test_runs_without_seats_are_left_as_they_are():
    plain = Trajectory([1, STOP], [-0.1, -0.1], "stop", 0, prompt_ids=[7], episode=AgentRun(outcome={"reward": 1.0}))
    before = collected([plain, plain], [0, 0])
    assert with_seats(before, 2, Tokens()) is before


def test_rewards_beside_a_two_seat_environment_are_added_to_each_seat_s_reward():
    # issue 60, defect 2 (kuhn_poker with `rewards: [{name: mymod.bonus}]`, 0.5 for every completion): rewards/bonus/mean
    # was 0.5 but each seat row's total was its payoff alone (every column overwritten by it). Columns: the
    # environment's reward (weight 1, first), then the bonus (weight 2). Two episodes of one task, G = 2: player0 nets
    # +0.75 and -0.25; the episode's own reward (the seats' mean) is 0, the bonus 0.5 for each.
    outs = [episode(0, 0.75, [11], [21]), episode(0, -0.25, [12], [22])]
    per_function = np.array([[0.0, 0.5], [0.0, 0.5]])  # (N, F): the episode's reward, the bonus
    before = Collected([0, 0], [t.prompt_ids for t in outs], outs, ["run"] * 2,
                       RewardOutput(per_function, per_function @ np.array([1.0, 2.0]), {"rewards/bonus/mean": 0.5}))
    wide = with_seats(before, 2, Tokens(), [1.0, 2.0])
    # rows: player0 (+0.75, -0.25), player1 (-0.75, +0.25); each total = its payoff + 2 x 0.5
    assert wide.scored.per_function.tolist() == [[0.75, 0.5], [-0.25, 0.5], [-0.75, 0.5], [0.25, 0.5]]
    assert wide.scored.total.tolist() == [1.75, 0.75, 0.25, 1.25]
    # the batch's reward (the mean total) is 1.0: the payoffs cancel, the bonus counts; each seat's reward from the
    # environment alone: player0 (0.75 - 0.25) / 2 = 0.25, player1 -0.25
    assert wide.scored.total.mean() == 1.0
    assert wide.scored.metrics["agent/seat/player0/reward"] == 0.25 and wide.scored.metrics["agent/seat/player1/reward"] == -0.25
    assert wide.scored.metrics["rewards/bonus/mean"] == 0.5
    # a failed episode stays scored by nothing: NaN in every column of each of its seats' rows
    failed = Trajectory([5, STOP], [-0.2, -0.2], "stop", 0, prompt_ids=[7],
                        episode=AgentRun(error="the episode failed", status="error", turns=1, episode_only=True))
    nan = np.full((1, 2), np.nan)
    mixed = Collected([0, 0], [[7], [7]], [outs[0], failed], ["run"] * 2,
                      RewardOutput(np.vstack([per_function[:1], nan]), np.array([1.0, np.nan]), {}))
    total = with_seats(mixed, 2, Tokens(), [1.0, 2.0]).scored.total
    assert total[0] == 1.75 and math.isnan(total[1]) and total[2] == 0.25 and math.isnan(total[3])
