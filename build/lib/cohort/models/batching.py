"""Turning lists of token ids into padded tensors, and forming micro-batches.

Sequences are right-padded (prompt then completion, then padding), which a
causal model tolerates without position-id tricks: padding only ever sits after
the real tokens. Micro-batches are formed over length-sorted sequences so that
sequences of similar length share a micro-batch and little compute goes to
padding; with a token budget (`train.max_tokens_per_microbatch`) a micro-batch
also holds at most that many padded cells, so short sequences travel many to a
micro-batch and long ones few. The padding fraction is reported as a metric.

Every tensor is made in one call, never row by row: on the device it is asked for, or on the host and moved whole
with `to_device` (the trainer's micro-batches, all moved before the first forward so that its loop over them copies
nothing to the device).
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

    def to(self, device: torch.device | str | None) -> PackedBatch:
        """Every tensor on `device` (`to_device`)."""
        return PackedBatch(*(to_device(t, device) for t in (self.input_ids, self.attention_mask, self.prompt_lengths,
                                                             self.completion_ids, self.completion_mask)))


HOST = torch.device("cpu")  # where the trainer stages host-made tensors, named so (never by omission) before `to_device`


def to_device(t: torch.Tensor, device: torch.device | str | None) -> torch.Tensor:
    """Host tensor `t` on `device` (itself when already there, or for None). Onto a CUDA device it goes from pinned
    memory without blocking the host: the copy queues behind the device's work instead of the host waiting for it, as
    `torch.tensor(list, device="cuda")` does (issue 38, item 7)."""
    device = torch.device(device) if device is not None else t.device
    if t.device == device:
        return t
    if device.type == "cuda" and t.device.type == "cpu":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


def pack_right_padded(prompts: list[list[int]], completions: list[list[int]], pad_id: int,
                      device: torch.device | str | None = None) -> PackedBatch:
    """Prompt + completion rows, right-padded, as tensors on `device` (the model's; None: the CPU). The rows are padded
    as Python lists and each tensor is made in one call on `device`: one host-to-device copy per tensor, not one per row."""
    sequences = [list(p) + list(c) for p, c in zip(prompts, completions)]
    width = max(len(s) for s in sequences)
    tc = max(1, max(len(c) for c in completions))
    input_ids = padded_tensor(sequences, width, torch.long, device, fill=pad_id)  # (B, L)
    attention_mask = padded_tensor([[1] * len(s) for s in sequences], width, torch.long, device)  # (B, L)
    completion_ids = padded_tensor(completions, tc, torch.long, device, fill=pad_id)  # (B, Tc)
    completion_mask = padded_tensor([[1.0] * len(c) for c in completions], tc, torch.float32, device)  # (B, Tc)
    prompt_lengths = torch.tensor([len(p) for p in prompts], dtype=torch.long, device=device)  # (B,)
    return PackedBatch(input_ids, attention_mask, prompt_lengths, completion_ids, completion_mask)


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


def split_to_count(batches: list[list[int]], count: int) -> list[list[int]]:
    """`batches` with the largest one halved (its longer rows first) until there are `count`: several training
    processes must run the same number of micro-batches (each one's forward and backward are collectives under FSDP).
    Halving never breaks a token budget; order within the list is kept."""
    batches = [list(b) for b in batches]
    if sum(len(b) for b in batches) < count:
        raise ValueError(f"{sum(len(b) for b in batches)} rows cannot make {count} micro-batches")
    while len(batches) < count:
        k = max(range(len(batches)), key=lambda j: len(batches[j]))
        half = (len(batches[k]) + 1) // 2
        batches[k:k + 1] = [batches[k][:half], batches[k][half:]]
    return batches


def padded_tensor(rows: list[list], width: int, dtype: torch.dtype, device: torch.device | str | None,
                  fill: float = 0) -> torch.Tensor:
    """(len(rows), width) of Python lists right-padded with `fill`, made in one call on `device` (one host-to-device
    copy, never one per row). Rows longer than `width` are an error of the caller."""
    return torch.tensor([list(r) + [fill] * (width - len(r)) for r in rows], dtype=dtype, device=device).reshape(len(rows), width)


def pad_rows(rows: list[torch.Tensor], width: int, device: torch.device | str | None = None) -> torch.Tensor:
    """Stack 1-D tensors right-padded with zeros to `width`: (B, width), on the rows' device (or `device` when given,
    and for no rows)."""
    device = device if device is not None else (rows[0].device if rows else None)
    out = torch.zeros((len(rows), width), dtype=rows[0].dtype if rows else torch.float32, device=device)
    for i, r in enumerate(rows):
        out[i, : r.numel()] = r
    return out
