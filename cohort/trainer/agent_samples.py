"""Agent runs that rewrote their history join the batch as one sample per call, each with the run's advantage.

A run whose calls do not form one chain (cohort/agents/runs.py) reaches the trainer as its last call's trajectory,
its earlier calls riding along as `AgentRun.samples`. Everything per group is computed on the runs, as for any
trajectory: G runs per group, their rewards (the agent's), the group statistics and metrics, the advantages. Then
`with_run_samples` inserts each run's earlier calls as rows just before the run's own row, each with the run's
reward and its advantage: the run's one outcome-level advantage (`RolloutBatch.sequence_advantage`, the value every
trained token of the run's row carries) on every trained token of the sample. So a run that made three calls puts
three samples into the loss, all pushed the same way, as the agent-loop systems do for "one sample per step".

Choices: the samples are added after the advantages, so a group's statistics count each run once whatever its
number of calls (a run is not weighted by how chatty its agent was in the baseline); in the loss, token-level
aggregations (dapo, bnpo) count every sample's tokens, sequence-level ones each sample as one sequence. Old and
reference log-probs, when the algorithm uses them, are scored again over the widened batch by the caller.

Left out: algorithms with a critic and more than one optimizer step per generation batch (validation refuses them
with an agent: per-token values and the step's slice of the batch would not follow the inserted rows).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

import numpy as np
import torch

from cohort.rollout.base import AgentRun, Trajectory, decode_completion
from cohort.trainer.rollout_batch import RolloutBatch


def run_samples(trajectories: Sequence[Trajectory]) -> list[list[Trajectory]]:
    """Each trajectory's earlier samples ([] unless it is an agent run that rewrote its history)."""
    return [list(t.episode.samples) if isinstance(t.episode, AgentRun) else [] for t in trajectories]


def with_run_samples(batch: RolloutBatch, trajectories: Sequence[Trajectory], tokenizer) -> RolloutBatch:
    """`batch` (advantages computed, one row per trajectory) with every run's earlier samples inserted before its row,
    each carrying the run's row index, reward and per-function scores, and its advantage on the sample's trained
    tokens. The batch itself when no run has samples."""
    extra = run_samples(trajectories)
    if not any(extra):
        return batch
    order: list[tuple[int, Trajectory | None]] = []  # (the run's row, a sample or None: the row itself)
    for i, samples in enumerate(extra):
        order += [(i, s) for s in samples] + [(i, None)]
    advantages = [batch.sequence_advantage(i) for i in range(len(batch))]
    rows = RolloutBatch(
        row_indices=[batch.row_indices[i] for i, _ in order],
        prompt_ids=[list(s.prompt_ids) if s else batch.prompt_ids[i] for i, s in order],
        completion_ids=[s.token_ids if s else batch.completion_ids[i] for i, s in order],
        engine_logp=[s.logprobs if s else batch.engine_logp[i] for i, s in order],
        truncated=[s.status == "length" if s else batch.truncated[i] for i, s in order],
        completions_text=[decode_completion(tokenizer, s) if s else batch.completions_text[i] for i, s in order],
        rewards=np.array([batch.rewards[i] for i, _ in order]), per_function=batch.per_function[[i for i, _ in order]],
        advantages=torch.empty(0), metrics=batch.metrics, policy_version=batch.policy_version,
        versions=[list(s.versions) if s else batch.versions[i] for i, s in order],
        taken_version=batch.taken_version,
        loss_masks=[list(s.loss_mask) if s else batch.loss_mask_of(i) for i, s in order],
        episodes=[None if s else (batch.episodes[i] if batch.episodes else None) for i, s in order],
        streamed=batch.streamed)
    width = max(1, max(len(c) for c in rows.completion_ids))
    mask = rows.token_mask(list(range(len(rows))), width, batch.advantages.device)  # (N', width)
    values = torch.tensor([advantages[i] for i, _ in order], dtype=batch.advantages.dtype, device=batch.advantages.device)
    return replace(rows, advantages=values[:, None] * mask)  # (N', width): the run's advantage on each trained token
