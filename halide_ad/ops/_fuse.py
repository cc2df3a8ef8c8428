"""Reductions with the elementwise work fused in: one Func (one loop nest) per reduction.

`reduce_axes("sum", lambda i: x[i] * x[i], x.shape, (1,))` is `sum(x * x, axis=1, keepdims=True)`
without a separate Func for `x * x`; every Func is a loop nest to compile and a pass over
memory, in the forward and the gradient.
"""
from __future__ import annotations

import halide_ad as hd
from halide_ad.tensor import Tensor


def reduce_axes(op: str, fn, shape: tuple[int, ...], axes: tuple[int, ...], *, keepdims: bool = True,
                scale: float | None = None, name: str) -> Tensor:
    """out[i] = op over `axes` of fn(full index) (times `scale`), reduced axes kept as size 1."""
    kept = [d for d in range(len(shape)) if d not in axes]
    out_shape = tuple(1 if d in axes else n for d, n in enumerate(shape)) if keepdims else \
        tuple(shape[d] for d in kept)
    if not axes:
        return hd.compute(out_shape, lambda *i: fn(i) if scale is None else fn(i) * scale, name=name)
    r = hd.rdom(*(shape[a] for a in axes))
    r = r if isinstance(r, tuple) else (r,)

    def body(*i):
        full = list(i) if keepdims else [None] * len(shape)
        if not keepdims:
            for d, v in zip(kept, i, strict=True):
                full[d] = v
        for a, v in zip(axes, r, strict=True):
            full[a] = v
        value = fn(tuple(full))
        return getattr(hd, op)(value if scale is None else value * scale)
    return hd.compute(out_shape, body, name=name)


def at_kept(i: tuple, axes: tuple[int, ...]) -> tuple:
    """The index of a keepdims reduction's element for the full index i (reduced axes read 0)."""
    return tuple(0 if d in axes else v for d, v in enumerate(i))
