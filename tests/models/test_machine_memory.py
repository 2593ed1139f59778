"""How much memory the host gives a process (cohort/models/host_memory.py `machine_memory`), from faked /proc files."""

from __future__ import annotations

import pytest

from cohort.models import host_memory

MEMINFO = "MemTotal:       24683772 kB\nMemFree:        20112972 kB\nMemAvailable:   10485760 kB\nHugePages_Total:       0\n"


@pytest.fixture
def proc(tmp_path, monkeypatch):
    """A fake /proc/meminfo and the two cgroup limit files (absent until a test writes them)."""
    (tmp_path / "meminfo").write_text(MEMINFO)
    v2, v1 = tmp_path / "memory.max", tmp_path / "memory.limit_in_bytes"
    monkeypatch.setattr(host_memory, "MEMINFO", tmp_path / "meminfo")
    monkeypatch.setattr(host_memory, "CGROUP_LIMITS", (v2, v1))
    return v2, v1


def test_ram_is_memtotal_and_available_is_memavailable(proc):
    # 24,683,772 kB × 1,024 = 25,276,182,528 B; 10,485,760 kB = 10 GiB = 10,737,418,240 B
    assert host_memory.machine_memory() == host_memory.MachineMemory(25_276_182_528, "MemTotal", 10_737_418_240)


def test_a_lower_cgroup_limit_is_the_total(proc):
    v2, v1 = proc
    v2.write_text("8589934592\n")  # a container of 8 GiB: the total, and what is available is at most that
    assert host_memory.machine_memory() == host_memory.MachineMemory(8_589_934_592, "the cgroup's memory.max", 8_589_934_592)


@pytest.mark.parametrize("v2,v1", [("max\n", None), (None, "9223372036854771712\n")])
def test_no_cgroup_limit_leaves_memtotal(proc, v2, v1):
    # cgroup v2 says `max`, v1 a number near 2**63: no limit below the RAM
    for path, text in zip(proc, (v2, v1)):
        if text is not None:
            path.write_text(text)
    assert host_memory.machine_memory().total == 25_276_182_528
