"""The rollout engine protocol: prompts in, sampled completions with the engine's log-probs out.

Every engine (vLLM in-process, transformers, and later a remote server) returns
the same `Completion` records, so the trainer never asks which engine it has.
Weights flow one way: the trainer calls `update_weights` after an optimizer step
and `score` on fixed canary completions to check the engine really holds the new
policy (cohort/trainer/sync_check.py).

Seeds: one per completion, derived from (rollout.seed, generation index, slot),
so a run is reproducible and a resumed run draws the same samples.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Protocol

import torch


@dataclass(frozen=True)
class SamplingConfig:
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0: off

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass
class Completion:
    token_ids: list[int]
    logprobs: list[float]  # the engine's log-prob of each sampled token (temperature applied)
    finish_reason: str  # "stop" (ends with a stop token, kept in token_ids) or "length" (see `finish_reason`)
    policy_version: int = 0


class RolloutEngine(Protocol):
    policy_version: int
    stop_token_ids: list[int]  # the ids that end a completion: the checkpoint's set (`cohort.models.loading.stop_token_ids`)

    def generate(self, prompts: list[list[int]], sampling: SamplingConfig, seeds: list[int] | None = None) -> list[Completion]:
        """One completion per prompt entry (repeat a prompt G times for a group)."""

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> int | None:
        """Load a full set of new weights in place; later generations report `version`.

        Returns the bytes sent over the network for it (remote engines), or None when nothing left the process.
        """

    def score(self, prompts: list[list[int]], completions: list[list[int]], temperature: float = 1.0) -> list[list[float]]:
        """The engine's log-probs of fixed completions, one list per (prompt, completion) pair (the sync check's canaries)."""

    def close(self) -> None: ...


def completion_seeds(base_seed: int, generation_index: int, n: int) -> list[int]:
    """Distinct, reproducible per-completion seeds for one generation batch."""
    start = (base_seed * 1_000_003 + generation_index * 65_537) % (2**31 - n - 1)
    return [start + i for i in range(n)]


def finish_reason(token_ids: list[int], stop_token_ids) -> str:
    """ "stop" when the completion ends with a stop token (also when it is the last token allowed, as vLLM decides),
    else "length": the one rule every engine reports, so the trainer's `truncated` and `completions/clipped_ratio`
    do not depend on the engine."""
    return "stop" if token_ids and token_ids[-1] in stop_token_ids else "length"


def completion_text(tokenizer, completion: Completion) -> str:
    """The text reward functions see: the tokens without the final stop token, special tokens skipped.

    The stop token is cut by position, not by being special: a checkpoint's second
    stop id need not be a special token (e.g. `eos_token_id: [2, 75]` where 75 is a
    plain word piece), and its text is not part of the answer. Special tokens inside
    the completion are skipped as TRL does for rewards (`skip_special_tokens=True`).
    """
    ids = completion.token_ids[:-1] if completion.finish_reason == "stop" else completion.token_ids
    return tokenizer.decode(ids, skip_special_tokens=True)
