"""Rollout with transformers on the trainer's own model (the fallback engine): continuous batching, else `generate`.

The request level (`submit` / `poll` / `abort`) runs on transformers' continuous batching when it can
(`cohort.rollout.engines.hf_continuous`): requests stream back one by one as they finish, abort returns each one's
tokens so far, and requests of any remaining length share one running batch. That is automatic: on unless
the trainer computes under autocast (the generation thread would not see it), and per request unless it uses
top-k / top-p (transformers would report the filtered distribution's log-probs); a model transformers refuses
or fails on (checked once with a one-token probe) falls back with a warning. `continuous_batching=False`
forces the fallback.

The fallback is plain `generate` behind `BatchRequests`: `poll` samples everything queued as one batch (nothing
streams; the slowest completion decides when any comes back), `abort` only drops requests still queued.

Both share the policy module with the trainer, so a weight update is free and the
engine's log-probs are the trainer's own. In the fallback they are read off the generation
itself, not recomputed by a second forward pass: `SampledLogProbs`, a logits
processor, keeps the log-softmax of the current step's logits (divided by the
sampling temperature, before any top-k/top-p filtering, as the trainer scores
them) and, one step later, picks the log-prob of the token that was sampled
(it is then the last input id). Only one (B, V) buffer is held. Sampling is
seeded per generation batch (from the first completion's seed), so runs are
reproducible.

Stopping: generation stops at every id of `stop_token_ids` (the checkpoint's
set, `cohort.models.pretrained.stop_token_ids`; vLLM gets the same set). A
completion keeps its stop token and reports "stop"; transformers pads a row
that finished before the others with `pad_token_id`, and those pads are cut
off (everything after the first stop id). A stop id sampled as the last
allowed token still reports "stop", as vLLM does.
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Callable, Iterable, Sequence

import torch

from cohort.models.batching import pack_right_padded
from cohort.models.logprobs import completion_logprobs
from cohort.rollout.base import BatchRequests, Request, SamplingConfig, Trajectory
from cohort.rollout.engines.hf_continuous import ContinuousRequests, engine_choice


class SampledLogProbs:
    """Logits processor collecting the log-prob of each sampled token (module docstring); leaves the scores unchanged."""

    def __init__(self, temperature: float):
        self.temperature = temperature
        self.previous: torch.Tensor | None = None  # (B, V) log-softmax of the last step's logits
        self.picked: list[torch.Tensor] = []  # one (B,) per generated token but the last

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self.previous is not None:
            self.picked.append(self.previous.gather(-1, input_ids[:, -1:]).squeeze(-1))
        self.previous = torch.log_softmax(scores.float() / self.temperature, dim=-1)
        return scores

    def finish(self, last_tokens: torch.Tensor) -> torch.Tensor:
        """(B, steps) log-probs, given the tokens sampled at the last step."""
        if self.previous is not None:
            self.picked.append(self.previous.gather(-1, last_tokens[:, None]).squeeze(-1))
        return torch.stack(self.picked, dim=1) if self.picked else last_tokens.new_zeros((last_tokens.shape[0], 0), dtype=torch.float32)


def until_stop(tokens: list[int], stop_token_ids: list[int]) -> list[int]:
    """`tokens` up to and including the first stop id (all of them when none); what follows it is padding."""
    for i, t in enumerate(tokens):
        if t in stop_token_ids:
            return tokens[: i + 1]
    return list(tokens)


class HFEngine(BatchRequests):
    in_flight_updates = False  # its weights are the policy module itself (update_weights)

    def __init__(self, model: torch.nn.Module, *, pad_token_id: int, stop_token_ids: list[int], batch_size: int = 256,
                 compute_context: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
                 continuous_batching: bool = True):
        """`compute_context()` wraps every forward pass: the trainer's autocast when it keeps float32 master weights.
        `continuous_batching`: use transformers' continuous batching where it can (module docstring); False: always
        plain `generate`."""
        self.model = model
        self.compute_context = compute_context
        self.pad_token_id = pad_token_id
        self.stop_token_ids = list(stop_token_ids)
        self.batch_size = batch_size
        self.policy_version = 0
        autocast = not isinstance(compute_context(), contextlib.nullcontext)
        self.continuous = (ContinuousRequests(model, stop_token_ids=self.stop_token_ids, pad_token_id=pad_token_id,
                                              max_requests_per_batch=batch_size)
                           if continuous_batching and not autocast else None)
        self.choice = engine_choice(autocast) if continuous_batching else "plain generate (continuous_batching=False)"

    @property
    def device(self) -> torch.device:
        """Where the model's weights are: every tensor the engine makes goes there."""
        return next(self.model.parameters()).device

    def _streams(self, request: Request) -> bool:
        """Whether `request` goes to continuous batching (starting it for its temperature; a failure to start turns
        continuous batching off for good, with a warning)."""
        if self.continuous is None or not self.continuous.accepts(request.sampling):
            return False
        try:
            self.continuous.start(request.remaining.temperature)
        except RuntimeError as e:
            warnings.warn(f"{e}; the transformers engine falls back to plain generate", stacklevel=3)
            self.choice = f"plain generate ({e})"
            self.continuous.close()
            self.continuous = None
            return False
        return True

    def submit(self, requests: Sequence[Request]) -> None:
        streams = [self._streams(r) for r in requests]
        if any(streams):
            self.continuous.submit([r for r, s in zip(requests, streams) if s], self.policy_version)
        super().submit([r for r, s in zip(requests, streams) if not s])

    def poll(self, timeout: float | None = None) -> list[Trajectory]:
        """The queued plain-generate batch if there is one, else what continuous batching finished."""
        if self._queue or self.continuous is None:
            return super().poll(timeout)
        return self.continuous.poll(timeout, self.policy_version)

    def abort(self, request_ids: Iterable[str] | None = None) -> list[Trajectory]:
        ids = None if request_ids is None else list(request_ids)
        dropped = super().abort(ids)
        return dropped + (self.continuous.abort(ids, self.policy_version) if self.continuous is not None else [])

    @property
    def in_flight(self) -> int:
        return len(self._queue) + (self.continuous.in_flight if self.continuous is not None else 0)

    def _generation_config(self, sampling: SamplingConfig):
        from transformers import GenerationConfig

        return GenerationConfig(
            max_new_tokens=sampling.max_tokens, do_sample=not sampling.greedy,
            temperature=sampling.temperature if not sampling.greedy else None,
            top_p=sampling.top_p if not sampling.greedy else None,
            # 0 switches top-k off; None would let transformers fall back to its default of 50, sampling from a
            # truncated distribution the trainer does not score
            top_k=sampling.top_k if not sampling.greedy else None,
            pad_token_id=self.pad_token_id, eos_token_id=self.stop_token_ids,
        )

    @torch.no_grad()
    def _generate_chunk(self, prompts: list[list[int]], sampling: SamplingConfig) -> list[Trajectory]:
        width = max(len(p) for p in prompts)
        device = self.device
        # left padding for generation; each tensor made once, on the model's device
        ids = torch.tensor([[self.pad_token_id] * (width - len(p)) + list(p) for p in prompts], dtype=torch.long,
                           device=device)  # (B, width)
        attn = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], dtype=torch.long, device=device)
        was_training = self.model.training
        self.model.eval()
        self.model.config.use_cache = True
        from transformers import LogitsProcessorList

        collector = SampledLogProbs(sampling.temperature or 1.0)
        with self.compute_context():
            out = self.model.generate(input_ids=ids, attention_mask=attn, generation_config=self._generation_config(sampling),
                                      logits_processor=LogitsProcessorList([collector]))
        self.model.config.use_cache = False
        self.model.train(was_training)
        new_tokens = out[:, width:]  # (B, steps)
        logprobs = collector.finish(new_tokens[:, -1]) if new_tokens.shape[1] else new_tokens.new_zeros((len(prompts), 0), dtype=torch.float32)
        completions = []
        for b, row in enumerate(new_tokens.tolist()):
            toks = until_stop(row, self.stop_token_ids)
            completions.append(Trajectory.sampled(toks, logprobs[b, : len(toks)].tolist(), self.stop_token_ids, self.policy_version))
        return completions

    @torch.no_grad()
    def _logprobs(self, prompts: list[list[int]], completions: list[list[int]], temperature: float) -> list[list[float]]:
        batch = pack_right_padded(prompts, completions, self.pad_token_id, self.device)
        with self.compute_context():
            logp, _ = completion_logprobs(self.model, batch.input_ids, batch.attention_mask, batch.prompt_lengths,
                                          batch.completion_ids, batch.completion_mask, temperature=temperature)
        return [logp[i, : len(c)].tolist() for i, c in enumerate(completions)]

    def _sample(self, requests: list[Request]) -> list[Trajectory]:
        """The request level's one batch (`BatchRequests`): requests sharing sampling parameters generate together, in
        chunks of batch_size; seeded once per call from the first request's seed."""
        seeds = [r.seed for r in requests if r.seed is not None]
        if seeds:
            torch.manual_seed(seeds[0])
        out: list[Trajectory | None] = [None] * len(requests)
        by_sampling: dict[SamplingConfig, list[int]] = {}
        for i, r in enumerate(requests):
            by_sampling.setdefault(r.remaining, []).append(i)
        for sampling, idx in by_sampling.items():
            for start in range(0, len(idx), self.batch_size):
                chunk = idx[start : start + self.batch_size]
                if sampling.max_tokens == 0:  # a resumed request with nothing left to sample
                    pieces = [Trajectory([], [], "length", self.policy_version) for _ in chunk]
                else:
                    pieces = self._generate_chunk([requests[i].engine_prompt for i in chunk], sampling)
                for i, piece in zip(chunk, pieces):
                    out[i] = piece
        return out  # type: ignore[return-value]

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int, *,
                       in_flight: bool = False) -> None:
        if in_flight:
            raise RuntimeError("HFEngine cannot update weights with requests in flight (in_flight_updates is False): "
                               "it samples with the trainer's own module, whose weights the optimizer changes; use "
                               "engine.name=vllm for asynchronous training")
        self.policy_version = version  # the engine *is* the policy module: nothing to copy

    def score(self, prompts: list[list[int]], completions: list[list[int]], temperature: float = 1.0) -> list[list[float]]:
        return self._logprobs(prompts, completions, temperature)

    def close(self) -> None:
        if self.continuous is not None:
            self.continuous.close()
