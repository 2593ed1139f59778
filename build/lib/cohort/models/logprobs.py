"""Completion-token log-probs and entropy without the full (B, T, V) logits.

Alignment (pinned in tests): the logits at position t predict token t+1, so the
log-prob of completion token j of row b, which sits at position
`prompt_len[b] + j`, is read from the hidden state at `prompt_len[b] + j - 1`.
Every completion position is scored, padding included (set to 0 after): the
hidden states are gathered into one (B·Tc, H) matrix and pushed through the LM
head in chunks of
at most `chunk_size` rows, and of at most `max_chunk_logits` logits (so a
151,936-token vocabulary gets chunks of ~110 rows: 64 MiB of float32 logits).
Each chunk goes through `LinearLogProb`, an autograd function that keeps only
the chunk's hidden states and log-sum-exp for the backward and recomputes the
logits there, writing the gradient `g · (onehot − softmax)` over the logits in
place: at most about two (rows, V) float32 buffers are alive at a time, in the
forward and the backward alike (plain activation checkpointing of the same
maths held ~5: logits, their temperature-scaled copy, softmax, the product for
the entropy, the logits' gradient). The head's matmul runs with autocast off,
in both passes: in float32 when the forward ran under autocast
(`train.precision=mixed`: the float32 masters, or a LoRA run's bf16 base upcast
exactly, one transient (V, H) float32 copy per chunk), else in the head
weight's own dtype. The backward must form its softmax from the very logits
whose log-sum-exp the forward took, and autograd runs it outside autocast: a
bf16 forward and a float32 recomputation gave a softmax that did not sum to
one, and on confident tokens (p → 1, where the true gradient 1 − p → 0) a
gradient 0.7 off (tests/models/test_logprobs.py). On SmolLM2-135M-Instruct the
float32 head also takes 12% off the mean gap to a bf16 vLLM engine's log-probs
(docs/performance.md). Temperature divides the logits before the
softmax, the same temperature the sampler used. The entropy carries a gradient
only when asked (`entropy_grad=True`, for an entropy bonus): the backward then
adds ``−g_H · p · (log p + H)`` per logit (dH/dz_k = −p_k (log p_k + H)) to the
same buffer, with one more (C, V) buffer alive while it is formed.

Left out: packing several sequences into one row (needs a varlen attention
kernel); right padding within a micro-batch is used instead, and the trainer
sorts by length to keep it small. Scoring only the active tokens would need a
boolean-mask index, whose size is data: on a GPU the host would then wait for the
body's forward before it could queue the head (a sync per micro-batch); the
padded positions' head work is the price of not waiting.
"""

from __future__ import annotations

import torch

from cohort.models.batching import pack_right_padded
from cohort.models.devices import autocast_device_type

# A model whose root module is sharded with FSDP2 (cohort/distributed/fsdp.py) carries a method of this name that runs a
# function inside the root's FSDP forward hooks: the kernel below reads the root's embeddings, norm and head weight
# without calling the model's forward, so it goes through that method to have them gathered (and their grads reduced).
ROOT_FORWARD = "cohort_root_forward"


def decoder_and_head(model: torch.nn.Module) -> tuple[torch.nn.Module, torch.nn.Module]:
    """The transformer body (returns hidden states) and the LM head of a causal LM."""
    head = model.get_output_embeddings()
    body = getattr(model, model.base_model_prefix, None) if getattr(model, "base_model_prefix", None) else None
    if body is None or head is None:
        raise TypeError(f"{type(model).__name__} does not expose a decoder body and an output embedding")
    return body, head


def _logits(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, head_dtype: torch.dtype,
            temperature: float, softcap: float | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Float32 (C, V) logits after softcap and temperature, and tanh(z / softcap) when capped (for the backward).

    The matmul runs in `head_dtype` with autocast off, in the forward and the backward alike (module docstring)."""
    with torch.autocast(device_type=autocast_device_type(hidden.device), enabled=False):
        bias = None if bias is None else bias.to(head_dtype)
        logits = torch.nn.functional.linear(hidden.to(head_dtype), weight.to(head_dtype), bias).float()  # (C, V)
    squashed = None
    if softcap:
        squashed = torch.tanh(logits / softcap)
        logits = squashed * softcap
    if temperature != 1.0:
        logits.div_(temperature)
    return logits, squashed


class LinearLogProb(torch.autograd.Function):
    """(hidden (C, H), LM head) -> log-prob of `targets` (C,) and entropy (C,), without saving the logits.

    Forward: logits → log-sum-exp → log-prob of the target, and the entropy
    lse − Σ p·logits from one more (C, V) buffer (p). Backward: the logits are
    recomputed and turned in place into d logp / d logits = onehot − softmax,
    scaled by the incoming gradient (and by the temperature and softcap
    derivatives), then the two matmuls give the hidden-state and weight
    gradients. The entropy carries a gradient only with ``entropy_grad``:
    d logits += −g_H · p · (log p + H).
    """

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, temperature: float, softcap: float | None, entropy_grad: bool = False):
        # float32 under autocast (train.precision=mixed) whatever the head is held in; else the head's own dtype
        head_dtype = torch.float32 if torch.is_autocast_enabled(autocast_device_type(hidden.device)) else weight.dtype
        logits, _ = _logits(hidden, weight, bias, head_dtype, temperature, softcap)
        lse = torch.logsumexp(logits, dim=-1)  # (C,)
        logp = logits.gather(-1, targets[:, None]).squeeze(-1) - lse
        probs = (logits - lse[:, None]).exp_()
        # H = lse − Σ p·logits (summing p·logits, not p·log p, keeps float32 error small over a large vocabulary);
        # the batched dot product avoids a third (C, V) buffer for the elementwise product.
        entropy = lse - (probs[:, None, :] @ logits[:, :, None]).reshape(-1)
        ctx.save_for_backward(hidden, weight, bias, targets, lse, entropy)
        ctx.temperature, ctx.softcap, ctx.entropy_grad, ctx.head_dtype = temperature, softcap, entropy_grad, head_dtype
        if not entropy_grad:
            ctx.mark_non_differentiable(entropy)
        return logp, entropy

    @staticmethod
    def backward(ctx, grad_logp, grad_entropy):
        hidden, weight, bias, targets, lse, entropy = ctx.saved_tensors
        hidden_dtype, weight_dtype, head_dtype = hidden.dtype, weight.dtype, ctx.head_dtype
        with torch.no_grad():
            head = weight.to(head_dtype)  # (V, H): the weight itself, or one upcast copy for this chunk's two matmuls
            logits, squashed = _logits(hidden, head, bias, head_dtype, ctx.temperature, ctx.softcap)  # the forward's, bit for bit
            log_probs = logits.sub_(lse[:, None])
            if ctx.entropy_grad and grad_entropy is not None:  # −p (g + g_H (log p + H)): the entropy's term joins
                scale = (log_probs + entropy[:, None]).mul_(grad_entropy[:, None]).add_(grad_logp[:, None])
                grad = log_probs.exp_().mul_(scale).neg_()
                del scale
            else:
                grad = log_probs.exp_().mul_(-grad_logp[:, None])  # −g · softmax
            grad.scatter_add_(-1, targets[:, None], grad_logp[:, None].to(grad.dtype))  # + g · onehot
            if ctx.temperature != 1.0:
                grad.div_(ctx.temperature)
            if squashed is not None:
                grad.mul_(1.0 - squashed.square_())
            grad = grad.to(head_dtype)  # the two matmuls in the head's dtype too (one (C, V) buffer: grad)
            grad_hidden = (grad @ head).to(hidden_dtype) if ctx.needs_input_grad[0] else None
            grad_weight = (grad.t() @ hidden.to(head_dtype)).to(weight_dtype) if ctx.needs_input_grad[1] else None
            grad_bias = grad.sum(0).to(weight_dtype) if bias is not None and ctx.needs_input_grad[2] else None
        return grad_hidden, grad_weight, grad_bias, None, None, None, None


def completion_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,  # (B, L) prompt + completion, right-padded
    attention_mask: torch.Tensor,  # (B, L)
    prompt_lengths: torch.Tensor,  # (B,)
    completion_ids: torch.Tensor,  # (B, Tc) right-padded
    completion_mask: torch.Tensor,  # (B, Tc) 1 for real completion tokens
    *,
    temperature: float = 1.0,
    chunk_size: int = 1024,
    max_chunk_logits: int = 2**24,
    entropy_grad: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token log-probs and entropies of the completion tokens, (B, Tc) each, 0 at padding.

    Log-probs carry gradients when grad is enabled; entropies only with ``entropy_grad``. A chunk
    holds at most `chunk_size` tokens and at most `max_chunk_logits` logits.
    """
    root_forward = getattr(model, ROOT_FORWARD, None)  # FSDP2-sharded root: the kernel runs inside its forward hooks
    if root_forward is not None:
        return root_forward(_completion_logprobs, model, input_ids, attention_mask, prompt_lengths, completion_ids,
                            completion_mask, temperature=temperature, chunk_size=chunk_size, max_chunk_logits=max_chunk_logits,
                            entropy_grad=entropy_grad)
    return _completion_logprobs(model, input_ids, attention_mask, prompt_lengths, completion_ids, completion_mask,
                                temperature=temperature, chunk_size=chunk_size, max_chunk_logits=max_chunk_logits,
                                entropy_grad=entropy_grad)


def _completion_logprobs(model, input_ids, attention_mask, prompt_lengths, completion_ids, completion_mask, *,
                         temperature: float, chunk_size: int, max_chunk_logits: int,
                         entropy_grad: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """completion_logprobs' body (shapes there)."""
    body, head = decoder_and_head(model)
    hidden = body(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state  # (B, L, H)
    b, tc = completion_ids.shape
    # every (row, completion position), padding included: a boolean-mask index here would make the host wait for the
    # whole body's forward on a GPU (its size is data); padded positions are scored and set to 0 below
    positions = prompt_lengths[:, None] + torch.arange(tc, device=input_ids.device)[None, :] - 1  # (B, Tc)
    positions = positions.clamp_(0, hidden.shape[1] - 1)  # (padding past a row's end: any position, zeroed below)
    width = hidden.shape[2]
    h = hidden.gather(1, positions[:, :, None].expand(b, tc, width)).reshape(b * tc, width)  # (B·Tc, H)
    targets = completion_ids.reshape(b * tc)  # (B·Tc,)
    softcap = getattr(model.config, "final_logit_softcapping", None)
    weight, bias = head.weight, getattr(head, "bias", None)
    if weight.dtype != hidden.dtype and not torch.is_autocast_enabled(autocast_device_type(hidden.device)):  # a float32 pass over a
        weight, bias = weight.to(hidden.dtype), None if bias is None else bias.to(hidden.dtype)  # bf16 head (float32_weights)
    rows_per_chunk = max(1, min(chunk_size, max_chunk_logits // weight.shape[0]))
    logps, entropies = [], []
    for start in range(0, h.shape[0], rows_per_chunk):
        end = start + rows_per_chunk
        lp, ent = LinearLogProb.apply(h[start:end], weight, bias, targets[start:end], temperature, softcap, entropy_grad)
        logps.append(lp)
        entropies.append(ent)
    active = completion_mask.bool()
    if not logps:
        zeros = torch.zeros((b, tc), dtype=torch.float32, device=input_ids.device)
        return zeros, zeros.clone()
    zero = hidden.new_zeros((), dtype=torch.float32)
    out_logp = torch.where(active, torch.cat(logps).reshape(b, tc), zero)
    out_ent = torch.where(active, torch.cat(entropies).float().reshape(b, tc), zero)  # (keeps the entropy's graph)
    return out_logp, out_ent


@torch.no_grad()
def sequence_logprobs(model, prompt: list[int], completion: list[int], *, pad_id: int = 0, temperature: float = 1.0) -> torch.Tensor:
    """Log-probs of one completion's tokens after its prompt, as the trainer scores them (the weight-sync canary)."""
    pb = pack_right_padded([prompt], [completion], pad_id, next(model.parameters()).device)
    logp, _ = completion_logprobs(model, pb.input_ids, pb.attention_mask, pb.prompt_lengths, pb.completion_ids,
                                  pb.completion_mask, temperature=temperature)
    return logp[0, : len(completion)]


def naive_completion_logprobs(model, input_ids, attention_mask, prompt_lengths, completion_ids, completion_mask, *, temperature=1.0):
    """Reference implementation over the full logits (tests and benchmarks only)."""
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits.float() / temperature  # (B, L, V)
    logp_all = torch.log_softmax(logits, dim=-1)
    b, tc = completion_ids.shape
    positions = (prompt_lengths[:, None] + torch.arange(tc, device=input_ids.device)[None, :] - 1).clamp(0, input_ids.shape[1] - 1)
    picked = logp_all[torch.arange(b, device=input_ids.device)[:, None], positions]  # (B, Tc, V)
    logp = picked.gather(-1, completion_ids[..., None]).squeeze(-1)
    entropy = -(picked.exp() * picked).sum(-1)
    mask = completion_mask.float()
    return logp * mask, entropy * mask
