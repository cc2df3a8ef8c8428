"""Wall-clock timing: medians over repeated runs after a warm-up."""
from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Timing:
    """Repeated measurements of one operation, in milliseconds."""

    median_ms: float
    min_ms: float
    samples_ms: tuple[float, ...]


def time_once(fn: Callable[[], T]) -> tuple[T, float]:
    """Run `fn` once; return its result and the seconds it took (used for first calls)."""
    start = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - start


def measure(fn: Callable[[], object], repeat: int, *, warmup: int = 3, inner: int = 1) -> Timing:
    """Median of `repeat` timed calls of `fn`, after `warmup` untimed ones (the same for every
    library: the first few calls that allocate big fresh arrays pay page faults until the
    kernel's transparent huge pages settle, for all of them alike).

    With `inner` > 1, each sample is the mean of `inner` back-to-back calls (and the warm-up
    `warmup` such batches): calls of a few microseconds are timed in batches, as the clock and
    the timing loop would blur one call.

    The garbage collector is paused while timing so that a collection triggered by one sample
    (torch graphs, jax pytrees) does not land in another; results are dropped between calls.
    """
    if repeat < 1:
        raise ValueError(f"repeat must be at least 1, got {repeat}")
    if inner < 1:
        raise ValueError(f"inner must be at least 1, got {inner}")
    for _ in range(warmup * inner):
        fn()
    gc.collect()
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        samples = []
        for _ in range(repeat):
            start = time.perf_counter()
            for _ in range(inner):
                fn()
            samples.append((time.perf_counter() - start) * 1e3 / inner)
    finally:
        if gc_was_enabled:
            gc.enable()
    return Timing(statistics.median(samples), min(samples), tuple(samples))


@dataclass(frozen=True, slots=True)
class Timings:
    """One library's timings on one case. `first_call_s` holds the seconds of the first forward
    and backward calls; `variant` names a setting the timings depend on (torch's allocator).
    `backward` is None for a case measured forward only."""

    forward: Timing
    backward: Timing | None
    first_call_s: dict[str, float]
    variant: str = ""

    @staticmethod
    def from_dict(d: dict) -> Timings:
        """Inverse of `dataclasses.asdict`, for timings sent as JSON."""
        forward, backward = (None if d[k] is None else
                             Timing(**{**d[k], "samples_ms": tuple(d[k]["samples_ms"])})
                             for k in ("forward", "backward"))
        return Timings(forward, backward, d["first_call_s"], d["variant"])


@dataclass(frozen=True, slots=True)
class Measurement:
    """One library's run of one case: its timings and the values it computed, for checking
    (no gradients for a case measured forward only)."""

    timings: Timings
    output: np.ndarray
    gradients: tuple[np.ndarray, ...]
