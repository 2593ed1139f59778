"""Prompt rendering and the generation batch the update phase trains on.

`PromptRenderer` turns a dataset prompt (a string, or chat messages rendered with
the tokenizer's chat template) into token ids, applying `data.overlong_prompts`.
`RolloutBatch` holds one generation batch: the sampled completions, their
rewards and advantages, and (only when needed) old and reference log-probs and
the critic's values and targets.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from cohort.data.datasets import DataError, PromptDataset


class PromptRenderer:
    """`max_prompt_length` None keeps every prompt; `limit_name` and `fix` word the messages (cohort/trainer/prompts.py)."""

    def __init__(self, tokenizer, max_prompt_length: int | None, overlong: str, *, limit_name: str = "data.max_prompt_length",
                 fix: str = "raise data.max_prompt_length"):
        self.tokenizer = tokenizer
        self.max_prompt_length = max_prompt_length
        self.overlong = overlong
        self.limit_name = limit_name
        self.fix = fix

    def is_chat(self, prompt: Any) -> bool:
        return isinstance(prompt, list)

    def text(self, prompt: Any) -> str:
        if not self.is_chat(prompt):
            return prompt
        if not getattr(self.tokenizer, "chat_template", None):
            raise DataError(
                "prompts are chat messages but the tokenizer has no chat template; give plain-text prompts or a tokenizer "
                "whose tokenizer_config.json has a chat_template"
            )
        return self.tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)

    def encode(self, prompt: Any) -> list[int]:
        return list(self.tokenizer(self.text(prompt), add_special_tokens=False)["input_ids"])

    def encode_dataset(self, dataset: PromptDataset, name: str) -> tuple[PromptDataset, list[list[int]], int]:
        """Token ids for every row, with overlong prompts handled; returns (dataset, ids, number filtered)."""
        keep_rows, keep_ids, keep_src, dropped = [], [], [], 0
        for row, src in zip(dataset.rows, dataset.sources):
            ids = self.encode(row[dataset.prompt_key])
            if self.max_prompt_length is not None and len(ids) > self.max_prompt_length:
                if self.overlong == "error":
                    raise DataError(
                        f"{src}: prompt has {len(ids)} tokens > {self.limit_name} = {self.max_prompt_length}; "
                        f"{self.fix}, or set data.overlong_prompts to filter or truncate_left"
                    )
                if self.overlong == "filter":
                    dropped += 1
                    continue
                ids = ids[-self.max_prompt_length:]
            keep_rows.append(row)
            keep_ids.append(ids)
            keep_src.append(src)
        if not keep_rows:
            raise DataError(f"{name}: every prompt is longer than {self.limit_name} = {self.max_prompt_length}; {self.fix}")
        return PromptDataset(keep_rows, dataset.prompt_key, keep_src), keep_ids, dropped


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

    def __len__(self) -> int:
        return len(self.completion_ids)

    def sequence_advantage(self, i: int) -> float:
        """Completion i's mean advantage over its tokens (its one advantage for outcome-level algorithms)."""
        n = len(self.completion_ids[i])
        return float(self.advantages[i, :n].mean()) if n else 0.0
