"""Linear layers and convolutions, as sums over reduction domains.

Layouts follow torch.nn.functional: x is (N, C, *spatial), a convolution's weight is
(K, C / groups, *kernel) and a transposed convolution's is (C, K / groups, *kernel). A padded
convolution reads a padded copy of x, so that its products are a contraction (BLAS); every
adjoint is a gather: a convolution's reads `x[n, c, s*i + d*r]` invert to small windows, the
copy's to a crop.
"""
from __future__ import annotations

import builtins

import halide_ad as hd
from halide_ad.errors import ShapeError, TraceError, user_loc
from halide_ad.ops import _checks as check
from halide_ad.tensor import Tensor, broadcast_shape

_PADDING_VIEWS = {"zeros": hd.constant_exterior, "replicate": hd.repeat_edge, "reflect": hd.mirror}


def _named(nd: int, body):
    """`body(n, k, *pos)` with the index variables named n, k, (y,) x in generated code."""
    if nd == 1:
        return lambda n, k, x: body(n, k, x)
    return lambda n, k, y, x: body(n, k, y, x)


@hd.func
def dense(x, w, b=None):
    """x @ w.T + b, as torch.nn.functional.linear (Relay's dense).

    x: (..., in_features); w: (out_features, in_features); b: (out_features,) or None
    -> (..., out_features).
    """
    x = check.tensor("dense", "x", x)
    w = check.tensor("dense", "w", w, ndim=2)
    if x.ndim == 0 or x.shape[-1] != w.shape[1]:
        raise ShapeError(f"ops.dense: x of shape {x.shape} needs w of shape (out_features, "
                         f"{x.shape[-1] if x.ndim else '?'}), got {w.shape}", user_loc())
    if b is not None:
        b = check.tensor("dense", "b", b, ndim=1)
        if b.shape != (w.shape[0],):
            raise ShapeError(f"ops.dense: b has shape {b.shape}; it must be ({w.shape[0]},)", user_loc())
    k = hd.rdom(w.shape[1])

    def body(*i):
        total = hd.sum(x[i[:-1] + (k,)] * w[i[-1], k])
        return total if b is None else total + b[i[-1]]
    return hd.compute(x.shape[:-1] + (w.shape[0],), body, name="dense")


@hd.func
def matmul(a, b):
    """numpy.matmul: (..., m, k) @ (..., k, n) -> (..., m, n), batch axes broadcast; a 1-d
    operand is a vector (its axis is dropped from the result)."""
    a = check.tensor("matmul", "a", a)
    b = check.tensor("matmul", "b", b)
    if a.ndim == 0 or b.ndim == 0:
        raise ShapeError("ops.matmul: operands must have at least one axis (use ops.multiply for scalars)",
                         user_loc())
    a2 = a.shape if a.ndim > 1 else (1,) + a.shape
    b2 = b.shape if b.ndim > 1 else b.shape + (1,)
    if a2[-1] != b2[-2]:
        raise ShapeError(f"ops.matmul: the inner dimensions differ: {a.shape} @ {b.shape}", user_loc())
    batch = broadcast_shape(a2[:-2], b2[:-2])
    shape = batch + ((a2[-2],) if a.ndim > 1 else ()) + ((b2[-1],) if b.ndim > 1 else ())
    k = hd.rdom(a2[-1])

    def operand(t: Tensor, bidx, row, col):
        if t.ndim == 1:
            return t[k]
        off = len(batch) - (t.ndim - 2)
        lead = tuple(0 if n == 1 else bidx[off + d] for d, n in enumerate(t.shape[:-2]))
        return t[lead + (row, col)]

    def body(*i):
        nb = len(batch)
        bidx, rest = i[:nb], list(i[nb:])
        row = rest.pop(0) if a.ndim > 1 else None
        col = rest.pop(0) if b.ndim > 1 else None
        return hd.sum(operand(a, bidx, row, k) * operand(b, bidx, k, col))
    if not shape:  # vector . vector
        return hd.compute((), lambda: hd.sum(a[k] * b[k]), name="matmul")
    return hd.compute(shape, body, name="matmul")


def _padding(op: str, padding, kernel: tuple[int, ...], stride: tuple[int, ...],
             dilation: tuple[int, ...]) -> list[tuple[int, int]]:
    """(before, after) per spatial axis for an int, a sequence, 'valid' or 'same'."""
    nd = len(kernel)
    if padding == "valid":
        return [(0, 0)] * nd
    if padding == "same":
        if any(s != 1 for s in stride):
            raise ShapeError(f"ops.{op}: padding='same' needs stride 1, got stride={stride}", user_loc())
        total = [d * (k - 1) for d, k in zip(dilation, kernel, strict=True)]
        return [(t // 2, t - t // 2) for t in total]
    if isinstance(padding, str):
        raise TraceError(f"ops.{op}: padding={padding!r}; use an int, a sequence of ints, 'valid' or 'same'",
                         user_loc())
    return [(p, p) for p in check.ints(op, "padding", padding, nd, minimum=0)]


def _padded_copy(x: Tensor, pads, mode: str, op: str) -> Tensor:
    """x padded on its spatial axes by `pads` with torch's padding_mode (zeros, reflect, replicate
    or circular)."""
    spatial = x.shape[2:]
    if mode == "circular":
        read = lambda i: x[i[:2] + tuple((v - lo) % n for v, (lo, _), n in
                                        zip(i[2:], pads, spatial, strict=True))]
    else:
        view = _PADDING_VIEWS[mode](x)
        read = lambda i: view[i[:2] + tuple(v - lo for v, (lo, _) in zip(i[2:], pads, strict=True))]
    shape = x.shape[:2] + tuple(n + lo + hi for n, (lo, hi) in zip(spatial, pads, strict=True))
    return hd.compute(shape, lambda *i: read(i), name=f"{op}_{mode}_pad")


def _conv(op: str, nd: int, x, w, b, stride, padding, dilation, groups, padding_mode) -> Tensor:
    x = check.tensor(op, "x", x, ndim=nd + 2)
    w = check.tensor(op, "w", w, ndim=nd + 2)
    N, C, *size = x.shape
    K, Cg, *kernel = w.shape
    groups = check.ints(op, "groups", groups, 1)[0]
    if C % groups or K % groups or Cg != C // groups:
        raise ShapeError(f"ops.{op}: with groups={groups}, x's {C} channels and w's {K} filters must be "
                         f"divisible by {groups} and w must be ({K}, {C // groups if C % groups == 0 else '?'}, "
                         f"...); got x {x.shape}, w {w.shape}", user_loc())
    stride = check.ints(op, "stride", stride, nd)
    dilation = check.ints(op, "dilation", dilation, nd)
    pads = _padding(op, padding, tuple(kernel), stride, dilation)
    check.choice(op, "padding_mode", padding_mode, tuple(_PADDING_VIEWS) + ("circular",))
    out = tuple((n + lo + hi - d * (k - 1) - 1) // s + 1
                for n, (lo, hi), d, k, s in zip(size, pads, dilation, kernel, stride, strict=True))
    check.positive_output(op, (N, K) + out, f"x's spatial size {tuple(size)} is smaller than the dilated "
                          f"kernel {tuple(d * (k - 1) + 1 for d, k in zip(dilation, kernel))} plus padding")
    if b is not None:
        b = check.tensor(op, "b", b, ndim=1)
        if b.shape != (K,):
            raise ShapeError(f"ops.{op}: b has shape {b.shape}; it must be ({K},)", user_loc())
    padded = any(lo or hi for lo, hi in pads)
    if padding_mode != "zeros" and padded and any(
            n <= builtins.max(lo, hi) for n, (lo, hi) in zip(size, pads, strict=True)):
        raise ShapeError(f"ops.{op}: padding_mode={padding_mode!r} needs padding smaller than x's spatial "
                         f"size {tuple(size)}, got {pads}", user_loc())
    if padded:
        # A padded copy, so that the convolution reads x at plain affine indices: a contraction
        # that BLAS computes, forward and backward (read through a zero view, the products sat
        # under a select and ran as loop nests, 20-30x slower at 8x32x64x64). Reflect, replicate
        # and circular padding also split every read into boundary pieces, which the copy keeps
        # in its own small gather instead of the convolution's loop nest.
        x = _padded_copy(x, pads, padding_mode, op)
    Kg = K // groups
    c, *r = hd.rdom(Cg, *kernel)

    def body(n, k, *pos):
        channel = c if groups == 1 else k * Cg + c if Kg == 1 else (k // Kg) * Cg + c
        at = [s * i + d * rr for i, rr, s, d in zip(pos, r, stride, dilation, strict=True)]
        total = hd.sum(x[(n, channel, *at)] * w[(k, c, *r)])
        return total if b is None else total + b[k]
    return hd.compute((N, K) + out, _named(nd, body), name=op)


@hd.func
def conv1d(x, w, b=None, stride=1, padding=0, dilation=1, groups=1, padding_mode="zeros"):
    """1-d cross-correlation, as torch.nn.functional.conv1d.

    x: (N, C, L); w: (K, C / groups, R); b: (K,) or None -> (N, K, L_out) with
    L_out = (L + 2 * padding - dilation * (R - 1) - 1) // stride + 1. padding is an int, 'valid'
    or 'same'; padding_mode 'zeros', 'reflect', 'replicate' or 'circular' (as torch.nn.Conv1d).
    """
    return _conv("conv1d", 1, x, w, b, stride, padding, dilation, groups, padding_mode)


@hd.func
def conv2d(x, w, b=None, stride=1, padding=0, dilation=1, groups=1, padding_mode="zeros"):
    """2-d cross-correlation, as torch.nn.functional.conv2d.

    x: (N, C, H, W); w: (K, C / groups, R, S); b: (K,) or None -> (N, K, H_out, W_out) with
    H_out = (H + 2 * padding - dilation * (R - 1) - 1) // stride + 1. stride, padding and dilation
    are ints or pairs (padding may be 'valid' or 'same'); padding_mode 'zeros', 'reflect',
    'replicate' or 'circular' (as torch.nn.Conv2d).
    """
    return _conv("conv2d", 2, x, w, b, stride, padding, dilation, groups, padding_mode)


@hd.func
def conv2d_transpose(x, w, b=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1):
    """The transpose (gradient) of conv2d, as torch.nn.functional.conv_transpose2d.

    x: (N, C, H, W); w: (C, K / groups, R, S); b: (K,) or None -> (N, K, H_out, W_out) with
    H_out = (H - 1) * stride - 2 * padding + dilation * (R - 1) + output_padding + 1.
    Each output gathers the inputs i with stride * i + dilation * r - padding == y, so the
    forward reads x at (y + padding - dilation * r) // stride where that division is exact.
    """
    op = "conv2d_transpose"
    x = check.tensor(op, "x", x, ndim=4)
    w = check.tensor(op, "w", w, ndim=4)
    N, C, *size = x.shape
    Cw, Kg, *kernel = w.shape
    groups = check.ints(op, "groups", groups, 1)[0]
    if Cw != C or C % groups:
        raise ShapeError(f"ops.{op}: w must be (C, K / groups, R, S) with C = {C}, x's channels, "
                         f"divisible by groups={groups}; got x {x.shape}, w {w.shape}", user_loc())
    stride = check.ints(op, "stride", stride, 2)
    dilation = check.ints(op, "dilation", dilation, 2)
    pads = check.ints(op, "padding", padding, 2, minimum=0)
    out_pad = check.ints(op, "output_padding", output_padding, 2, minimum=0)
    if any(o >= builtins.max(s, d) for o, s, d in zip(out_pad, stride, dilation, strict=True)):
        raise ShapeError(f"ops.{op}: output_padding={out_pad} must be smaller than stride {stride} or "
                         f"dilation {dilation}", user_loc())
    K, Cg = Kg * groups, C // groups
    out = tuple((n - 1) * s - 2 * p + d * (k - 1) + o + 1
                for n, s, p, d, k, o in zip(size, stride, pads, dilation, kernel, out_pad, strict=True))
    check.positive_output(op, (N, K) + out, "reduce padding")
    if b is not None:
        b = check.tensor(op, "b", b, ndim=1)
        if b.shape != (K,):
            raise ShapeError(f"ops.{op}: b has shape {b.shape}; it must be ({K},)", user_loc())
    view = hd.constant_exterior(x)
    c, *r = hd.rdom(Cg, *kernel)

    def body(n, k, *pos):
        channel, filt = (c, k) if groups == 1 else ((k // Kg) * Cg + c, k % Kg)
        at, exact = [], None
        for y, rr, s, d, p in zip(pos, r, stride, dilation, pads, strict=True):
            t = y + p - d * rr
            if s == 1:
                at.append(t)
            else:
                at.append(t // s)
                hit = t % s == 0
                exact = hit if exact is None else exact & hit
        term = view[(n, channel, *at)] * w[(channel, filt, *r)]
        total = hd.sum(term if exact is None else hd.where(exact, term, 0.0))
        return total if b is None else total + b[k]
    return hd.compute((N, K) + out, _named(2, body), name=op)

