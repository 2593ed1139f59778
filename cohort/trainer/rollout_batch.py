"""The generation batch the update phase trains on.

`RolloutBatch` holds one generation batch: the sampled completions, their
rewards and advantages, and (only when needed) old, reference and teacher
log-probs and the critic's values and targets. `StreamedGradients` is what a
batch trained group by group as it was collected carries to its optimizer step; `MicroBatch` is one micro-batch of it
as the update's loop reads it.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from cohort.models.batching import PackedBatch, padded_tensor
from cohort.rollout.base import Trajectory


@dataclass
class StreamedGradients:
    """The streamed update's state between generation and the optimizer step: accumulated metric sums (loss
    unnormalised) and the loss normaliser's count so far; the gradients themselves sit in the parameters' .grad."""

    sums: dict[str, Any] = field(default_factory=lambda: defaultdict(float))  # tensors on the device until the step
    count: float = 0.0


@dataclass
class MicroBatch:
    """One micro-batch as the update's loop reads it, every tensor on the device (Trainer.pack): the packed rows, the
    (B, width) loss mask, and, when the batch has them, each token's off-policy flag (1.0: sampled before the batch was
    taken) and its versions behind the trainer; the engine's log-probs (0 where it gave none); `trains_off_policy`:
    some token in the loss is off-policy (known on the host, so the loop never reads the device to decide)."""

    packed: PackedBatch
    mask: torch.Tensor
    off: torch.Tensor | None
    behind: torch.Tensor | None
    engine: torch.Tensor
    trains_off_policy: bool


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
    teacher_logp: list[torch.Tensor] | None = None  # the distillation teacher's, of every completion token (distill)
    values: list[torch.Tensor] | None = None  # the critic's, at generation time (algorithms with a critic)
    returns: torch.Tensor | None = None  # (N, T) the critic's targets
    metrics: dict[str, float] = field(default_factory=dict)
    policy_version: int = 0  # the policy version that sampled the batch (older than the trainer's under pipeline.max_staleness >= 1)
    versions: list[list[int]] = field(default_factory=list)  # per completion token: the policy version that sampled it
    taken_version: int = 0  # the trainer's version when the batch was assembled: tokens sampled before it are off-policy
    loss_masks: list[list[int]] | None = None  # per completion token, 0 on tool-output tokens (None: every token trained)
    episodes: list[Any] | None = None  # multi-turn: each trajectory's tool-loop record (cohort/tools/loop.py Episode)
    streamed: StreamedGradients | None = None  # the streamed update's sums when its groups were trained as they arrived

    @classmethod
    def from_trajectories(cls, rows: list[int], prompt_ids: list[list[int]], trajectories: list[Trajectory], *,
                          rewards: np.ndarray, per_function: np.ndarray, texts: list[str], policy_version: int,
                          taken_version: int = 0, streamed: StreamedGradients | None = None) -> RolloutBatch:
        """A batch (advantages still empty) from the engine's trajectories, one per entry of `rows` / `prompt_ids`; the
        later phases' parts (log-probs, values, advantages) join it by `dataclasses.replace`."""
        return cls(row_indices=rows, prompt_ids=prompt_ids, completion_ids=[t.token_ids for t in trajectories],
                   engine_logp=[t.logprobs for t in trajectories], truncated=[t.status == "length" for t in trajectories],
                   completions_text=texts, rewards=rewards, per_function=per_function, advantages=torch.empty(0, device="cpu"),
                   policy_version=policy_version, taken_version=taken_version, versions=[list(t.versions) for t in trajectories],
                   loss_masks=[t.loss_mask for t in trajectories],
                   episodes=[t.episode for t in trajectories] if any(t.episode is not None for t in trajectories) else None,
                   streamed=streamed)

    def token_mask(self, rows: list[int], width: int, device: torch.device | None = None) -> torch.Tensor:
        """(B, width) float on `device`: 1.0 on the completion tokens of `rows` that are trained on (the trajectories'
        loss masks: 0 on tool-output tokens), 0.0 on tool tokens and padding."""
        return padded_tensor([self.loss_mask_of(i)[:width] for i in rows], width, torch.float32, device)

    def loss_mask_of(self, i: int) -> list[int]:
        """Completion i's loss mask: 1 per sampled token, 0 per tool-output token (all ones without tool turns)."""
        return self.loss_masks[i] if self.loss_masks is not None else [1] * len(self.completion_ids[i])

    def trained_lengths(self) -> list[int]:
        """Tokens per completion that the model sampled and the loss sees (tool-output tokens left out)."""
        if self.loss_masks is None:
            return [len(c) for c in self.completion_ids]
        return [int(sum(m)) for m in self.loss_masks]

    def tool_record(self, i: int) -> dict[str, Any]:
        """What completions.jsonl adds for a multi-turn completion: its conversation (assistant and tool turns; tool
        turns have role "tool"), tool status and turns; {} for a one-turn completion."""
        episode = self.episodes[i] if self.episodes is not None else None
        if episode is None:
            return {}
        return {"conversation": list(episode.conversation), "tool_status": episode.status, "turns": episode.turns}

    def __len__(self) -> int:
        return len(self.completion_ids)

    def _token_versions(self, i: int, width: int) -> list[int]:
        return self.versions[i][:width] if i < len(self.versions) else []

    def sampled_before(self, rows: list[int]) -> bool:
        """Whether some token of `rows` was sampled by a policy older than `taken_version` (read from the host's lists)."""
        return any(v < self.taken_version for i in rows for v in self._token_versions(i, len(self.completion_ids[i])))

    def off_policy(self, rows: list[int], width: int, device: torch.device | None = None) -> torch.Tensor:
        """(len(rows), width) on `device`: 1.0 on tokens sampled by a policy older than `taken_version` (resumed
        prefixes of partial rollouts, a batch generated behind the update), 0.0 elsewhere and on padding."""
        return padded_tensor([[float(v < self.taken_version) for v in self._token_versions(i, width)] for i in rows],
                             width, torch.float32, device)

    def staleness(self, rows: list[int], width: int, version: int, device: torch.device | None = None) -> torch.Tensor:
        """(len(rows), width) on `device`: how many versions each token's sampler is behind `version` (0 on padding)."""
        return padded_tensor([[float(version - v) for v in self._token_versions(i, width)] for i in rows],
                             width, torch.float32, device)

    def sequence_advantage(self, i: int) -> float:
        """Completion i's mean advantage over its trained tokens (its one advantage for outcome-level algorithms;
        tool-output tokens, whose advantage is 0, left out)."""
        n = len(self.completion_ids[i])
        trained = self.token_mask([i], n, self.advantages.device)[0].bool() if n else None
        return float(self.advantages[i, :n][trained].mean()) if n and trained.any() else 0.0
