"""Scoring a generation batch's completions with models that are not being differentiated, and the teacher's advantage.

`score_completions` runs the no-grad log-prob passes of the step (the sampling
policy's old log-probs, the distillation teacher's) in one pass over the batch's
micro-batches: each micro-batch is packed once and every model asked scores it,
each in its own context (the policy under the run's autocast; the teacher in its own
dtype, no autocast: `teacher.dtype` is what it computes in). Log-probs are the
chunked kernel's (cohort/models/logprobs.py: no (B, T, V) logits), at the sampler's
temperature, one float32 row per completion.

`distill_micro_batch` is the distillation term of one micro-batch of the update:
the teacher's log-probs of its tokens against the proximal policy's, mixed with the
rewards' advantages by `cohort.algorithms.distill_advantages` (which says why the
proximal policy).

Left out: the reference model under LoRA (the policy with its adapter off: the
Trainer's `reference_logprobs` owns that context).
"""

from __future__ import annotations

import contextlib
from typing import Callable, ContextManager

import torch

from cohort.algorithms import distill_advantages
from cohort.models.batching import HOST, pack_right_padded
from cohort.models.logprobs import completion_logprobs
from cohort.trainer.rollout_batch import RolloutBatch

Scorer = tuple[torch.nn.Module, Callable[[], ContextManager]]  # a model and the context its forward runs in


@torch.no_grad()
def score_completions(batch: RolloutBatch, micro_batches: list[list[int]], scorers: dict[str, Scorer], *, pad_id: int,
                      device: torch.device, temperature: float, chunk_size: int) -> dict[str, list[torch.Tensor]]:
    """{name: one (len(completion),) float32 log-prob row per completion} for every scorer, in one pass."""
    out: dict[str, list[torch.Tensor | None]] = {name: [None] * len(batch) for name in scorers}
    # every micro-batch made on the host and moved before the first forward: the loop copies nothing to the device
    packs = [pack_right_padded([batch.prompt_ids[i] for i in idx], [batch.completion_ids[i] for i in idx], pad_id, HOST).to(device)
             for idx in micro_batches]
    for idx, packed in zip(micro_batches, packs):
        for name, (model, context) in scorers.items():
            with context():
                logp, _ = completion_logprobs(model, packed.input_ids, packed.attention_mask, packed.prompt_lengths,
                                              packed.completion_ids, packed.completion_mask, temperature=temperature,
                                              chunk_size=chunk_size)
            for row, i in enumerate(idx):
                out[name][i] = logp[row, : len(batch.completion_ids[i])].clone()
    return out


def teacher_scorer(teacher: torch.nn.Module) -> Scorer:
    """The teacher computes in the dtype it is held in (teacher.dtype): no autocast around it."""
    return teacher, contextlib.nullcontext


def distill_micro_batch(teacher: torch.Tensor | None, advantages: torch.Tensor, proximal: torch.Tensor,
                        mask: torch.Tensor, teacher_cfg) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """(B, width) advantages of a micro-batch with the teacher's per-token part, and the distill/* metrics; the
    advantages unchanged and no metrics without a teacher. `teacher`: the teacher's (B, width) log-probs of the
    micro-batch (`MicroBatch.teacher_logp`); `proximal`: the ratio's denominator (old log-probs, or the current ones
    detached on-policy), the student's log-probs of the sampled tokens."""
    if teacher is None:
        return advantages, {}
    return distill_advantages(advantages, proximal, teacher, mask, kl_coef=teacher_cfg.kl_coef,
                              reward_weight=teacher_cfg.reward_weight, clip=teacher_cfg.log_ratio_clip)
