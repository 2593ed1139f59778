"""release_host_memory gives the heap's free pages back to the system (glibc's malloc_trim; cohort/models/host_memory.py)."""

from __future__ import annotations

import json
import platform
import subprocess
import sys

import pytest

# Run in a fresh process: its heap holds no free chunks from earlier tests, which the kept tensors below could be
# carved from (then the holes would merge at the heap's top, and free() alone would give them back).
SCENARIO = """
import ctypes, json, re
from pathlib import Path
from cohort.models.host_memory import release_host_memory
MIB = 2**20
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
rss = lambda: int(re.search(r"VmRSS:\\s+(\\d+)", Path("/proc/self/status").read_text()).group(1)) / 1024
def filled(size):  # as PyTorch's CPU allocator makes a tensor (malloc), then writes it: resident
    ptr = libc.malloc(size)
    ctypes.memset(ptr, 1, size)
    return ptr
libc.free(filled(16 * MIB))
holes, kept = [], []
for _ in range(100):
    holes.append(filled(MIB))
    kept.append(filled(4096))
allocated = rss()
for ptr in holes:
    libc.free(ptr)
freed = rss()
released = release_host_memory()
print(json.dumps({"allocated": allocated, "freed": freed, "trimmed": rss(), "released": released,
                  "kept_intact": all(ctypes.string_at(ptr, 4096) == b"\\x01" * 4096 for ptr in kept)}))
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc_trim is glibc's")
def test_the_free_holes_between_live_tensors_leave_the_resident_set():
    # The pattern of a step: tensors of one size freed between tensors that live on (malloc'd as PyTorch's CPU allocator
    # does). glibc mmaps a chunk only above a threshold that a freed 16 MiB mmapped chunk raises to 16 MiB, so the 1 MiB
    # blocks come from the heap. 100 of them (written: resident), each followed by a kept 4 KiB block, then the 100
    # freed: 100 MiB of holes that free() cannot give back (a live block above each). malloc_trim(0) returns their whole
    # pages: the resident set falls by about 100 MiB (each hole keeps the page of its chunk header: 1 MiB - 4 KiB, at
    # most 100 pages less).
    out = subprocess.run([sys.executable, "-c", SCENARIO], capture_output=True, text=True, timeout=300, check=True)
    mib = json.loads(out.stdout.strip().splitlines()[-1])
    assert mib["allocated"] - mib["freed"] < 5  # free() alone gave (almost) nothing back
    assert mib["released"] is True
    assert 99 - 0.4 <= mib["freed"] - mib["trimmed"] <= 101, mib  # 100 holes × (1 MiB - at most one 4 KiB page)
    assert mib["kept_intact"]


def test_off_the_cpu_the_heap_is_left_alone(monkeypatch):
    # A GPU run's activations are not in the host heap: the trainer's calls do nothing there (not even the lookup).
    import torch

    from cohort.models import host_memory

    calls = []
    monkeypatch.setattr(host_memory, "_malloc_trim", lambda: calls.append(1))
    assert host_memory.release_host_memory(torch.device("cuda", 0)) is False
    assert host_memory.release_host_memory(torch.device("meta")) is False
    assert calls == []
