"""Handing the C heap's free pages back to the operating system between the phases of a step.

On a CPU every tensor lives in the C library's heap (PyTorch's CPU allocator mallocs; vLLM's CPU engine, the push and
the tokenizers too). glibc keeps what is freed for reuse and gives pages back to the system only from the top of the
heap, or for a chunk it mmapped; and it mmaps only chunks above a threshold that rises, as chunks are freed, up to
32 MiB. So after a step's phases (vLLM's generation, the push into it, the update's activations, micro-batch by
micro-batch) have freed chunks of one size between chunks that live on, those holes stay resident, and the process's
peak resident memory ends up above what it ever held at once, growing with the steps.

Measured on SmolLM2-135M-Instruct (examples/smollm2_add.yaml, 2 steps, glibc's `mallinfo2` sampled every 10 ms):
5.86 GiB live at the peak, 8.16 GiB resident, 1.26 GiB of it free heap; whole runs peaked at 7.94-8.50 GiB.
`release_host_memory()` is glibc's `malloc_trim(0)`, which since glibc 2.8 also returns the whole free pages inside
the heap. With train.release_host_memory (the default) the trainer calls it on the CPU before its update, after each
micro-batch's backward and after the update (`Trainer.step`, `Trainer.backward_micro_batches`, the critic's update):
most of the holes are the micro-batches' own, each of another length than the one before. The same 2 steps then
peaked at 7.41 GiB. The pages come back, zeroed by the kernel, only when they are used again; that is the cost
(docs/runs.md, "Memory on the CPU": 5-7% of a step on the 2-core VM, two pairs of runs).

Elsewhere (macOS, musl) there is no `malloc_trim`, and nothing is done: those allocators return memory their own way.
When the training side is on a GPU nothing is done either: its activations are not in this heap, and the CUDA caching
allocator's blocks are another matter (`torch.cuda.empty_cache`, called where vLLM wakes: cohort/rollout/engines/vllm.py).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


@functools.cache
def _malloc_trim():
    """glibc's `malloc_trim`, or None where the C library has none."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


def release_host_memory(device: torch.device | None = None) -> bool:
    """Give the heap's free pages back to the system; True when some were (glibc), False when none were or it cannot.
    `device`: the training side's; on any but the CPU nothing is done (its activations are not in this heap)."""
    if device is not None and device.type != "cpu":
        return False
    trim = _malloc_trim()
    return bool(trim(0)) if trim is not None else False
