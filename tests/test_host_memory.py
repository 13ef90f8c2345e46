"""training/host_memory.py: glibc keeps what an update frees, so the next
update does not fault its pages in again."""
from __future__ import annotations

import ctypes
import resource

import pytest

from lora_triplay.training import host_memory

MiB = 1 << 20

pytestmark = pytest.mark.skipif(host_memory.glibc_mallopt() is None, reason="glibc only")


def _faults_of_a_second_round(blocks: int = 48, size: int = 2 * MiB) -> int:
    """Minor page faults while allocating and touching `blocks` blocks that a
    first round just freed (what an update's activations do every step)."""
    libc = ctypes.CDLL(None)
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]

    def round_() -> list[int]:
        ptrs = [libc.malloc(size) for _ in range(blocks)]
        for p in ptrs:
            ctypes.memset(p, 1, size)
        return ptrs

    for p in reversed(round_()):  # freed from the top: the heap can shrink
        libc.free(p)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    ptrs = round_()
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    for p in ptrs:
        libc.free(p)
    return faults


def test_trimming_off_keeps_freed_pages_for_the_next_round():
    pages = 48 * 2 * MiB // 4096
    try:
        # glibc's thresholds as a process that trims has them (2 MiB blocks in the heap, trimmed past 4 MiB)
        assert host_memory.set_options({host_memory.M_MMAP_THRESHOLD: 4 * MiB, host_memory.M_TRIM_THRESHOLD: 4 * MiB})
        trimming = _faults_of_a_second_round()
        assert host_memory.set_options(host_memory.KEEP_FREED)
        kept = _faults_of_a_second_round()
    finally:
        host_memory.set_options(host_memory.KEEP_FREED)  # as the test process's learners set it
    assert trimming > pages // 2  # the freed top went back to the kernel and faulted in again
    assert kept < pages // 10


def test_keep_freed_memory_is_off_by_environment(monkeypatch):
    monkeypatch.setattr(host_memory, "_done", None)
    monkeypatch.setenv("LORA_TRIPLAY_KEEP_FREED_MEMORY", "0")
    assert host_memory.keep_freed_memory() is False
    monkeypatch.setattr(host_memory, "_done", None)
    monkeypatch.delenv("LORA_TRIPLAY_KEEP_FREED_MEMORY")
    assert host_memory.keep_freed_memory() is True
    assert host_memory.keep_freed_memory() is True  # once per process, the answer kept
