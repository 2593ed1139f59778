"""Rollout with transformers `generate` on the trainer's own model (the fallback engine).

It shares the policy module with the trainer, so a weight update is free and the
engine's log-probs are the trainer's own (recomputed by the chunked kernel under
`no_grad`, with the sampling temperature). Sampling is seeded per generation
batch (from the first completion's seed), so runs are reproducible.
"""

from __future__ import annotations

from typing import Iterable

import torch

from cohort.models.logprobs import completion_logprobs
from cohort.rollout.base import Completion, SamplingConfig


class HFEngine:
    def __init__(self, model: torch.nn.Module, *, pad_token_id: int, eos_token_ids: list[int], batch_size: int = 256):
        self.model = model
        self.pad_token_id = pad_token_id
        self.eos_token_ids = list(eos_token_ids)
        self.batch_size = batch_size
        self.policy_version = 0

    def _generation_config(self, sampling: SamplingConfig):
        from transformers import GenerationConfig

        return GenerationConfig(
            max_new_tokens=sampling.max_tokens, do_sample=not sampling.greedy,
            temperature=sampling.temperature if not sampling.greedy else None,
            top_p=sampling.top_p if not sampling.greedy else None,
            top_k=sampling.top_k if (sampling.top_k > 0 and not sampling.greedy) else None,
            pad_token_id=self.pad_token_id, eos_token_id=self.eos_token_ids,
        )

    @torch.no_grad()
    def _generate_chunk(self, prompts: list[list[int]], sampling: SamplingConfig) -> list[Completion]:
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), self.pad_token_id, dtype=torch.long)
        attn = torch.zeros_like(ids)
        for i, p in enumerate(prompts):  # left padding for generation
            ids[i, width - len(p):] = torch.tensor(p)
            attn[i, width - len(p):] = 1
        was_training = self.model.training
        self.model.eval()
        self.model.config.use_cache = True
        out = self.model.generate(input_ids=ids, attention_mask=attn, generation_config=self._generation_config(sampling))
        self.model.config.use_cache = False
        self.model.train(was_training)
        completions = []
        for row in out[:, width:].tolist():
            toks, reason = [], "length"
            for t in row:
                toks.append(t)
                if t in self.eos_token_ids:
                    reason = "stop"
                    break
            if reason == "length" and len(toks) < sampling.max_tokens:
                toks = toks[: len(toks)]
            completions.append(Completion(toks, [], reason, self.policy_version))
        self._fill_logprobs(prompts, completions, sampling.temperature or 1.0)
        return completions

    def _fill_logprobs(self, prompts, completions, temperature: float) -> None:
        for c, lp in zip(completions, self._logprobs(prompts, [c.token_ids for c in completions], temperature)):
            c.logprobs = lp

    @torch.no_grad()
    def _logprobs(self, prompts: list[list[int]], completions: list[list[int]], temperature: float) -> list[list[float]]:
        from cohort.trainer.batching import pack_right_padded

        batch = pack_right_padded(prompts, completions, self.pad_token_id)
        logp, _ = completion_logprobs(self.model, batch.input_ids, batch.attention_mask, batch.prompt_lengths,
                                      batch.completion_ids, batch.completion_mask, temperature=temperature)
        return [logp[i, : len(c)].tolist() for i, c in enumerate(completions)]

    def generate(self, prompts: list[list[int]], sampling: SamplingConfig, seeds: list[int] | None = None) -> list[Completion]:
        if seeds:
            torch.manual_seed(seeds[0])
        out: list[Completion] = []
        for start in range(0, len(prompts), self.batch_size):
            out += self._generate_chunk(prompts[start : start + self.batch_size], sampling)
        return out

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        self.policy_version = version  # the engine *is* the policy module: nothing to copy

    def score(self, prompt: list[int], completion: list[int], temperature: float = 1.0) -> list[float]:
        return self._logprobs([prompt], [completion], temperature)[0]

    def close(self) -> None:
        pass
