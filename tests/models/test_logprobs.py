"""Chunked completion log-probs equal the naive full-logits computation, and align as documented."""

from __future__ import annotations


import pytest
import torch

from cohort.models.pretrained import load_policy
from cohort.models.logprobs import completion_logprobs, naive_completion_logprobs
from cohort.models.batching import pack_right_padded


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
    # The embedding's gradient reaches ~22 here; float32 sums in another order agree to ~1e-6 relative (1.7e-5 measured,
    # which 1e-5 refused on main too), so 5e-5 is the bound, as in test_completion_entropy_gradient_matches_naive.
    b = _batch()
    args = (policy, b.input_ids, b.attention_mask, b.prompt_lengths, b.completion_ids, b.completion_mask)
    policy.zero_grad()
    completion_logprobs(*args, chunk_size=2)[0].sum().backward()
    chunked = [p.grad.clone() for p in policy.parameters()]
    policy.zero_grad()
    naive_completion_logprobs(*args)[0].sum().backward()
    for g_chunk, p in zip(chunked, policy.parameters()):
        torch.testing.assert_close(g_chunk, p.grad, rtol=0, atol=5e-5)
    policy.zero_grad()


def _plain_logp_entropy(hidden, weight, bias, targets, temperature, softcap):
    """The same maths with ordinary autograd ops over the whole (C, V) logits."""
    logits = torch.nn.functional.linear(hidden, weight, bias)
    if softcap:
        logits = torch.tanh(logits / softcap) * softcap
    log_probs = torch.log_softmax(logits / temperature, dim=-1)
    return log_probs.gather(-1, targets[:, None]).squeeze(-1), -(log_probs.exp() * log_probs).sum(-1)


@pytest.mark.parametrize("temperature,softcap,with_bias", [(1.0, None, False), (0.7, None, True), (1.3, 5.0, True)])
def test_linear_logprob_values_and_gradients(temperature, softcap, with_bias):
    # LinearLogProb recomputes the logits in the backward and writes g·(onehot − softmax) in place, with the
    # temperature (1/T) and softcap (1 − tanh²) factors; every input gradient must equal plain autograd's.
    from cohort.models.logprobs import LinearLogProb

    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(7, 16, generator=g, requires_grad=True)
    weight = torch.randn(40, 16, generator=g, requires_grad=True)
    bias = torch.randn(40, generator=g, requires_grad=True) if with_bias else None
    targets = torch.randint(0, 40, (7,), generator=g)
    upstream = torch.randn(7, generator=g)  # a non-uniform incoming gradient
    logp, ent = LinearLogProb.apply(hidden, weight, bias, targets, temperature, softcap)
    (logp * upstream).sum().backward()
    fused = [t.grad.clone() for t in (hidden, weight, bias) if t is not None]
    for t in (hidden, weight, bias):
        if t is not None:
            t.grad = None
    ref_logp, ref_ent = _plain_logp_entropy(hidden, weight, bias, targets, temperature, softcap)
    (ref_logp * upstream).sum().backward()
    assert torch.allclose(logp, ref_logp, atol=1e-5)
    assert torch.allclose(ent, ref_ent.detach(), atol=1e-5)
    assert not ent.requires_grad
    for got, t in zip(fused, [t for t in (hidden, weight, bias) if t is not None]):
        assert torch.allclose(got, t.grad, atol=1e-5)


def test_chunk_rows_capped_by_logit_budget(policy):
    # max_chunk_logits = 2 × vocab forces 2-row chunks whatever chunk_size says; results must not change.
    b = _batch()
    args = (policy, b.input_ids, b.attention_mask, b.prompt_lengths, b.completion_ids, b.completion_mask)
    vocab = policy.get_output_embeddings().weight.shape[0]
    with torch.no_grad():
        small, _ = completion_logprobs(*args, chunk_size=1024, max_chunk_logits=2 * vocab)
        ref, _ = naive_completion_logprobs(*args)
    assert torch.allclose(small, ref, atol=1e-5)


@pytest.mark.parametrize("temperature,softcap", [(1.0, None), (0.7, None), (1.3, 5.0)])
def test_entropy_gradient_when_asked(temperature, softcap):
    # With entropy_grad the backward adds the entropy's term to the logits' gradient:
    # H = -sum_k p_k log p_k, d log p_j / d z_k = [j = k] - p_k, so
    # dH/dz_k = -sum_j p_j (log p_j + 1)([j = k] - p_k) = -p_k (log p_k + 1) + p_k sum_j p_j (log p_j + 1)
    #         = -p_k (log p_k + 1) + p_k (1 - H) = -p_k (log p_k + H).
    # Any mix of the two outputs' upstream gradients must then equal plain autograd's over the whole logits.
    from cohort.models.logprobs import LinearLogProb

    g = torch.Generator().manual_seed(1)
    hidden = torch.randn(5, 12, generator=g, requires_grad=True)
    weight = torch.randn(30, 12, generator=g, requires_grad=True)
    bias = torch.randn(30, generator=g, requires_grad=True)
    targets = torch.randint(0, 30, (5,), generator=g)
    up_logp, up_ent = torch.randn(5, generator=g), torch.randn(5, generator=g)
    logp, ent = LinearLogProb.apply(hidden, weight, bias, targets, temperature, softcap, True)
    assert ent.requires_grad
    ((logp * up_logp).sum() + (ent * up_ent).sum()).backward()
    fused = [t.grad.clone() for t in (hidden, weight, bias)]
    for t in (hidden, weight, bias):
        t.grad = None
    ref_logp, ref_ent = _plain_logp_entropy(hidden, weight, bias, targets, temperature, softcap)
    ((ref_logp * up_logp).sum() + (ref_ent * up_ent).sum()).backward()
    for got, t in zip(fused, (hidden, weight, bias)):
        torch.testing.assert_close(got, t.grad, rtol=0, atol=1e-5)


def test_completion_entropy_gradient_matches_naive(policy):
    # Through the model (chunked, temperature 0.7): d(sum of active entropies)/d params equals autograd over the full
    # logits; without entropy_grad the entropy stays out of the graph. The kernel sums in float32 and these gradients
    # reach ~19: they agree to ~2.5e-5 (~1e-6 relative, as the log-probs' gradients do), so 5e-5 is the bound.
    b = _batch()
    args = (policy, b.input_ids, b.attention_mask, b.prompt_lengths, b.completion_ids, b.completion_mask)
    _, ent = completion_logprobs(*args, chunk_size=3, temperature=0.7, entropy_grad=True)
    (ent * b.completion_mask).sum().backward()
    fused = [p.grad.clone() for p in policy.parameters()]
    policy.zero_grad()
    total = (naive_completion_logprobs(*args, temperature=0.7)[1]).sum()  # the full logits' entropies carry autograd's
    total.backward()
    for got, p in zip(fused, policy.parameters()):
        torch.testing.assert_close(got, p.grad, rtol=0, atol=5e-5)
    policy.zero_grad()
    assert not completion_logprobs(*args, chunk_size=3)[1].requires_grad



def _head_grads(hidden, weight, targets, fn, dtype, autocast: bool) -> list[torch.Tensor]:
    """d(sum of the targets' log-probs)/d(hidden, head weight) in float64 on the CPU, computed by `fn` in `dtype` on
    `hidden`'s device (autocast on that device's type)."""
    h = hidden.detach().to(dtype).clone().requires_grad_()
    w = weight.detach().to(dtype).clone().requires_grad_()
    with torch.autocast(h.device.type, dtype=torch.bfloat16, enabled=autocast):
        total = fn(h, w).sum()
    total.backward()  # outside autocast, as the trainer runs it (cohort/trainer/trainer.py)
    return [h.grad.double().cpu(), w.grad.double().cpu()]


CUDA_ONLY = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU (runs in bench/gpu_check's lent-machine command)")


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=CUDA_ONLY)])
def test_bf16_autocast_gradient_on_confident_tokens(policy, device):
    # Under bf16 autocast (train.precision=mixed) the kernel's gradient of the summed log-probs must be at least as close
    # to a float64 reference as plain autocast's log_softmax over the full logits. With logits z and target t,
    #   d log p_t / d z_k = [k = t] − softmax(z)_k,
    # right only when the softmax is formed from the *same* z whose log-sum-exp the forward took. The kernel used to
    # take the lse of autocast's bf16 logits in the forward and recompute float32 logits in the backward (autograd runs
    # it outside autocast), so exp(z32 − lse16) did not sum to one: every softmax entry off by a factor
    # exp(z32_k − z16_k) ≈ 1 ± (bf16 spacing at |z_k|)/2, and the target's term 1 − p_t off by about p_t times that.
    # As p_t → 1 the true 1 − p_t → 0 while that error does not, so on confident tokens it dominates (measured on
    # these, mean p 0.93: 0.71 relative error against plain autocast's 0.14). The head now runs in its weight's dtype
    # (float32 masters) in both passes, so only float32 rounding is left (2e-5); plain autocast keeps its bf16 head.
    # The model: the tiny policy's hidden states (float32, from its body) and its head scaled ×12, targets its greedy
    # tokens, so that the mean p(target) exceeds 0.8 as a pretrained model's own tokens do. On "cuda" the same sums run
    # with CUDA's bf16 autocast and matmuls (the reference stays float64 on the CPU).
    from cohort.models.logprobs import LinearLogProb

    batch = _batch()
    with torch.no_grad():
        hidden = policy.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).last_hidden_state
    hidden = hidden[batch.attention_mask.bool()]  # (M, H): every real position
    weight = policy.get_output_embeddings().weight.detach() * 12.0  # (V, H)
    logits = hidden.double() @ weight.double().t()
    targets = logits.argmax(-1)
    assert torch.softmax(logits, -1).gather(-1, targets[:, None]).mean() > 0.8

    def plain(h, w):
        return torch.log_softmax(torch.nn.functional.linear(h, w).float(), -1).gather(-1, targets.to(h.device)[:, None])

    def kernel(h, w):
        return LinearLogProb.apply(h, w, None, targets.to(h.device), 1.0, None)[0]

    reference = _head_grads(hidden, weight, targets, plain, torch.float64, autocast=False)
    hidden, weight = hidden.to(device), weight.to(device)
    for got, want, name in zip(_head_grads(hidden, weight, targets, kernel, torch.float32, autocast=True),
                               _head_grads(hidden, weight, targets, plain, torch.float32, autocast=True), ("hidden", "weight")):
        ref = reference[0] if name == "hidden" else reference[1]
        kernel_error = ((got - ref).norm() / ref.norm()).item()
        plain_error = ((want - ref).norm() / ref.norm()).item()
        assert kernel_error <= plain_error, (name, kernel_error, plain_error)
        assert kernel_error < 1e-4, (name, kernel_error)  # float32 rounding only: the head is float32 in both passes
