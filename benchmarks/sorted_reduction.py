"""python -m benchmarks.sorted_reduction: rung 3's partial bins against a sorted reduction, for
`h[idx[r]] += w[r]` (16M float32 weights) into 256, 65536 and 4M bins, with the serial loop.

Both are the deterministic parallel forms that docs/updates.md weighs for colliding writes:
* partial bins (rung 3 as runtime/lower_updates.py lowers it): 16 fixed partitions of the points
  each sum into bins of their own, then each bin adds the partitions' bins in partition order;
* a sorted reduction (Warp's deterministic mode, here a stable counting sort): each partition
  counts its points per bin, the counts' prefix sum in (bin, partition) order places every point,
  each partition moves its values into place, and each bin sums its run. The order within a bin
  is the points' own, so the result has the serial loop's bits.
Written by hand on halide_ad's `parallel_for` and `kernel` (runtime/parallel.py), not generated:
a prototype to decide by measuring. Prints the median of 7 calls of each.
"""
from __future__ import annotations

import time

import numba
import numpy as np
from numba import njit

from halide_ad.runtime.parallel import kernel, parallel_for

PARTITIONS = 16  # as solver/updates.py


@kernel
def _fill(start, stop, idx, w, part, chunk):  # partitions [start, stop): their points into their bins
    for k in range(start, stop):
        for j in range(part.shape[1]):
            part[k, j] = 0
        for p in range(k * chunk, min(k * chunk + chunk, idx.size)):
            part[k, idx[p]] += w[p]


@kernel
def _add(start, stop, part, out):  # bins [start, stop): the partitions' bins in partition order
    for j in range(start, stop):
        acc = out[j]
        for k in range(part.shape[0]):
            acc += part[k, j]
        out[j] = acc


def partial_bins(idx, w, bins):
    part = np.empty((PARTITIONS, bins), w.dtype)
    out = np.zeros(bins, w.dtype)
    parallel_for(_fill, 0, PARTITIONS, idx, w, part, -(-idx.size // PARTITIONS))
    parallel_for(_add, 0, bins, part, out)
    return out


@kernel
def _count(start, stop, idx, counts, chunk):
    for k in range(start, stop):
        for p in range(k * chunk, min(k * chunk + chunk, idx.size)):
            counts[k, idx[p]] += 1


@njit
def _places(counts, start, place):  # the prefix sum in (bin, partition) order
    total = 0
    for j in range(counts.shape[1]):
        start[j] = total
        for k in range(counts.shape[0]):
            place[k, j] = total
            total += counts[k, j]
    start[counts.shape[1]] = total


@kernel
def _move(start, stop, idx, w, place, values, chunk):
    for k in range(start, stop):
        for p in range(k * chunk, min(k * chunk + chunk, idx.size)):
            values[place[k, idx[p]]] = w[p]
            place[k, idx[p]] += 1


@kernel
def _runs(lo, hi, start, values, out):  # each bin's run, in the points' order
    for j in range(lo, hi):
        acc = out[j]
        for q in range(start[j], start[j + 1]):
            acc += values[q]
        out[j] = acc


def sorted_reduction(idx, w, bins):
    chunk = -(-idx.size // PARTITIONS)
    counts = np.zeros((PARTITIONS, bins), np.int64)
    parallel_for(_count, 0, PARTITIONS, idx, counts, chunk)
    start, place = np.empty(bins + 1, np.int64), np.empty((PARTITIONS, bins), np.int64)
    _places(counts, start, place)
    values, out = np.empty(idx.size, w.dtype), np.zeros(bins, w.dtype)
    parallel_for(_move, 0, PARTITIONS, idx, w, place, values, chunk)
    parallel_for(_runs, 0, bins, start, values, out)
    return out


@njit
def serial(idx, w, bins):
    out = np.zeros(bins, w.dtype)
    for p in range(idx.size):
        out[idx[p]] += w[p]
    return out


def main() -> None:
    rng = np.random.default_rng(0)
    n = 1 << 24
    w = rng.standard_normal(n).astype(np.float32)
    print(f"{numba.get_num_threads()} threads, {n} points")
    for bins in (256, 1 << 16, 1 << 22):
        idx = rng.integers(0, bins, n)
        expected = serial(idx, w, bins)
        assert np.array_equal(sorted_reduction(idx, w, bins), expected)  # the serial order's bits
        medians = {}
        for name, fn in (("partial bins", partial_bins), ("sorted", sorted_reduction), ("serial", serial)):
            fn(idx, w, bins)
            times = []
            for _ in range(7):
                t = time.perf_counter()
                fn(idx, w, bins)
                times.append(time.perf_counter() - t)
            medians[name] = np.median(times) * 1e3
        print(f"{bins} bins: " + ", ".join(f"{k} {v:.1f} ms" for k, v in medians.items())
              + f"; sorted / partial bins {medians['sorted'] / medians['partial bins']:.1f}x")


if __name__ == "__main__":
    main()
