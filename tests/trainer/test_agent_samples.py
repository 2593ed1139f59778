"""cohort/trainer/agent_samples.py: a run that rewrote its history becomes one row per call before anything is
scored, every row naming its run; the advantages count runs, and a step's slice and a process's share keep a run's
rows together (hand-built batches, hand-derived numbers)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import torch

from cohort.algorithms.specs import ALGORITHMS, AdvantageInputs
from cohort.distributed.fsdp import DistContext
from cohort.agents.runs import AgentRun
from cohort.rollout.base import Trajectory
from cohort.trainer.agent_samples import run_samples, with_call_samples
from cohort.trainer.rollout_batch import RolloutBatch


class Decode:
    def decode(self, ids, skip_special_tokens=True):
        return " ".join(map(str, ids))


def runs_batch(trajectories, rewards, rows=None):
    n = len(trajectories)
    return RolloutBatch.from_trajectories(rows or [3] * n, [list(t.prompt_ids) for t in trajectories], trajectories,
                                          rewards=np.array(rewards), per_function=np.array(rewards)[:, None],
                                          texts=[f"t{i}" for i in range(n)], policy_version=0)


def run(tokens, reward, calls=(), mask=None):
    """A run whose last call sampled `tokens` (prompt [1, 2]) after earlier calls `calls` (each [ids], prompt [1])."""
    samples = [Trajectory(list(c), [-.1] * len(c), "stop", 0, prompt_ids=[1]) for c in calls]
    return Trajectory(list(tokens), [-.3] * len(tokens), "stop", 0, loss_mask=mask or [], prompt_ids=[1, 2],
                      episode=AgentRun(outcome={"reward": reward}, turns=1 + len(calls), samples=samples))


def test_each_earlier_call_becomes_a_row_before_its_run_and_the_advantages_count_runs():
    # a group of G = 3 runs of row 3. Run A (reward 1) made three calls: its trajectory is its last call [5, 6, 7]
    # (a tool token in the middle: mask 1 0 1), its earlier calls [8, 9] and [10] ride along. Runs B (reward 0,
    # [4]) and C (reward 0.5, [11, 12]) made one each.
    a = run([5, 6, 7], 1.0, calls=[[8, 9], [10]], mask=[1, 0, 1])
    b, c = run([4], 0.0), run([11, 12], 0.5)
    out = with_call_samples(runs_batch([a, b, c], [1.0, 0.0, 0.5]), [a, b, c], Decode())
    # rows: A's two earlier calls, A, B, C; every row names its run, and carries its run's dataset row and reward
    assert out.runs == [0, 0, 0, 1, 2] and out.num_runs == 3
    assert out.row_indices == [3] * 5
    assert out.prompt_ids == [[1], [1], [1, 2], [1, 2], [1, 2]]
    assert out.completion_ids == [[8, 9], [10], [5, 6, 7], [4], [11, 12]]
    assert out.loss_masks == [[1, 1], [1], [1, 0, 1], [1], [1, 1]]
    assert out.rewards.tolist() == [1.0, 1.0, 1.0, 0.0, 0.5] and out.per_function[:, 0].tolist() == [1.0, 1.0, 1.0, 0.0, 0.5]
    assert out.completions_text == ["8", "", "t0", "t1", "t2"]  # (a stop-ended sample's text drops its last token)
    assert out.episodes[:2] == [None, None] and out.episodes[2] is a.episode
    assert out.engine_logp[0] == [-.1, -.1] and out.advantages.numel() == 0  # nothing scored yet
    # GRPO through the spec, as the trainer calls it: over the 3 runs (1, 0, 0.5), mean 0.5, Bessel std 0.5, so A
    # gets 0.5 / 0.500001 = 0.999998 on every trained token of its three rows (its tool token 0), B -0.999998, C 0
    x = AdvantageInputs(rewards=torch.tensor(out.rewards, dtype=torch.float32), mask=out.trained_mask(False, "cpu"),
                        group_size=3, runs=out.runs_tensor("cpu"))
    adv = ALGORITHMS.get("grpo").advantages(x).advantages
    a0 = 0.5 / (0.5 + 1e-6)
    expected = torch.tensor([[a0, a0, 0], [a0, 0, 0], [a0, 0, a0], [-a0, 0, 0], [0, 0, 0]])
    assert torch.allclose(adv, expected, atol=1e-6)


def test_runs_without_samples_leave_the_batch_as_it_is():
    b = run([4], 0.0)
    plain = Trajectory([4], [-.5], "stop", 0, prompt_ids=[1, 2])
    batch = runs_batch([b, plain], [0.0, 1.0])
    assert run_samples([b, plain]) == [[], []]
    assert with_call_samples(batch, [b, plain], Decode()) is batch
    assert batch.runs is None and batch.num_runs == 2 and batch.runs_tensor("cpu") is None


def widened_generation_batch():
    """8 runs in 4 groups of G = 2 (2 steps of 2 prompts): run 1 made 3 calls, run 4 two, the others one."""
    runs = [run([4], 1.0, calls=[[5], [6]] if k == 1 else [[7]] if k == 4 else []) for k in range(8)]
    batch = runs_batch(runs, [float(k % 2) for k in range(8)], rows=[k // 2 for k in range(8)])
    return with_call_samples(batch, runs, Decode())


def test_a_multi_step_generation_batch_is_sliced_into_whole_runs():
    # rows: run 0: row 0; run 1: rows 1, 2, 3; run 2: 4; run 3: 5; run 4: rows 6, 7; runs 5, 6, 7: rows 8, 9, 10
    batch = widened_generation_batch()
    assert batch.runs == [0, 1, 1, 1, 2, 3, 4, 4, 5, 6, 7] and batch.num_runs == 8
    # train.steps_per_generation = 2: step 0 trains runs 0-3 (groups 0 and 1: rows 0-5), step 1 runs 4-7 (rows 6-10);
    # a row count of 11 / 2 would have cut run 4 in two
    assert batch.step_rows(0, 2) == [0, 1, 2, 3, 4, 5]
    assert batch.step_rows(1, 2) == [6, 7, 8, 9, 10]
    assert batch.step_rows(0, 1) == list(range(11))  # one step: every row
    # two processes, step 0: rank 0 takes group 0 (runs 0, 1: rows 0-3), rank 1 group 1 (runs 2, 3: rows 4, 5)
    for rank, rows in ((0, [0, 1, 2, 3]), (1, [4, 5])):
        ctx = SimpleNamespace(rank=rank, world_size=2)
        local = DistContext.local_indices(ctx, batch.runs_of(batch.step_rows(0, 2)), 2)
        assert batch.rows_of_runs(local) == rows


def test_a_plain_batch_slices_as_before():
    plain = [Trajectory([4], [-.5], "stop", 0, prompt_ids=[1]) for _ in range(8)]
    batch = runs_batch(plain, [0.0] * 8)
    assert batch.step_rows(1, 2) == [4, 5, 6, 7] and batch.runs_of([4, 5]) == [4, 5]
