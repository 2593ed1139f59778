"""Chunked completion log-probs equal the naive full-logits computation, and align as documented."""

from __future__ import annotations

import pytest
import torch

from cohort.models.loading import load_policy
from cohort.models.logprobs import completion_logprobs, naive_completion_logprobs
from cohort.trainer.batching import pack_right_padded


@pytest.fixture(scope="module")
def policy(tiny_model_dir):
    return load_policy(tiny_model_dir, "float32")


def _batch():
    prompts = [[49, 50, 43, 51, 61], [55, 45, 51, 61], [57, 61]]
    completions = [[52, 256], [51, 52, 53, 256], [48]]
    return pack_right_padded(prompts, completions, 256)


@pytest.mark.parametrize("chunk_size", [1, 3, 1024])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_chunked_equals_naive(policy, chunk_size, temperature):
    b = _batch()
    args = (policy, b.input_ids, b.attention_mask, b.prompt_lengths, b.completion_ids, b.completion_mask)
    with torch.no_grad():
        logp, ent = completion_logprobs(*args, temperature=temperature, chunk_size=chunk_size)
        ref_logp, ref_ent = naive_completion_logprobs(*args, temperature=temperature)
    assert torch.allclose(logp, ref_logp, atol=1e-5)
    assert torch.allclose(ent, ref_ent, atol=1e-5)
    assert torch.all(logp[b.completion_mask == 0] == 0)


def test_alignment_by_hand(policy):
    # Row 1: prompt "7-3=" (4 tokens), completion [51, 52]. The log-prob of completion token 0 (id 51)
    # must come from the logits at position 3 (the "=" token), token 1 (id 52) from position 4.
    b = pack_right_padded([[55, 45, 51, 61]], [[51, 52]], 256)
    with torch.no_grad():
        logp, _ = completion_logprobs(policy, b.input_ids, b.attention_mask, b.prompt_lengths, b.completion_ids, b.completion_mask)
        full = torch.log_softmax(policy(input_ids=b.input_ids).logits.float(), -1)[0]  # (L, V)
    expected = torch.stack([full[3, 51], full[4, 52]])
    assert torch.allclose(logp[0], expected, atol=1e-6)


def test_gradients_match_naive(policy):
    b = _batch()
    args = (policy, b.input_ids, b.attention_mask, b.prompt_lengths, b.completion_ids, b.completion_mask)
    policy.zero_grad()
    completion_logprobs(*args, chunk_size=2)[0].sum().backward()
    chunked = [p.grad.clone() for p in policy.parameters()]
    policy.zero_grad()
    naive_completion_logprobs(*args)[0].sum().backward()
    for g_chunk, p in zip(chunked, policy.parameters()):
        assert torch.allclose(g_chunk, p.grad, atol=1e-5)
    policy.zero_grad()
