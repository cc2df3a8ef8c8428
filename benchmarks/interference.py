"""Whether taking turns (`timing.measure_turns`) times a call as it runs alone.

    python -m benchmarks.interference

A library's worker threads keep spinning for a while after its call returns, and a call of
another library made right then shares the two cores with them. This times numpy's matmul of two
(1024, 1024) float32 arrays alone, in turns with torch's (a pause and an untimed call of its own
before each timed one, as the runner does), and right after torch's with neither.
"""
from __future__ import annotations

import statistics
import time

import numpy as np

from benchmarks import peers
from benchmarks.timing import measure, measure_turns


def main() -> None:
    torch = peers.load_torch(thp=False)
    a = np.random.default_rng(0).standard_normal((1024, 1024)).astype(np.float32)
    ta = torch.from_numpy(a)
    numpy_matmul, torch_matmul = (lambda: a @ a), (lambda: ta @ ta)
    alone = measure(numpy_matmul, 15)
    turns, _ = measure_turns({"numpy": numpy_matmul, "torch": torch_matmul}, 15)
    right_after = []
    for _ in range(15):
        torch_matmul()
        start = time.perf_counter()
        numpy_matmul()
        right_after.append((time.perf_counter() - start) * 1e3)
    print(f"numpy's matmul, (1024, 1024) float32, {peers.thread_count()} threads, medians of 15: "
          f"alone {alone.median_ms:.2f} ms, in turns with torch's {turns['numpy'].median_ms:.2f} ms, "
          f"right after torch's {statistics.median(right_after):.2f} ms")


if __name__ == "__main__":
    main()
