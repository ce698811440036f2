"""glibc malloc settings for the daemons' large buffers (docs/benchmarks.md, "Where the
CPU goes").

A chunk moves through a daemon as several 1-4 MiB buffers (a FUSE request's bytes, a
chunk, an RPC message). glibc serves allocations that large with mmap() and unmaps them
on free, so every new buffer costs page faults and the kernel zeroing its pages: measured,
a third of the mount's kernel time while writing. Keeping such blocks in the heap (an
mmap threshold above the largest chunk message) and not trimming the heap after every
free reuses the same, already mapped, often cache-warm memory.

The price is memory the heap keeps after a burst: bounded by the trim threshold per
arena, and the number of arenas is bounded too (gRPC and trio run many threads, and
glibc would give up to 8 per core an arena of its own; with its default dynamic
threshold the mount's resident memory grew to several times its write window). The
thresholds are fixed, so glibc never raises them on its own.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os

log = logging.getLogger(__name__)

# mallopt(3) parameters (malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8

MMAP_THRESHOLD = 32 << 20   # glibc's upper limit for the threshold; above a 4 MiB chunk
TRIM_THRESHOLD = 64 << 20   # free heap kept per arena before it is given back
ARENA_MAX = 4


def tune_malloc(arena_max: int = ARENA_MAX) -> bool:
    """Apply the settings unless the environment sets them ($MALLOC_*_ : the operator's
    word wins) or the C library is not glibc. True when applied."""
    if any(name in os.environ for name in
           ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_ARENA_MAX")):
        return False
    path = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(path)
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):  # not glibc (musl has no mallopt)
        log.debug("mallopt is not available: malloc keeps its defaults")
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return all(mallopt(param, value) == 1 for param, value in (
        (_M_MMAP_THRESHOLD, MMAP_THRESHOLD),
        (_M_TRIM_THRESHOLD, TRIM_THRESHOLD),
        (_M_ARENA_MAX, arena_max)))
