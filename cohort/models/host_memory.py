"""The host's memory: handing the C heap's free pages back between the phases of a step, and how much there is.

`machine_memory()` reads what this machine gives a process (RAM, or the cgroup's limit when lower; what is available
now besides), for the plan to compare its estimate with (cohort/plan/machine_fit.py). Below, the heap.

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
import os
from dataclasses import dataclass
from pathlib import Path
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


# --------------------------------------------------------------------------- how much memory the machine has


@dataclass(frozen=True)
class MachineMemory:
    """The memory a run may use on one device: `total` bytes (the most it can ever have), `source` (where that was
    read, for messages), `available` bytes now (others' use subtracted; None when not known)."""

    total: int
    source: str
    available: int | None = None


MEMINFO = Path("/proc/meminfo")
CGROUP_LIMITS = (Path("/sys/fs/cgroup/memory.max"),  # cgroup v2, as a container sees its own group
                 Path("/sys/fs/cgroup/memory/memory.limit_in_bytes"))  # cgroup v1 (no limit: a number near 2**63)


def machine_memory() -> MachineMemory | None:
    """This host's memory for one process: /proc/meminfo's MemTotal (elsewhere the physical pages, os.sysconf), or a
    cgroup's limit when that is lower (a container's); MemAvailable beside it. None when neither can be read."""
    fields = _meminfo()
    total, source = fields.get("MemTotal"), "MemTotal"
    if total is None:
        try:
            total, source = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"), "the physical pages"
        except (ValueError, OSError, AttributeError):
            return None
    limit = _cgroup_limit()
    if limit is not None and limit[0] < total:
        total, source = limit
    available = fields.get("MemAvailable")
    return MachineMemory(total, source, None if available is None else min(available, total))


def _meminfo() -> dict[str, int]:
    """/proc/meminfo's lines in bytes (`MemTotal:  24683772 kB`); {} where there is none."""
    try:
        lines = MEMINFO.read_text().splitlines()
    except OSError:
        return {}
    fields = {}
    for line in lines:
        name, _, value = line.partition(":")
        number, *unit = value.split() or ["?"]
        if number.isdigit():
            fields[name] = int(number) * (1024 if unit == ["kB"] else 1)
    return fields


def _cgroup_limit() -> tuple[int, str] | None:
    """The memory limit of this process's cgroup and its file; None when there is none (`max`) or none is readable."""
    for path in CGROUP_LIMITS:
        try:
            text = path.read_text().strip()
        except OSError:
            continue
        if text.isdigit():
            return int(text), f"the cgroup's {path.name}"
    return None
