"""Argument checks shared by the operators: each raises a `ShapeError` or `TraceError` that names
the operator, the argument and what it expected, at the user's line."""
from __future__ import annotations

import numbers

from halide_ad.errors import ShapeError, TraceError, user_loc
from halide_ad.tensor import BoundaryView, Tensor


def tensor(op: str, name: str, x, *, ndim: int | tuple[int, ...] | None = None,
           float_only: bool = True) -> Tensor:
    """`x` as a Tensor, or a clear error: ops take traced tensors, not numpy arrays or numbers."""
    if isinstance(x, BoundaryView):
        x = x.tensor
    if not isinstance(x, Tensor):
        raise TraceError(f"ops.{op}: {name} must be an hd.Tensor (an argument of the traced function "
                         f"or the result of another op), got {type(x).__name__}", user_loc())
    if float_only and x.dtype.kind != "f":
        raise TraceError(f"ops.{op}: {name} must be a float32 or float64 tensor, got {x.dtype}", user_loc())
    if ndim is not None:
        allowed = (ndim,) if isinstance(ndim, int) else ndim
        if x.ndim not in allowed:
            want = " or ".join(f"{n}-d" for n in allowed)
            raise ShapeError(f"ops.{op}: {name} must be {want}, got shape {x.shape}", user_loc())
    return x


def int_tensor(op: str, name: str, x) -> Tensor:
    x = tensor(op, name, x, float_only=False)
    if x.dtype.kind not in "iu":
        raise TraceError(f"ops.{op}: {name} must be an integer tensor (class indices), got {x.dtype}",
                         user_loc())
    return x


def is_int(v) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def ints(op: str, name: str, value, n: int, *, minimum: int = 1) -> tuple[int, ...]:
    """An int or a sequence of `n` ints, each at least `minimum`, as an n-tuple."""
    vals = (value,) * n if is_int(value) else tuple(value) if isinstance(value, (tuple, list)) else None
    if vals is None or len(vals) != n or not all(is_int(v) for v in vals):
        raise ShapeError(f"ops.{op}: {name} must be an int or a sequence of {n} ints, got {value!r}",
                         user_loc())
    if any(v < minimum for v in vals):
        raise ShapeError(f"ops.{op}: {name}={value!r}; every entry must be at least {minimum}", user_loc())
    return tuple(int(v) for v in vals)


def axis(op: str, value, ndim: int, name: str = "axis") -> int:
    """A single axis in [-ndim, ndim), normalised to [0, ndim)."""
    if not is_int(value) or not -ndim <= value < ndim:
        raise ShapeError(f"ops.{op}: {name}={value!r} is not an axis of a {ndim}-d tensor "
                         f"(valid: {-ndim}..{ndim - 1})", user_loc())
    return int(value) % ndim


def axes(op: str, value, ndim: int) -> tuple[int, ...]:
    """None (every axis), one axis or a sequence of distinct axes, sorted and normalised."""
    if value is None:
        return tuple(range(ndim))
    vals = (value,) if is_int(value) else tuple(value) if isinstance(value, (tuple, list)) else None
    if vals is None:
        raise ShapeError(f"ops.{op}: axis must be None, an int or a sequence of ints, got {value!r}",
                         user_loc())
    out = [axis(op, v, ndim) for v in vals]
    if len(set(out)) != len(out):
        raise ShapeError(f"ops.{op}: axis={value!r} repeats an axis", user_loc())
    return tuple(sorted(out))


def choice(op: str, name: str, value, options: tuple[str, ...]) -> str:
    if value not in options:
        raise TraceError(f"ops.{op}: {name}={value!r}; expected one of {', '.join(map(repr, options))}",
                         user_loc())
    return value


def positive_output(op: str, shape: tuple[int, ...], detail: str) -> tuple[int, ...]:
    if any(n <= 0 for n in shape):
        raise ShapeError(f"ops.{op}: the output would have shape {shape}, with an empty dimension; "
                         f"{detail}", user_loc())
    return shape
