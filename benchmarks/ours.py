"""halide_ad, measured through its public API exactly as a user calls it.

The forward is `f(*inputs)`; the backward is `vjp_fn(ct)` after `out, vjp_fn = hd.vjp(f, *inputs)`.
The first calls are reported separately: `forward` (trace, compile and run the forward program)
and `backward` (`hd.vjp`, which compiles the forward-with-residuals and runs it, plus the first
`vjp_fn(ct)`, which compiles the gradient kernels). With a warm on-disk kernel cache, a second
process shows what a returning user pays.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

import halide_ad as hd
from halide_ad import tiered
from benchmarks.timing import Prepared, time_once


def prepare_halide_ad(
    fn: Callable[..., Any], inputs: Sequence[np.ndarray], ct: np.ndarray, *, backward: bool = True,
) -> Prepared:
    """`fn`'s first calls, timed as the module says, and its forward and (unless `backward` is
    False) backward to time. Each pass's kernels are compiled before it is timed
    (`tiered.settle`): a program's first calls run on the interpreter while they compile."""
    out, first_forward = time_once(lambda: fn(*inputs))
    tiered.settle()
    forward = lambda: fn(*inputs)  # noqa: E731
    if not backward:
        return Prepared(forward, None, {"forward": first_forward}, np.asarray(out), ())
    (_, vjp_fn), first_vjp = time_once(lambda: hd.vjp(fn, *inputs))
    grads, first_apply = time_once(lambda: vjp_fn(ct))
    tiered.settle()
    return Prepared(forward, lambda: vjp_fn(ct), {"forward": first_forward, "backward": first_vjp + first_apply},
                    np.asarray(out), tuple(grads))
