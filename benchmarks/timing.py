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


PAUSE_S = 0.005  # between turns: torch's OpenMP threads and XLA's spin for a while after a call


def measure(fn: Callable[[], object], repeat: int, *, warmup: int = 3, inner: int = 1) -> Timing:
    """Median of `repeat` timed calls of `fn`, after `warmup` untimed ones (the same for every
    library: the first few calls that allocate big fresh arrays pay page faults until the
    kernel's transparent huge pages settle, for all of them alike). `measure_turns` with one
    call; an exception it raises propagates."""
    timings, errors = measure_turns({"": fn}, repeat, warmup=warmup, inner=inner)
    if errors:
        raise errors[""]
    return timings[""]


def measure_turns(calls: dict[str, Callable[[], object]], repeat: int, *, warmup: int = 3,
                  inner: int = 1) -> tuple[dict[str, Timing], dict[str, Exception]]:
    """({name: median of `repeat` timed samples of calls[name]}, {name: the exception it raised}),
    the calls taking turns: each round times one sample of every call, in an order that rotates
    from round to round. This machine's speed drifts by 20-50% over minutes, so libraries timed
    one after another (7 samples each) got ratios that moved by up to 1.6x between runs of the
    same code; in turns, the drift falls on every library alike. Where several calls take turns,
    each timed sample follows a pause (`PAUSE_S`) and one untimed sample of the same call, so
    that it finds the caches, the allocator and the threads as a repeated call of its own does,
    not as another library left them.

    With `inner` > 1, each sample is the mean of `inner` back-to-back calls (and the warm-up
    `warmup` such batches): calls of a few microseconds are timed in batches, as the clock and
    the timing loop would blur one call.

    The garbage collector is paused while timing so that a collection triggered by one sample
    (torch graphs, jax pytrees) does not land in another; results are dropped between calls.
    A call that raises leaves the turns.
    """
    if repeat < 1:
        raise ValueError(f"repeat must be at least 1, got {repeat}")
    if inner < 1:
        raise ValueError(f"inner must be at least 1, got {inner}")

    def sample(name: str) -> float:
        start = time.perf_counter()
        for _ in range(inner):
            calls[name]()
        return (time.perf_counter() - start) * 1e3 / inner

    errors: dict[str, Exception] = {}
    samples: dict[str, list[float]] = {name: [] for name in calls}
    for name in calls:
        try:
            for _ in range(warmup):
                sample(name)
        except Exception as error:  # noqa: BLE001 - the caller reports it, per call
            errors[name] = error
    gc.collect()
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        for round_ in range(repeat):
            live = [name for name in calls if name not in errors]
            first = round_ % max(len(live), 1)
            for name in live[first:] + live[:first]:
                try:
                    if len(calls) > 1:
                        time.sleep(PAUSE_S)
                        sample(name)
                    samples[name].append(sample(name))
                except Exception as error:  # noqa: BLE001
                    errors[name] = error
    finally:
        if gc_was_enabled:
            gc.enable()
    return {name: Timing(statistics.median(s), min(s), tuple(s)) for name, s in samples.items()
            if name not in errors}, errors


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
class Prepared:
    """One library's case after its first calls: the passes to time (no `backward` for a case
    measured forward only), the first calls' seconds, and the values they computed."""

    forward: Callable[[], object]
    backward: Callable[[], object] | None
    first_call_s: dict[str, float]
    output: np.ndarray
    gradients: tuple[np.ndarray, ...]
    variant: str = ""


@dataclass(frozen=True, slots=True)
class Measurement:
    """One library's run of one case: its timings and the values it computed, for checking
    (no gradients for a case measured forward only)."""

    timings: Timings
    output: np.ndarray
    gradients: tuple[np.ndarray, ...]


def measure_prepared(prepared: dict[str, Prepared], repeat: int) \
        -> tuple[dict[str, Measurement], dict[str, Exception]]:
    """Each library's forward timed in turns with the others' (`measure_turns`), then each one's
    backward; ({library: its measurement}, {library: the exception it raised})."""
    forward, errors = measure_turns({name: p.forward for name, p in prepared.items()}, repeat)
    backward, more = measure_turns({name: p.backward for name, p in prepared.items()
                                    if p.backward is not None and name not in errors}, repeat) \
        if any(p.backward is not None for p in prepared.values()) else ({}, {})
    errors |= more
    return {name: Measurement(Timings(forward[name], backward.get(name), p.first_call_s, p.variant),
                              p.output, p.gradients)
            for name, p in prepared.items() if name not in errors}, errors
