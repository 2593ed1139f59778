"""The generation batch the update phase trains on.

`RolloutBatch` holds one generation batch: the sampled completions, their
rewards and advantages, and (only when needed) old, reference and teacher
log-probs and the critic's values and targets. It is built by the phases of a step, each returning its part (the
log-prob phase's `BatchLogprobs`, the critic's values, the advantages), joined by `dataclasses.replace`: no phase sets
a field of a batch in place. `StreamedGradients` is what a batch trained group by group as it was collected carries to
its optimizer step; `MicroBatch` is one micro-batch of it as the update's loop reads it, built whole by
`RolloutBatch.micro_batch` (the host's rows gathered first, then every tensor made and moved to the device at once).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch

from cohort.models.batching import (HOST, PackedBatch, length_sorted_micro_batches, pack_right_padded, pad_rows,
                                    padded_tensor, to_device)
from cohort.rollout.base import EpisodeRecord, Trajectory


@dataclass
class StreamedGradients:
    """The streamed update's state between generation and the optimizer step: accumulated metric sums (loss
    unnormalised) and the loss normaliser's count so far; the gradients themselves sit in the parameters' .grad."""

    sums: dict[str, Any] = field(default_factory=lambda: defaultdict(float))  # tensors on the device until the step
    count: float = 0.0


@dataclass
class MicroBatch:
    """One micro-batch as the update's loop reads it, every tensor on the device (`RolloutBatch.micro_batch`): the
    packed rows, the (B, width) loss mask, and, when the batch has them, each token's off-policy flag (1.0: sampled
    before the batch was taken) and its versions behind the trainer; the engine's log-probs (0 where it gave none);
    `trains_off_policy`: some token in the loss is off-policy (known on the host, so the loop never reads the device to
    decide); the batch's old, reference and teacher log-probs of these rows, (B, width) zero-padded, where it has
    them."""

    packed: PackedBatch
    mask: torch.Tensor
    off: torch.Tensor | None
    behind: torch.Tensor | None
    engine: torch.Tensor
    trains_off_policy: bool
    old_logp: torch.Tensor | None = None
    ref_logp: torch.Tensor | None = None
    teacher_logp: torch.Tensor | None = None


@dataclass(frozen=True)
class BatchLogprobs:
    """The log-prob phase's part of a generation batch, one float32 row per completion token: the sampling policy's
    (old), the reference's and the distillation teacher's log-probs; None where the run has no use for one."""

    old_logp: list[torch.Tensor] | None = None
    ref_logp: list[torch.Tensor] | None = None
    teacher_logp: list[torch.Tensor] | None = None


@dataclass
class RolloutBatch:
    """One generation batch, groups of G consecutive runs. A run is one request's completion (or one seat of it); it is
    one row, or, for an agent run that rewrote its history, one row per model call (its earlier calls just before its
    own row; cohort/trainer/agent_samples.py). `runs` names each row's run, runs numbered 0..R-1 in order, so run r is
    the (r mod G)-th sibling of prompt group r // G: the advantages count runs (`AdvantageInputs.runs`), and a step's
    slice and a process's share are whole runs (`rows_of_runs`). None: every row is its own run (R = N)."""

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
    episodes: list[EpisodeRecord | None] | None = None  # multi-turn: each trajectory's record (`Trajectory.episode`)
    runs: list[int] | None = None  # per row, the run it is a sample of (class docstring); None: each row its own run
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
                   policy_version=policy_version, taken_version=taken_version,
                   versions=[list(t.versions) for t in trajectories],
                   loss_masks=[t.loss_mask for t in trajectories],
                   episodes=[t.episode for t in trajectories] if any(t.episode is not None for t in trajectories)
                   else None, streamed=streamed)

    def with_logprobs(self, logprobs: BatchLogprobs) -> RolloutBatch:
        """This batch with the log-prob phase's part (a new batch: this one is left as it was)."""
        return replace(self, old_logp=logprobs.old_logp, ref_logp=logprobs.ref_logp, teacher_logp=logprobs.teacher_logp)

    def micro_batches(self, indices: list[int], micro_batch_size: int, max_tokens: int | None) -> list[list[int]]:
        """`indices` split into length-sorted micro-batches of at most `micro_batch_size` completions and `max_tokens`
        padded tokens (train.micro_batch_size, train.max_tokens_per_microbatch; cohort/models/batching.py)."""
        lengths = [len(self.prompt_ids[i]) + len(self.completion_ids[i]) for i in indices]
        return [[indices[j] for j in mb] for mb in length_sorted_micro_batches(lengths, micro_batch_size, max_tokens)]

    def micro_batch(self, rows: list[int], *, pad_id: int, device: torch.device, version: int, mask_truncated: bool,
                    mask_stale: bool, staleness_bound: float) -> MicroBatch:
        """Micro-batch `rows` as right-padded tensors on `device`, with its (B, width) loss mask and what its loss reads
        from the batch (the engine's log-probs, each token's staleness behind `version` and off-policy flag, the old,
        reference and teacher log-probs). The loss mask keeps a completion's trained tokens (not padding, not tool
        output) unless the completion is truncated under `mask_truncated` (algorithm.mask_truncated_completions), the
        token is off-policy under `mask_stale` (algorithm.off_policy_objective = mask_stale), or its sampler is more
        than `staleness_bound` versions behind (pipeline.max_staleness, k >= 1; inf otherwise).

        Every tensor is made on the host and moved to the device once,
        before the first forward: the loop over the micro-batches then queues its work without a copy to the device or a
        read back (issue 38, item 7; tests/trainer/test_host_syncs.py)."""
        packed = pack_right_padded([self.prompt_ids[i] for i in rows], [self.completion_ids[i] for i in rows], pad_id, HOST)
        width = packed.completion_mask.shape[1]
        # tool-output tokens (loss mask 0) are in the input but out of the loss, ratio, entropy, KL and normaliser
        mask = packed.completion_mask * self.token_mask(rows, width, HOST) * self._kept(rows, mask_truncated)[:, None]
        off = self.off_policy(rows, width, HOST) if self.versions else None  # tokens sampled before the batch was taken
        behind = self.staleness(rows, width, version, HOST) if self.versions else None
        if mask_stale and off is not None:
            mask = mask * (1.0 - off)  # tokens of older policies: out of the loss
        if staleness_bound < float("inf") and behind is not None:  # tokens staler than the bound: out of it
            mask = mask * (behind <= staleness_bound).float()
        engine = padded_tensor([self.engine_logp[i][:width] for i in rows], width, torch.float32, HOST)  # 0 where none
        trains_off_policy = off is not None and bool((off * mask).sum() > 0)  # read on the host, where it was made
        logps = [pad_rows([logp[i] for i in rows], width) if logp is not None else None
                 for logp in (self.old_logp, self.ref_logp, self.teacher_logp)]  # (already on the device)
        return MicroBatch(packed.to(device), *(None if t is None else to_device(t, device) for t in (mask, off, behind, engine)),
                          trains_off_policy, *logps)

    def trained_mask(self, mask_truncated: bool, device: torch.device) -> torch.Tensor:
        """(N, T) on `device`, 1.0 on each completion's tokens that enter the loss (T = the longest completion, at least
        1): not padding, not tool output (loss mask 0), not a truncated completion under `mask_truncated`."""
        width = max(1, max(len(c) for c in self.completion_ids))
        rows = list(range(len(self)))
        return to_device(self.token_mask(rows, width, HOST) * self._kept(rows, mask_truncated)[:, None], device)

    def _kept(self, rows: list[int], mask_truncated: bool) -> torch.Tensor:
        """(B,) on the host: 1.0 for completions that enter the loss; 0.0 for truncated ones under `mask_truncated`."""
        return torch.tensor([0.0 if mask_truncated and self.truncated[i] else 1.0 for i in rows], device=HOST)

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
        """What completions.jsonl adds for a multi-turn completion, as its record gives it
        (`EpisodeRecord.completion_fields`: the tool loop's conversation, tool status and turns, observation or failure;
        an agent run's conversation, status and calls); {} for a one-turn completion."""
        episode = self.episodes[i] if self.episodes is not None else None
        return episode.completion_fields() if episode is not None else {}

    def __len__(self) -> int:
        return len(self.completion_ids)

    @property
    def num_runs(self) -> int:
        """R: the runs the batch's rows are samples of (its rows when each is its own run)."""
        return len(self) if self.runs is None else (self.runs[-1] + 1 if self.runs else 0)

    def run_of(self, i: int) -> int:
        """The run row i is a sample of."""
        return i if self.runs is None else self.runs[i]

    def rows_of_runs(self, runs) -> list[int]:
        """The rows (in batch order) that are samples of `runs` (a range or a collection of run numbers)."""
        wanted = set(runs)
        return [i for i in range(len(self)) if self.run_of(i) in wanted]

    def runs_of(self, rows: list[int]) -> list[int]:
        """The runs `rows` are samples of, in order, each once."""
        return list(dict.fromkeys(self.run_of(i) for i in rows))

    def step_rows(self, slot: int, steps: int) -> list[int]:
        """The rows optimizer step `slot` (0..steps-1) of the `steps` a batch is cut into trains: the slot's contiguous
        share of the runs (R / steps, whole groups when the plan's arithmetic holds), every sample of each."""
        per_step = self.num_runs // steps
        return self.rows_of_runs(range(slot * per_step, (slot + 1) * per_step))

    def runs_tensor(self, device: torch.device) -> torch.Tensor | None:
        """(N,) long on `device`: each row's run (`AdvantageInputs.runs`); None when every row is its own run."""
        return None if self.runs is None else torch.tensor(self.runs, dtype=torch.long, device=device)

    def _token_versions(self, i: int, width: int) -> list[int]:
        return self.versions[i][:width] if i < len(self.versions) else []

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
