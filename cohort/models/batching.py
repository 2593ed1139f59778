"""Turning lists of token ids into padded tensors, and forming micro-batches.

Sequences are right-padded (prompt then completion, then padding), which a
causal model tolerates without position-id tricks: padding only ever sits after
the real tokens. Micro-batches are formed over length-sorted sequences so that
sequences of similar length share a micro-batch and little compute goes to
padding; with a token budget (`train.max_tokens_per_microbatch`) a micro-batch
also holds at most that many padded cells, so short sequences travel many to a
micro-batch and long ones few. The padding fraction is reported as a metric.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class PackedBatch:
    input_ids: torch.Tensor  # (B, L) prompt + completion, right-padded
    attention_mask: torch.Tensor  # (B, L)
    prompt_lengths: torch.Tensor  # (B,)
    completion_ids: torch.Tensor  # (B, Tc) right-padded
    completion_mask: torch.Tensor  # (B, Tc) 1.0 on real completion tokens

    @property
    def padding_fraction(self) -> float:
        return 1.0 - float(self.attention_mask.sum()) / self.attention_mask.numel()


def pack_right_padded(prompts: list[list[int]], completions: list[list[int]], pad_id: int) -> PackedBatch:
    b = len(prompts)
    seq_lens = [len(p) + len(c) for p, c in zip(prompts, completions)]
    width = max(seq_lens)
    tc = max(1, max(len(c) for c in completions))
    input_ids = torch.full((b, width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((b, width), dtype=torch.long)
    completion_ids = torch.full((b, tc), pad_id, dtype=torch.long)
    completion_mask = torch.zeros((b, tc), dtype=torch.float32)
    for i, (p, c) in enumerate(zip(prompts, completions)):
        input_ids[i, : seq_lens[i]] = torch.tensor(list(p) + list(c), dtype=torch.long)
        attention_mask[i, : seq_lens[i]] = 1
        if c:
            completion_ids[i, : len(c)] = torch.tensor(c, dtype=torch.long)
            completion_mask[i, : len(c)] = 1.0
    return PackedBatch(input_ids, attention_mask, torch.tensor([len(p) for p in prompts]), completion_ids, completion_mask)


def length_sorted_micro_batches(lengths: list[int], micro_batch_size: int, max_tokens: int | None = None) -> list[list[int]]:
    """Indices split into micro-batches, longest first: at most `micro_batch_size` sequences each and, when
    `max_tokens` is set, at most `max_tokens` padded cells (rows × longest row).

    Greedy over the length-sorted order: a micro-batch closes when one more
    sequence would break either limit, so sequences of similar length share a
    micro-batch. A sequence longer than `max_tokens` gets a micro-batch of its own.
    """
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    if not max_tokens:
        return [order[s : s + micro_batch_size] for s in range(0, len(order), micro_batch_size)]
    batches: list[list[int]] = []
    for i in order:
        current = batches[-1] if batches else None
        # sorted longest first, so the micro-batch's width is its first sequence's length
        if current and len(current) < micro_batch_size and (len(current) + 1) * lengths[current[0]] <= max_tokens:
            current.append(i)
        else:
            batches.append([i])
    return batches


def pad_rows(rows: list[torch.Tensor], width: int) -> torch.Tensor:
    """Stack 1-D tensors right-padded with zeros to `width`: (B, width)."""
    out = torch.zeros((len(rows), width), dtype=rows[0].dtype if rows else torch.float32)
    for i, r in enumerate(rows):
        out[i, : r.numel()] = r
    return out
