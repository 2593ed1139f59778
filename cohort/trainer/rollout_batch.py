"""The generation batch the update phase trains on.

`RolloutBatch` holds one generation batch: the sampled completions, their
rewards and advantages, and (only when needed) old and reference log-probs and
the critic's values and targets.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from cohort.rollout.base import Trajectory


@dataclass
class RolloutBatch:
    """One generation batch, groups of G consecutive completions."""

    row_indices: list[int]
    prompt_ids: list[list[int]]
    completion_ids: list[list[int]]
    engine_logp: list[list[float]]
    truncated: list[bool]
    completions_text: list[str]
    rewards: np.ndarray  # (N,) weighted total, NaN when no function applied
    per_function: np.ndarray  # (N, F)
    advantages: torch.Tensor  # (N, T) per completion token, T = the longest completion; 0 on padding
    old_logp: list[torch.Tensor] | None = None
    ref_logp: list[torch.Tensor] | None = None
    values: list[torch.Tensor] | None = None  # the critic's, at generation time (algorithms with a critic)
    returns: torch.Tensor | None = None  # (N, T) the critic's targets
    metrics: dict[str, float] = field(default_factory=dict)
    policy_version: int = 0  # the policy version that sampled the batch (older than the trainer's under rollout.overlap)
    versions: list[list[int]] = field(default_factory=list)  # per completion token: the policy version that sampled it
    taken_version: int = 0  # the trainer's version when the batch was assembled: tokens sampled before it are off-policy

    @classmethod
    def from_trajectories(cls, rows: list[int], prompt_ids: list[list[int]], trajectories: list[Trajectory], *,
                          rewards: np.ndarray, per_function: np.ndarray, texts: list[str], policy_version: int) -> RolloutBatch:
        """A batch (advantages still empty) from the engine's trajectories, one per entry of `rows` / `prompt_ids`."""
        return cls(row_indices=rows, prompt_ids=prompt_ids, completion_ids=[t.token_ids for t in trajectories],
                   engine_logp=[t.logprobs for t in trajectories], truncated=[t.status == "length" for t in trajectories],
                   completions_text=texts, rewards=rewards, per_function=per_function, advantages=torch.empty(0),
                   policy_version=policy_version, versions=[list(t.versions) for t in trajectories])

    def __len__(self) -> int:
        return len(self.completion_ids)

    def off_policy(self, rows: list[int], width: int) -> torch.Tensor:
        """(len(rows), width) 1.0 on tokens sampled by a policy older than `taken_version` (resumed prefixes of partial
        rollouts, a batch generated behind the update), 0.0 elsewhere and on padding."""
        out = torch.zeros(len(rows), width)
        for r, i in enumerate(rows):
            v = torch.tensor(self.versions[i][:width], dtype=torch.long) if i < len(self.versions) else torch.empty(0)
            out[r, : len(v)] = (v < self.taken_version).float()
        return out

    def staleness(self, rows: list[int], width: int, version: int) -> torch.Tensor:
        """(len(rows), width) how many versions each token's sampler is behind `version` (0 on padding)."""
        out = torch.zeros(len(rows), width)
        for r, i in enumerate(rows):
            v = torch.tensor(self.versions[i][:width], dtype=torch.float32) if i < len(self.versions) else torch.empty(0)
            out[r, : len(v)] = version - v
        return out

    def sequence_advantage(self, i: int) -> float:
        """Completion i's mean advantage over its tokens (its one advantage for outcome-level algorithms)."""
        n = len(self.completion_ids[i])
        return float(self.advantages[i, :n].mean()) if n else 0.0
