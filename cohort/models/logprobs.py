"""Completion-token log-probs and entropy without the full (B, T, V) logits.

Alignment (pinned in tests): the logits at position t predict token t+1, so the
log-prob of completion token j of row b, which sits at position
`prompt_len[b] + j`, is read from the hidden state at `prompt_len[b] + j - 1`.
Only active completion tokens are scored: the hidden states of those positions
are gathered into one (M, H) matrix and pushed through the LM head in chunks of
`chunk_size` rows; with gradients on, each chunk is recomputed in the backward
pass (activation checkpointing), so at most one chunk of (chunk_size, V) float32
logits is alive at a time. Temperature divides the logits before the softmax,
the same temperature the sampler used.

Left out: packing several sequences into one row (needs a varlen attention
kernel); right padding within a micro-batch is used instead, and the trainer
sorts by length to keep it small.
"""

from __future__ import annotations

import torch
from torch.utils.checkpoint import checkpoint


def decoder_and_head(model: torch.nn.Module) -> tuple[torch.nn.Module, torch.nn.Module]:
    """The transformer body (returns hidden states) and the LM head of a causal LM."""
    head = model.get_output_embeddings()
    body = getattr(model, model.base_model_prefix, None) if getattr(model, "base_model_prefix", None) else None
    if body is None or head is None:
        raise TypeError(f"{type(model).__name__} does not expose a decoder body and an output embedding")
    return body, head


def _chunk_logp_entropy(hidden: torch.Tensor, targets: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                        temperature: float, softcap: float | None) -> tuple[torch.Tensor, torch.Tensor]:
    logits = torch.nn.functional.linear(hidden, weight, bias).float()  # (C, V)
    if softcap:
        logits = torch.tanh(logits / softcap) * softcap
    logits = logits / temperature
    lse = torch.logsumexp(logits, dim=-1)  # (C,)
    logp = logits.gather(-1, targets[:, None]).squeeze(-1) - lse
    with torch.no_grad():
        probs = torch.softmax(logits, dim=-1)
        entropy = lse - (probs * logits).sum(-1)
    return logp, entropy


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
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token log-probs and entropies of the completion tokens, (B, Tc) each, 0 at padding.

    Log-probs carry gradients when grad is enabled; entropies never do.
    """
    body, head = decoder_and_head(model)
    hidden = body(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state  # (B, L, H)
    b, tc = completion_ids.shape
    positions = prompt_lengths[:, None] + torch.arange(tc, device=input_ids.device)[None, :] - 1  # (B, Tc)
    active = completion_mask.bool()
    rows = torch.arange(b, device=input_ids.device)[:, None].expand(b, tc)[active]  # (M,)
    h = hidden[rows, positions[active]]  # (M, H)
    targets = completion_ids[active]  # (M,)
    softcap = getattr(model.config, "final_logit_softcapping", None)
    weight, bias = head.weight, getattr(head, "bias", None)
    logps, entropies = [], []
    for start in range(0, h.shape[0], chunk_size):
        args = (h[start : start + chunk_size], targets[start : start + chunk_size], weight, bias, temperature, softcap)
        if torch.is_grad_enabled():
            lp, ent = checkpoint(_chunk_logp_entropy, *args, use_reentrant=False)
        else:
            lp, ent = _chunk_logp_entropy(*args)
        logps.append(lp)
        entropies.append(ent)
    out_logp = hidden.new_zeros((b, tc), dtype=torch.float32)
    out_ent = torch.zeros((b, tc), dtype=torch.float32, device=input_ids.device)
    if logps:
        out_logp = out_logp.index_put((rows, torch.nonzero(active, as_tuple=True)[1]), torch.cat(logps))
        out_ent[active] = torch.cat(entropies)
    return out_logp, out_ent


def naive_completion_logprobs(model, input_ids, attention_mask, prompt_lengths, completion_ids, completion_mask, *, temperature=1.0):
    """Reference implementation over the full logits (tests and benchmarks only)."""
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits.float() / temperature  # (B, L, V)
    logp_all = torch.log_softmax(logits, dim=-1)
    b, tc = completion_ids.shape
    positions = (prompt_lengths[:, None] + torch.arange(tc)[None, :] - 1).clamp(0, input_ids.shape[1] - 1)
    picked = logp_all[torch.arange(b)[:, None], positions]  # (B, Tc, V)
    logp = picked.gather(-1, completion_ids[..., None]).squeeze(-1)
    entropy = -(picked.exp() * picked).sum(-1)
    mask = completion_mask.float()
    return logp * mask, entropy * mask
