"""cohort/trainer/agent_samples.py: a run that rewrote its history joins the batch as one sample per call, each with
the run's reward and advantage (hand-built batch, hand-derived numbers)."""

from __future__ import annotations

import numpy as np
import torch

from cohort.algorithms.advantages import compute_advantages
from cohort.agents.runs import AgentRun
from cohort.rollout.base import Trajectory
from cohort.trainer.agent_samples import run_samples, with_run_samples
from cohort.trainer.rollout_batch import RolloutBatch


class Decode:
    def decode(self, ids, skip_special_tokens=True):
        return " ".join(map(str, ids))


def batch_of(trajectories, rewards):
    return RolloutBatch.from_trajectories([3, 3], [[1, 2], [1, 2]], trajectories, rewards=np.array(rewards),
                                          per_function=np.array(rewards)[:, None], texts=["a", "b"], policy_version=0)


def test_each_earlier_call_becomes_a_row_with_the_runs_advantage():
    # a group of G = 2 runs of row 3. Run A (reward 1) made two calls and rewrote its history: its trajectory is
    # its last call, [5, 6, 7] with a tool token in the middle (mask 1 0 1), its first call [8, 9] (prompt [1])
    # rides along. Run B (reward 0) is one chain, [4].
    first_call = Trajectory([8, 9], [-.1, -.2], "stop", 0, prompt_ids=[1])
    a = Trajectory([5, 6, 7], [-.3, 0.0, -.4], "stop", 0, loss_mask=[1, 0, 1], prompt_ids=[1, 2],
                   episode=AgentRun(outcome={"reward": 1.0}, turns=2, samples=[first_call]))
    b = Trajectory([4], [-.5], "stop", 0, prompt_ids=[1, 2], episode=AgentRun(outcome={"reward": 0.0}, turns=1))
    batch = batch_of([a, b], [1.0, 0.0])
    # the advantages over the G = 2 runs (GRPO): mean 0.5, std (Bessel) sqrt(0.5) = 0.7071, so +-0.5 / 0.7071 =
    # +-0.70711 on each trained token (the tool token of A stays 0)
    mask = batch.token_mask([0, 1], 3)
    batch.advantages = compute_advantages("grpo", torch.tensor([1.0, 0.0]), 2)[:, None] * mask  # (2,) -> (2, 3)
    assert torch.allclose(batch.advantages, torch.tensor([[0.70711, 0.0, 0.70711], [-0.70711, 0.0, 0.0]]), atol=1e-5)
    out = with_run_samples(batch, [a, b], Decode())
    # rows: A's first call, A, B; A's first call carries A's row, reward, scores and advantage on both its tokens
    assert out.row_indices == [3, 3, 3]
    assert out.prompt_ids == [[1], [1, 2], [1, 2]]
    assert out.completion_ids == [[8, 9], [5, 6, 7], [4]]
    assert out.loss_masks == [[1, 1], [1, 0, 1], [1]]
    assert out.rewards.tolist() == [1.0, 1.0, 0.0] and out.per_function[:, 0].tolist() == [1.0, 1.0, 0.0]
    assert out.completions_text == ["8", "a", "b"]  # (the stop-ended sample's text drops its last token)
    assert out.episodes[0] is None and out.episodes[1] is a.episode
    expected = torch.tensor([[0.70711, 0.70711, 0.0], [0.70711, 0.0, 0.70711], [-0.70711, 0.0, 0.0]])
    assert torch.allclose(out.advantages, expected, atol=1e-5)
    assert out.engine_logp[0] == [-.1, -.2]


def test_runs_without_samples_leave_the_batch_as_it_is():
    b = Trajectory([4], [-.5], "stop", 0, prompt_ids=[1, 2], episode=AgentRun(outcome={"reward": 0.0}))
    plain = Trajectory([4], [-.5], "stop", 0, prompt_ids=[1, 2])
    batch = batch_of([b, plain], [0.0, 1.0])
    assert run_samples([b, plain]) == [[], []]
    assert with_run_samples(batch, [b, plain], Decode()) is batch
