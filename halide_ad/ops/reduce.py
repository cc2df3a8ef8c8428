"""Reductions over axes: numpy's sum, mean, max, min and prod, with `axis` and `keepdims`.

x: any shape; axis None (all), an int or a tuple -> x's shape without those axes (or with them
as size 1 when keepdims). max and min send the gradient to the first extremal element.
"""
from __future__ import annotations

import math

import halide_ad as hd
from halide_ad.ops import _checks as check
from halide_ad.ops._fuse import reduce_axes


def _reduce(op: str, x, axis, keepdims: bool):
    x = check.tensor(op, "x", x)
    axes = check.axes(op, axis, x.ndim)
    scale = 1.0 / math.prod(x.shape[a] for a in axes) if op == "mean" else None
    return reduce_axes("sum" if op == "mean" else op, lambda i: x[i], x.shape, axes, keepdims=keepdims,
                       scale=scale, name=op)


@hd.func
def sum(x, axis=None, keepdims=False):
    """The sum over `axis` (None: every axis)."""
    return _reduce("sum", x, axis, keepdims)


@hd.func
def mean(x, axis=None, keepdims=False):
    """The mean over `axis` (None: every axis)."""
    return _reduce("mean", x, axis, keepdims)


@hd.func
def max(x, axis=None, keepdims=False):
    """The maximum over `axis`; the gradient goes to the first maximal element."""
    return _reduce("max", x, axis, keepdims)


@hd.func
def min(x, axis=None, keepdims=False):
    """The minimum over `axis`; the gradient goes to the first minimal element."""
    return _reduce("min", x, axis, keepdims)


@hd.func
def prod(x, axis=None, keepdims=False):
    """The product over `axis`; its gradient is the product of the other elements (no division,
    so zeros are fine)."""
    return _reduce("prod", x, axis, keepdims)
