"""Recycled buffers: big arrays that nothing references any more are handed out again.

A training loop calls the same kernels with the same shapes every step. A fresh 64 MiB array
costs as much as the kernel that fills it (the OS maps and zeroes every page on first touch), so
halide_ad keeps the big arrays it allocated and reuses one once no one else holds it: not the
caller, not a view of it (a view references its base), not a torch tensor sharing its memory.
An array the caller still holds is never handed out again.

HALIDE_AD_POOL_BYTES caps the bytes kept (default 1 GiB; 0 turns recycling off).
"""
from __future__ import annotations

import ctypes
import functools
import math
import sys
import threading

import numpy as np

from halide_ad import config

MIN_POOLED_BYTES = 1 << 20  # smaller arrays come from malloc's free lists cheaply already
_UNREFERENCED = 3  # the pool's list, the local `a`, getrefcount's own argument


class BufferPool:
    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.arrays: list[np.ndarray] = []  # least recently handed out first
        self.lock = threading.Lock()

    def empty(self, shape: tuple[int, ...], dtype) -> np.ndarray:
        """An uninitialized array: a recycled one when a free one of this shape and dtype exists."""
        dtype = np.dtype(dtype)
        if self.max_bytes <= 0 or dtype.itemsize * math.prod(shape) < MIN_POOLED_BYTES:
            return np.empty(shape, dtype)
        with self.lock:
            for k in range(len(self.arrays)):  # (enumerate's reused tuple would hold a reference)
                a = self.arrays[k]
                if a.shape == shape and a.dtype == dtype and sys.getrefcount(a) == _UNREFERENCED:
                    self.arrays.append(self.arrays.pop(k))
                    return a
            a = np.empty(shape, dtype)
            self.arrays.append(a)
            self._trim()
            return a

    def zeros(self, shape: tuple[int, ...], dtype) -> np.ndarray:
        """An array of zeros: a recycled one when one is free (64 MiB filled in ~10 ms, where a
        fresh one's pages took the OS 70-80 ms to map, load 11), else a fresh one written, not
        np.zeros's: a scatter's `+=` into those read each page first, which maps the OS's zero
        page, then wrote it, which faults again (two page faults a page)."""
        a = self.empty(shape, dtype)
        a.fill(0)
        return a

    def _trim(self) -> None:
        """Forget the least recently used arrays past max_bytes (their holders keep them)."""
        total = sum(a.nbytes for a in self.arrays)
        while total > self.max_bytes and len(self.arrays) > 1:
            total -= self.arrays.pop(0).nbytes


pool = BufferPool(config.pool_bytes())


# glibc's mallopt parameters, and the values its own adaptive thresholds settle at
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
MMAP_THRESHOLD_MAX = 32 << 20  # (DEFAULT_MMAP_THRESHOLD_MAX on 64-bit)


@functools.cache
def keep_freed_memory() -> bool:
    """Set glibc's malloc thresholds to where its adaptive ones end up once a 32 MiB array has
    been freed (arrays under 32 MiB from the heap, free memory kept up to 64 MiB), not after.
    Until then, each piece of the interpreter's numpy temporaries (2-4 MiB) went back to the OS
    when freed and was mapped and zeroed again for the next piece: a bilinear resize's first
    backward on the interpreter took 145,000 page faults and 0.35 s of system time, 93 and 0.02 s
    so. False where malloc is not glibc's."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_MAX)) and bool(mallopt(M_TRIM_THRESHOLD, 2 * MMAP_THRESHOLD_MAX))
