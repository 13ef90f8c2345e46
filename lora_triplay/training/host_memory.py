"""Keep the memory a CPU update frees for the next update.

An update on the CPU allocates its activations afresh and frees them at its
end (one eval update of SmolLM2-135M, 8 examples in one micro-batch: ~3.5
GB). glibc hands freed memory at the top of its heap back to the kernel once
it passes the trim threshold, so the next update touches those pages again:
a page fault per 4 KiB, ~10 us apiece on the evidence host. Measured
2026-12-06 (bench/bench_eval_update.py, bench/BENCHMARKS.md): 53,000-260,000
faults and ~0.7 s of system time an eval update, none with trimming off,
x0.86-0.92 of the update's time. Off, the process keeps its peak resident,
as tcmalloc and jemalloc (the allocators PyTorch's CPU tuning guides
preload) would. Blocks stay in the heap up to glibc's largest mmap
threshold (32 MiB on 64-bit): larger ones are mapped afresh either way.

Linux with glibc only; elsewhere, or with LORA_TRIPLAY_KEEP_FREED_MEMORY=0,
nothing changes.
"""
from __future__ import annotations

import ctypes
import logging
import os
import sys

log = logging.getLogger(__name__)

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's malloc.h
MMAP_THRESHOLD_MAX = 32 << 20  # glibc's ceiling on 64-bit hosts (HEAP_MAX_SIZE / 2)

KEEP_FREED = {M_TRIM_THRESHOLD: -1, M_MMAP_THRESHOLD: MMAP_THRESHOLD_MAX}  # -1: never trim (mallopt(3))

_done: bool | None = None


def glibc_mallopt():
    """glibc's mallopt, or None (not Linux, not glibc: musl's options differ)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # noqa: B018 (glibc only)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return None
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return mallopt


def set_options(options: dict[int, int]) -> bool:
    """mallopt each (option, value); True where glibc took them all."""
    mallopt = glibc_mallopt()
    return mallopt is not None and all(mallopt(k, v) == 1 for k, v in options.items())


def keep_freed_memory() -> bool:
    """Turn glibc's heap trimming off for this process (once); True where it
    is off. A fixed mmap threshold also stops glibc from moving it."""
    global _done
    if _done is None:
        _done = os.environ.get("LORA_TRIPLAY_KEEP_FREED_MEMORY", "1") != "0" and set_options(KEEP_FREED)
        log.debug("glibc heap trimming off: %s", _done)
    return _done
