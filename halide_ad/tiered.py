"""Tiered execution: a program's first calls run on the numpy interpreter while numba compiles
its kernels on a background thread; calls switch to the kernels once they are built.

numba takes 1-15 s to compile a layer's kernels (its gradient's boundary-split gathers most of
that), which a user meets on every new program and every new shape. The interpreter starts at
once: `runtime/vectorized.py` runs Funcs and scatters at numpy's speed (a convolution's sums on
BLAS, a window's taps as strided views; a separable window as two passes, one axis at a time:
`runtime/vectorized_separable.py`), `runtime/reference.py` (the executable spec the kernels
are tested against) runs updates. The first forward and backward of a small conv-relu-pool layer
took 16.8 s and now take well under one.

What runs on the interpreter tier:
* only programs whose every read is proved in range at trace time (the interpreter clips a
  data-dependent index where the kernels raise BoundsError), and whose work per pass, in
  element operations as `runtime/vectorized_cost.py` estimates them from the interpreter's
  plans, is at most HALIDE_AD_INTERPRET_MAX (default 2**30, about a second of numpy: beyond
  it, compiling that pass's kernels first costs less). A plain call counts the gradient by
  every float argument too, so a forward and its gradient take the same tier: the
  interpreter's when neither pass is over the cap;
* only while a kernel is neither compiled in this process nor in the on-disk cache: once a
  background compile finishes, it says so on disk (`mark_built`), and a later process builds
  that pass from the disk and runs compiled from its first call (`built_before`);
* the forward and backward of one call on the same tier: a gradient never mixes the
  interpreter's forward buffers with a kernel's.

The two tiers agree to rounding, not bit for bit: the interpreter sums float32 in numpy's and
BLAS's order and precision where the kernels accumulate long sums in float64, and calls numpy's exp and tanh
where float32 kernels call `runtime/vmath.py`'s (within 3 ulp). tests/api/test_tiers.py holds
them to 1e-5 relative in float32 and 1e-12 in float64. HALIDE_AD_TIERED=0 turns the
interpreter tier off: every call waits for its kernels, as a run that must repeat bits from its
first call needs.

Compiles wait while the interpreter runs a user's first calls (`_when_quiet`), which then run
alone. The interpreter leaves the caller's arrays alone, and a compile runs its kernels on
zeros of their shapes (`api.Traced._stand_ins`): a copy of a (16, 64, 128, 128) batch cost a
first call ~0.1 s a pass.

The background thread is not a daemon: a process finishes the compiles it started before it
exits, so that the next process finds the kernels on disk.
"""
from __future__ import annotations

import math
import os
import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from halide_ad import config, disk_cache
from halide_ad.ad import reverse_mode
from halide_ad.ir import Load, Program
from halide_ad.runtime import buffers as memory, reference, vectorized_cost, vectorized_separable
from halide_ad.solver.bounds import checked_at_run_time
from halide_ad.traverse import walk

INTERPRETED = "\0interpreted"  # a key of the interpreter's buffers (later, the kernels' buffers: api.Traced)


def interpretable(program: Program, wrt: tuple[str, ...] = ()) -> bool:
    """Whether the interpreter may run this program (and its gradient by `wrt`) on a first call."""
    if not config.tiered_enabled():
        return False
    for f in program.funcs:
        if any(isinstance(n, Load) and any(map(checked_at_run_time, n.index)) for n in walk(f.body)):
            return False
    return max(vectorized_cost.passes(program, reverse_mode(program, wrt) if wrt else [])) <= config.interpret_max()


def built_before(program: Program, key) -> bool:
    """Whether a process built the kernels of `program`'s pass `key` (FORWARD, CALL or a
    gradient's wrt) into the on-disk cache before (`mark_built`): then a first call builds them
    at once, from the disk (its generated code, solver results and numba's machine code), instead
    of running on the interpreter while a background thread does the same. A bilinear upsample's
    first forward and backward in a second process took 0.55 and 0.54 s on the interpreter."""
    return disk_cache.load(_built_key(program, key)) is not None


def mark_built(program: Program, key) -> None:
    disk_cache.store(_built_key(program, key), True)


def _built_key(program: Program, key) -> tuple:
    return ("kernels built", program, key, config.compile_settings())


def forward(program: Program, inputs: dict[str, np.ndarray], keep: set[str] | None = None) -> dict[str, np.ndarray]:
    """The inputs and the Funcs' buffers (argindex buffers included) computed by numpy: those in
    `keep` if given (the others let go as soon as no later Func reads them), else every one."""
    memory.keep_freed_memory()
    return dict(inputs) | reference.evaluate(program, inputs, func=vectorized_separable.func, keep=keep) \
        | {INTERPRETED: True}


def backward(program: Program, wrt: tuple[str, ...], buffers: dict[str, np.ndarray],
             cotangents: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """{name: gradient} for `wrt`, from `forward`'s buffers, by running reverse mode's scatters."""
    memory.keep_freed_memory()
    return reference.scatter_adjoints(program, reverse_mode(program, wrt), wrt, buffers, cotangents,
                                      scatters=vectorized_separable.scatters, zeros=memory.pool.zeros)


SWITCH_S = 2e-4  # the GIL's switch interval while the interpreter runs (Python's default: 5 ms)
_switch_lock = threading.Lock()
_quiet = threading.Condition(_switch_lock)
_switch_users = 0  # interpreter calls running now
_switch_before = 0.0
_interpreted_until = 0.0  # when the last interpreter call ended (or, while one runs, the future)
_hugepages_before = True  # numpy's setting, while interpreter calls run


def _set_hugepages(enabled: bool) -> bool:
    """Whether numpy advises the OS to back its big arrays by huge pages (`madvise`), set to
    `enabled`; returns the setting before. Where the kernel compacts memory for such a page on
    the spot (THP `defrag` = madvise, a common default), the first touch of a fresh array cost
    4x the system time: the nearest upsample's first forward and backward on the interpreter
    took 1.0-1.3 s in the kernel with it, 0.3 s without (3.4 s in all against 1.5 s, load 11).
    A first call's arrays are touched once; a training loop's come from the buffer pool."""
    flip = getattr(getattr(np, "_core", None) or np.core, "multiarray")._set_madvise_hugepage
    return bool(flip(enabled))


class interpreting:
    """Around a call that may run the interpreter (from the choice of tier, the stand-ins for
    its compile and the interpreter's run): compiles wait for it (`_when_quiet`), and the GIL's
    switch interval is short. The interpreter calls numpy hundreds of times a pass, each giving
    up the GIL, which a compiling thread then holds for up to the interval: 5 ms a call, seconds
    a pass. And numpy does not ask the OS for huge pages for the arrays made meanwhile
    (`_set_hugepages`). The last such call out restores both."""

    def __enter__(self) -> None:
        global _switch_users, _switch_before, _interpreted_until, _hugepages_before
        with _switch_lock:
            if _switch_users == 0:
                _switch_before = sys.getswitchinterval()
                sys.setswitchinterval(min(SWITCH_S, _switch_before))
                _hugepages_before = _set_hugepages(False)
            _switch_users += 1
            _interpreted_until = math.inf

    def __exit__(self, *exc) -> None:
        global _switch_users, _interpreted_until
        with _switch_lock:
            _switch_users -= 1
            if _switch_users == 0:
                sys.setswitchinterval(_switch_before)
                _set_hugepages(_hugepages_before)
                _interpreted_until = time.monotonic()
                _quiet.notify_all()


_executor: ThreadPoolExecutor | None = None
_executor_lock = threading.Lock()


def in_background(job) -> Future:
    """Run `job()` on the one compiling thread (numba compiles one function at a time anyway),
    once the interpreter is quiet (`_when_quiet`)."""
    global _executor, _interpreted_until
    asked = time.monotonic()
    with _switch_lock:  # (the interpreter call that asks for it starts right after)
        _interpreted_until = max(_interpreted_until, asked)
    with _executor_lock:
        if _executor is None:
            _executor = ThreadPoolExecutor(1, thread_name_prefix="halide_ad-compile")
        return _executor.submit(lambda: _when_quiet(asked) or job())


QUIET_S = 0.5  # a compile starts once no interpreter call has run for this long, once a pass
# runs on the interpreter again (a loop of calls: it gets its kernels one call in), or at the
# latest DEFER_MAX_S after it was asked for. A first forward and backward may take seconds on a
# busy machine: with 5 s, the pipeline's compile started during its first backward (load 13,
# 8.4 s in all, 3.4 s without it). Until a program runs again, its kernels are not needed.
DEFER_MAX_S = 30.0
_repeated_at = -math.inf  # when a pass last ran on the interpreter a second time


def repeated() -> None:
    """A pass ran on the interpreter again: the compiles asked for so far start now (`_when_quiet`).
    Left to wait out DEFER_MAX_S instead, a loop ran on the interpreter until then (conv2d's
    backward: 85 ms a call on the interpreter against 9.5 ms compiled)."""
    global _repeated_at
    with _switch_lock:
        _repeated_at = time.monotonic()
        _quiet.notify_all()


def _when_quiet(asked: float) -> None:
    """Wait until no interpreter call has run for QUIET_S, until a pass runs on the interpreter a
    second time (`repeated`), at most until DEFER_MAX_S after `asked`. A compile holds the GIL
    for most of its seconds and a core of two: run beside the interpreter, it slowed a first
    forward and backward that take 1 s of CPU time to 18 s (a nearest upsample of (16, 64, 128,
    128), load 14; 3.4 s without it), and 0.97 s to 4.2 s at load 8 (at 6b8a424). A user's first
    calls, one after another, then run alone."""
    with _switch_lock:
        while True:
            now = time.monotonic()
            wait = min(asked + DEFER_MAX_S, _interpreted_until + QUIET_S) - now
            if wait <= 0 or _repeated_at >= asked or (_switch_users == 0 and now - _interpreted_until >= QUIET_S):
                return
            _quiet.wait(wait)


def settle() -> None:
    """Wait for every compile started so far: calls from now on run kernels (benchmarks time
    the steady state after this)."""
    if _executor is not None:
        in_background(lambda: None).result()


def _forget_executor() -> None:
    global _executor
    _executor = None


if hasattr(os, "register_at_fork"):  # a forked child has no compiling thread
    os.register_at_fork(after_in_child=_forget_executor)


__all__ = ["INTERPRETED", "backward", "forward", "in_background", "interpretable", "interpreting", "repeated", "settle"]
