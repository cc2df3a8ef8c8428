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


def measure(fn: Callable[[], object], repeat: int, *, warmup: int = 3) -> Timing:
    """Median of `repeat` timed calls of `fn`, after `warmup` untimed ones (the same for every
    library: the first few calls that allocate big fresh arrays pay page faults until the
    kernel's transparent huge pages settle, for all of them alike).

    The garbage collector is paused while timing so that a collection triggered by one sample
    (torch graphs, jax pytrees) does not land in another; results are dropped between calls.
    """
    if repeat < 1:
        raise ValueError(f"repeat must be at least 1, got {repeat}")
    for _ in range(warmup):
        fn()
    gc.collect()
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        samples = []
        for _ in range(repeat):
            start = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - start) * 1e3)
    finally:
        if gc_was_enabled:
            gc.enable()
    return Timing(statistics.median(samples), min(samples), tuple(samples))


@dataclass(frozen=True, slots=True)
class Timings:
    """One library's timings on one case. `first_call_s` holds the seconds of the first forward
    and backward calls, where the library compiles on first call; `variant` names a setting the
    timings depend on (torch's allocator)."""

    forward: Timing
    backward: Timing
    first_call_s: dict[str, float]
    variant: str = ""

    @staticmethod
    def from_dict(d: dict) -> Timings:
        """Inverse of `dataclasses.asdict`, for timings sent as JSON."""
        forward, backward = (Timing(**{**d[k], "samples_ms": tuple(d[k]["samples_ms"])})
                             for k in ("forward", "backward"))
        return Timings(forward, backward, d["first_call_s"], d["variant"])


@dataclass(frozen=True, slots=True)
class Measurement:
    """One library's run of one case: its timings and the values it computed, for checking."""

    timings: Timings
    output: np.ndarray
    gradients: tuple[np.ndarray, ...]
