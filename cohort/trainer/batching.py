"""Turning lists of token ids into padded tensors, and forming micro-batches.

Sequences are right-padded (prompt then completion, then padding), which a
causal model tolerates without position-id tricks: padding only ever sits after
the real tokens. Micro-batches are formed over length-sorted sequences so that
sequences of similar length share a micro-batch and little compute goes to
padding; the padding fraction is reported as a metric.
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


def length_sorted_micro_batches(lengths: list[int], micro_batch_size: int) -> list[list[int]]:
    """Indices split into micro-batches of at most `micro_batch_size`, longest first."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    return [order[s : s + micro_batch_size] for s in range(0, len(order), micro_batch_size)]


def pad_rows(rows: list[torch.Tensor], width: int) -> torch.Tensor:
    """Stack 1-D tensors right-padded with zeros to `width`: (B, width)."""
    out = torch.zeros((len(rows), width), dtype=rows[0].dtype if rows else torch.float32)
    for i, r in enumerate(rows):
        out[i, : r.numel()] = r
    return out
