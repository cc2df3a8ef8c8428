"""Shape and indexing operators. Each output element reads one input element at an index that is
affine in the output's (or uses // and % for reshapes), so every gradient is a gather; `take`
reads at data-dependent indices, and its gradient is a scatter."""
from __future__ import annotations

import itertools
import math
import numbers

import numpy as np

import halide_ad as hd
from halide_ad.errors import ShapeError, TraceError, user_loc
from halide_ad.ops import _checks as check
from halide_ad.tensor import Tensor


@hd.func
def reshape(x, shape):
    """x with a new shape of the same size; one entry may be -1 (inferred). Row-major order."""
    x = check.tensor("reshape", "x", x, float_only=False)
    shape = (shape,) if check.is_int(shape) else shape
    if not isinstance(shape, (tuple, list)) or not all(check.is_int(n) for n in shape):
        raise ShapeError(f"ops.reshape: shape must be an int or a sequence of ints, got {shape!r}", user_loc())
    if tuple(shape) == x.shape:
        return x
    return x.reshape(tuple(shape))


@hd.func
def flatten(x, start_axis=0, end_axis=-1):
    """Axes start_axis..end_axis (inclusive) merged into one, as torch.flatten.

    x: (d0, ..., dn) -> (d0, ..., d[start] * ... * d[end], ..., dn).
    """
    x = check.tensor("flatten", "x", x, float_only=False)
    if x.ndim == 0:
        return x.reshape((1,))
    a = check.axis("flatten", start_axis, x.ndim, "start_axis")
    b = check.axis("flatten", end_axis, x.ndim, "end_axis")
    if a > b:
        raise ShapeError(f"ops.flatten: start_axis={start_axis} comes after end_axis={end_axis}", user_loc())
    shape = x.shape[:a] + (math.prod(x.shape[a:b + 1]),) + x.shape[b + 1:]
    return x if shape == x.shape else x.reshape(shape)


@hd.func
def transpose(x, axes=None):
    """x with its axes permuted: out.shape[d] == x.shape[axes[d]]; None reverses them."""
    x = check.tensor("transpose", "x", x, float_only=False)
    if axes is not None:
        if not isinstance(axes, (tuple, list)) or len(axes) != x.ndim:
            raise ShapeError(f"ops.transpose: axes must list all {x.ndim} axes of x (shape {x.shape}), "
                             f"got {axes!r}", user_loc())
        axes = tuple(check.axis("transpose", a, x.ndim) for a in axes)
    return x.transpose(axes) if axes is not None else x.transpose()


def _remap(x: Tensor, shape: tuple[int, ...], source_axes: list[int | None], name: str) -> Tensor:
    """out[i] = x[...] where out axis d feeds x axis source_axes[d]; x's other axes read 0."""
    def body(*i):
        index = [0] * x.ndim
        for d, a in enumerate(source_axes):
            if a is not None:
                index[a] = i[d]
        return x[tuple(index)]
    return hd.compute(shape, body, name=name)


@hd.func
def squeeze(x, axis=None):
    """x without its size-1 axes (only those in `axis`, if given). Squeezing every axis of a
    (1, ..., 1) tensor gives shape (1,): halide_ad tensors have at least one element per axis."""
    x = check.tensor("squeeze", "x", x, float_only=False)
    if axis is None:
        drop = [a for a in range(x.ndim) if x.shape[a] == 1]
    else:
        drop = list(check.axes("squeeze", axis, x.ndim))
        for a in drop:
            if x.shape[a] != 1:
                raise ShapeError(f"ops.squeeze: axis {a} of x (shape {x.shape}) has size {x.shape[a]}, "
                                 "not 1", user_loc())
    keep = [a for a in range(x.ndim) if a not in drop]
    if not drop:
        return x
    if not keep:
        return x.reshape((1,)) if x.ndim != 1 else x
    return _remap(x, tuple(x.shape[a] for a in keep), keep, "squeeze")


@hd.func
def expand_dims(x, axis, num_newaxis=1):
    """x with `num_newaxis` size-1 axes inserted at `axis` (in [-ndim-1, ndim])."""
    x = check.tensor("expand_dims", "x", x, float_only=False)
    a = check.axis("expand_dims", axis, x.ndim + 1)
    if not check.is_int(num_newaxis) or num_newaxis < 0:
        raise ShapeError(f"ops.expand_dims: num_newaxis must be a non-negative int, got {num_newaxis!r}",
                         user_loc())
    if num_newaxis == 0:
        return x
    shape = x.shape[:a] + (1,) * num_newaxis + x.shape[a:]
    source = list(range(a)) + [None] * num_newaxis + list(range(a, x.ndim))
    return _remap(x, shape, source, "expand_dims")


@hd.func
def broadcast_to(x, shape):
    """x broadcast to `shape` with numpy's rules (the gradient sums over broadcast axes)."""
    x = check.tensor("broadcast_to", "x", x, float_only=False)
    shape = tuple(shape) if isinstance(shape, (tuple, list)) else (shape,)
    if not all(check.is_int(n) and n > 0 for n in shape):
        raise ShapeError(f"ops.broadcast_to: shape must hold positive ints, got {shape!r}", user_loc())
    try:
        ok = np.broadcast_shapes(x.shape, shape) == shape
    except ValueError:
        ok = False
    if not ok:
        raise ShapeError(f"ops.broadcast_to: cannot broadcast shape {x.shape} to {shape}", user_loc())
    offset = len(shape) - x.ndim
    return hd.compute(shape, lambda *i: x[tuple(0 if n == 1 else i[offset + d]
                                                for d, n in enumerate(x.shape))], name="broadcast_to")


@hd.func
def concatenate(tensors, axis=0):
    """The tensors joined along `axis`; every other axis must agree.

    tensors: a list or tuple of tensors (d0, .., n_k, .., dn) -> (d0, .., sum n_k, .., dn).
    """
    if not isinstance(tensors, (tuple, list)) or not tensors:
        raise TraceError(f"ops.concatenate: tensors must be a non-empty list or tuple of hd.Tensors, got "
                         f"{type(tensors).__name__}", user_loc())
    ts = [check.tensor("concatenate", f"tensors[{k}]", t, float_only=False) for k, t in enumerate(tensors)]
    a = check.axis("concatenate", axis, ts[0].ndim)
    for k, t in enumerate(ts):
        if t.ndim != ts[0].ndim or t.shape[:a] + t.shape[a + 1:] != ts[0].shape[:a] + ts[0].shape[a + 1:]:
            raise ShapeError(f"ops.concatenate: tensors[{k}] has shape {t.shape}, which does not match "
                             f"tensors[0]'s {ts[0].shape} outside axis {a}", user_loc())
    if len(ts) == 1:
        return ts[0]
    offsets = list(np.cumsum([0] + [t.shape[a] for t in ts]))
    shape = ts[0].shape[:a] + (int(offsets[-1]),) + ts[0].shape[a + 1:]

    def body(*i):
        def read(k):
            return ts[k][i[:a] + (i[a] - int(offsets[k]),) + i[a + 1:]]
        value = read(len(ts) - 1)
        for k in reversed(range(len(ts) - 1)):
            value = hd.where(i[a] < int(offsets[k + 1]), read(k), value)
        return value
    return hd.compute(shape, body, name="concatenate")


@hd.func
def split(x, indices_or_sections, axis=0):
    """x cut along `axis` into a tuple of tensors, as numpy.split: an int n gives n equal parts,
    a sorted sequence of indices gives the parts between them."""
    x = check.tensor("split", "x", x, float_only=False)
    a = check.axis("split", axis, x.ndim)
    n = x.shape[a]
    if check.is_int(indices_or_sections):
        k = indices_or_sections
        if k <= 0 or n % k:
            raise ShapeError(f"ops.split: axis {a} of x (size {n}) cannot be split into {k} equal parts",
                             user_loc())
        cuts = [n // k * m for m in range(1, k)]
    elif isinstance(indices_or_sections, (tuple, list)) and all(check.is_int(c) for c in indices_or_sections):
        cuts = list(indices_or_sections)
        if any(not 0 < c < n for c in cuts) or sorted(set(cuts)) != cuts:
            raise ShapeError(f"ops.split: the indices {cuts} must be increasing and inside (0, {n}) so "
                             "that no part is empty", user_loc())
    else:
        raise ShapeError(f"ops.split: indices_or_sections must be an int or a sequence of ints, got "
                         f"{indices_or_sections!r}", user_loc())
    bounds = [0] + cuts + [n]
    return tuple(x[(slice(None),) * a + (slice(lo, hi),)] for lo, hi in itertools.pairwise(bounds))


_PAD_VIEWS = {"constant": hd.constant_exterior, "edge": hd.repeat_edge, "reflect": hd.mirror}


@hd.func
def pad(x, pad_width, mode="constant", value=0.0):
    """x padded as numpy.pad: pad_width is an int, a (before, after) pair, or one pair per axis;
    mode is 'constant' (with `value`), 'edge' or 'reflect'. The padding is a boundary view read
    in the index expression, not a padded copy, so the gradient stays a gather."""
    x = check.tensor("pad", "x", x, float_only=False)
    check.choice("pad", "mode", mode, tuple(_PAD_VIEWS))
    widths = _pad_widths(pad_width, x.ndim)
    if mode == "reflect":
        for d, (lo, hi) in enumerate(widths):
            if (lo or hi) and x.shape[d] == 1:
                raise ShapeError(f"ops.pad: mode='reflect' needs at least 2 elements along padded axis {d} "
                                 f"(x has shape {x.shape})", user_loc())
    if not isinstance(value, numbers.Real):
        raise TraceError(f"ops.pad: value must be a number, got {value!r}", user_loc())
    if all(lo == 0 and hi == 0 for lo, hi in widths):
        return x
    view = hd.constant_exterior(x, value) if mode == "constant" else _PAD_VIEWS[mode](x)
    shape = tuple(n + lo + hi for n, (lo, hi) in zip(x.shape, widths, strict=True))
    return hd.compute(shape, lambda *i: view[tuple(v - lo for v, (lo, _) in zip(i, widths, strict=True))],
                      name="pad")


def _pad_widths(pad_width, ndim: int) -> list[tuple[int, int]]:
    def bad():
        return ShapeError(f"ops.pad: pad_width must be an int, a (before, after) pair or {ndim} such pairs "
                          f"of non-negative ints, got {pad_width!r}", user_loc())
    pw = pad_width
    if check.is_int(pw):
        pw = [(pw, pw)] * ndim
    elif isinstance(pw, (tuple, list)) and len(pw) == 2 and all(check.is_int(v) for v in pw):
        pw = [tuple(pw)] * ndim
    elif isinstance(pw, (tuple, list)) and len(pw) == ndim:
        pw = [tuple(p) if isinstance(p, (tuple, list)) else (p, p) for p in pw]
    else:
        raise bad()
    if not all(len(p) == 2 and all(check.is_int(v) and v >= 0 for v in p) for p in pw):
        raise bad()
    return [(int(lo), int(hi)) for lo, hi in pw]


@hd.func
def strided_slice(x, begin, end, strides=None, axes=None):
    """x[begin:end:strides] along `axes` (default: the first len(begin) axes), with Python's
    slice rules (negative indices count from the end, out-of-range bounds clip, negative strides
    walk backwards). Relay's strided_slice."""
    x = check.tensor("strided_slice", "x", x, float_only=False)
    seqs = {"begin": begin, "end": end, "strides": strides}
    for name, s in seqs.items():
        if s is not None and not (isinstance(s, (tuple, list)) and all(v is None or check.is_int(v) for v in s)):
            raise ShapeError(f"ops.strided_slice: {name} must be a sequence of ints, got {s!r}", user_loc())
    n = len(begin)
    strides = [1] * n if strides is None else list(strides)
    axes = list(range(n)) if axes is None else [check.axis("strided_slice", a, x.ndim) for a in axes]
    if not len(end) == len(strides) == len(axes) == n or len(set(axes)) != n:
        raise ShapeError(f"ops.strided_slice: begin, end, strides and axes need one entry per sliced axis, "
                         f"got {begin!r}, {end!r}, {strides!r}, {axes!r}", user_loc())
    if any(s == 0 for s in strides):
        raise ShapeError(f"ops.strided_slice: strides={strides!r}; a stride cannot be 0", user_loc())
    index = [slice(None)] * x.ndim
    for a, b, e, s in zip(axes, begin, end, strides, strict=True):
        index[a] = slice(b, e, s)
    return x[tuple(index)]


@hd.func
def take(x, indices, axis=None, mode="raise"):
    """Elements of x at integer `indices` along `axis`, as numpy.take (None: of the flattened x).

    x: (d0, .., da, .., dn), indices: any shape I -> (d0, .., I, .., dn). mode 'raise' (negative
    indices count from the end; others raise BoundsError at run time), 'clip' or 'wrap'. Only x
    is differentiated; its gradient is a scatter (the indices are data).
    """
    x = check.tensor("take", "x", x, float_only=False)
    idx = check.int_tensor("take", "indices", indices)
    check.choice("take", "mode", mode, ("raise", "clip", "wrap"))
    if axis is None:
        x = x.reshape((x.size,)) if x.ndim != 1 else x
        a = 0
    else:
        a = check.axis("take", axis, x.ndim)
    n = x.shape[a]
    shape = x.shape[:a] + idx.shape + x.shape[a + 1:]

    def body(*i):
        k = idx[i[a:a + idx.ndim]]
        if mode == "clip":
            k = hd.clamp(k, 0, n - 1)
        elif mode == "wrap":
            k = k % n
        else:
            k = hd.where(k < 0, k + n, k)
        return x[i[:a] + (k,) + i[a + idx.ndim:]]
    return hd.compute(shape, body, name="take")
