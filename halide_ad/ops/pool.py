"""Pooling and resampling over (N, C, H, W) tensors, as torch.nn.functional does them.

Windows are reduction domains over `stride * i + dilation * r - padding`; padding reads a
boundary view (-inf for max, 0 for average). Resampling computes its source rows and columns
with integer floor division of the output index, `(a * i + b) // q`, and its bilinear weights
from the matching remainder, so the inverter turns every adjoint into a gather.
"""
from __future__ import annotations

import math

import halide_ad as hd
from halide_ad.errors import ShapeError, TraceError, user_loc
from halide_ad.ops import _checks as check
from halide_ad.ops._fuse import reduce_axes


def _window(op: str, x, kernel_size, stride, padding, dilation, ceil_mode):
    """Checked arguments and the output size of a 2-d pooling window."""
    x = check.tensor(op, "x", x, ndim=4)
    kernel = check.ints(op, "kernel_size", kernel_size, 2)
    stride = kernel if stride is None else check.ints(op, "stride", stride, 2)
    pads = check.ints(op, "padding", padding, 2, minimum=0)
    dilation = check.ints(op, "dilation", dilation, 2)
    if any(2 * p > k for p, k in zip(pads, kernel, strict=True)):
        raise ShapeError(f"ops.{op}: padding={pads} must be at most half of kernel_size={kernel}", user_loc())
    out = []
    for n, k, s, p, d in zip(x.shape[2:], kernel, stride, pads, dilation, strict=True):
        span = n + 2 * p - d * (k - 1) - 1
        o = (-(-span // s) if ceil_mode else span // s) + 1
        if ceil_mode and (o - 1) * s >= n + p:  # the last window must start inside x or its left padding
            o -= 1
        out.append(o)
    check.positive_output(op, x.shape[:2] + tuple(out), f"x's spatial size {x.shape[2:]} is smaller than "
                          f"the window {kernel} (dilation {dilation}) plus padding {pads}")
    return x, kernel, stride, pads, dilation, tuple(out)


def _reads_outside(size, out, kernel, stride, pads, dilation) -> bool:
    return any(p > 0 or (o - 1) * s + d * (k - 1) - p > n - 1
               for n, o, k, s, p, d in zip(size, out, kernel, stride, pads, dilation, strict=True))


@hd.func
def max_pool2d(x, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False):
    """The maximum over each window, as torch.nn.functional.max_pool2d.

    x: (N, C, H, W) -> (N, C, H_out, W_out), H_out = (H + 2 p - d (k - 1) - 1) // s + 1 (rounded
    up with ceil_mode). stride defaults to kernel_size. The gradient goes to the first maximal
    element of each window.
    """
    x, kernel, stride, pads, dilation, out = _window("max_pool2d", x, kernel_size, stride, padding,
                                                      dilation, ceil_mode)
    view = hd.constant_exterior(x, -math.inf) if _reads_outside(
        x.shape[2:], out, kernel, stride, pads, dilation) else x
    r, s = hd.rdom(*kernel)
    (sh, sw), (ph, pw), (dh, dw) = stride, pads, dilation
    return hd.compute(x.shape[:2] + out, lambda n, c, i, j:
                      hd.max(view[n, c, sh * i + dh * r - ph, sw * j + dw * s - pw]), name="max_pool2d")


@hd.func
def avg_pool2d(x, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
               divisor_override=None):
    """The mean over each window, as torch.nn.functional.avg_pool2d.

    x: (N, C, H, W) -> (N, C, H_out, W_out) as in max_pool2d. Padding counts as zeros in the
    divisor when count_include_pad; divisor_override replaces the divisor.
    """
    op = "avg_pool2d"
    x, kernel, stride, pads, _, out = _window(op, x, kernel_size, stride, padding, 1, ceil_mode)
    if divisor_override is not None and not (check.is_int(divisor_override) and divisor_override > 0):
        raise ShapeError(f"ops.{op}: divisor_override must be a positive int, got {divisor_override!r}",
                         user_loc())
    outside = _reads_outside(x.shape[2:], out, kernel, stride, pads, (1, 1))
    view = hd.constant_exterior(x) if outside else x
    r, s = hd.rdom(*kernel)
    (kh, kw), (sh, sw), (ph, pw) = kernel, stride, pads
    H, W = x.shape[2:]

    def divisor(i, j):
        if divisor_override is not None:
            return divisor_override
        if not outside or (count_include_pad and not ceil_mode):
            return kh * kw
        h0, w0 = sh * i - ph, sw * j - pw  # torch's pool_size clips windows at the padded edge
        h1, w1 = hd.minimum(h0 + kh, H + ph), hd.minimum(w0 + kw, W + pw)
        if count_include_pad:
            return hd.cast((h1 - h0) * (w1 - w0), x.dtype)
        rows = hd.minimum(h1, H) - hd.maximum(h0, 0)
        cols = hd.minimum(w1, W) - hd.maximum(w0, 0)
        return hd.cast(rows * cols, x.dtype)

    # Dividing each term, not the sum, keeps the pool one Func (the divisor depends on i, j only).
    return hd.compute(x.shape[:2] + out, lambda n, c, i, j:
                      hd.sum(view[n, c, sh * i + r - ph, sw * j + s - pw] / divisor(i, j)), name=op)


@hd.func
def global_max_pool2d(x):
    """The maximum over H and W: (N, C, H, W) -> (N, C, 1, 1)."""
    x = check.tensor("global_max_pool2d", "x", x, ndim=4)
    return reduce_axes("max", lambda i: x[i], x.shape, (2, 3), name="global_max_pool2d")


@hd.func
def global_avg_pool2d(x):
    """The mean over H and W: (N, C, H, W) -> (N, C, 1, 1)."""
    x = check.tensor("global_avg_pool2d", "x", x, ndim=4)
    return reduce_axes("sum", lambda i: x[i], x.shape, (2, 3), scale=1.0 / (x.shape[2] * x.shape[3]),
                       name="global_avg_pool2d")


# ---- resampling ---------------------------------------------------------------------------------

def _source(i, n_in: int, n_out: int, align_corners: bool):
    """The bilinear source of output index i along one axis: (floor, remainder, q) with
    source coordinate = floor + remainder / q, all integer expressions in i.

    align_corners:      src = i (n_in - 1) / (n_out - 1)
    otherwise (torch):  src = (i + 1/2) n_in / n_out - 1/2 = ((2 i + 1) n_in - n_out) / (2 n_out)
    """
    if align_corners:
        if n_out == 1:
            return 0, None, 1
        a, b, q = n_in - 1, 0, n_out - 1
    else:
        a, b, q = 2 * n_in, n_in - n_out, 2 * n_out
    g = math.gcd(a, b, q)
    a, b, q = a // g, b // g, q // g
    num = a * i + b
    return (num if q == 1 else num // q), (None if q == 1 else num % q), q


def _bilinear(x, size: tuple[int, int], align_corners: bool, name: str):
    xe = hd.repeat_edge(x)  # the taps beyond the edge clamp to it, as torch's do
    H, W = x.shape[2:]
    dtype = x.dtype

    def axis_taps(i, n_in, n_out):
        lo, rem, q = _source(i, n_in, n_out, align_corners)
        if rem is None:
            return [(lo, 1.0)]
        frac = hd.cast(rem, dtype) / q
        return [(lo, 1.0 - frac), (lo + 1, frac)]

    def body(n, c, i, j):
        value = 0.0
        for y, wy in axis_taps(i, H, size[0]):
            for xx, wx in axis_taps(j, W, size[1]):
                value = value + xe[n, c, y, xx] * wy * wx
        return value
    return hd.compute(x.shape[:2] + size, body, name=name)


def _nearest(x, size: tuple[int, int], name: str):
    def src(i, n_in, n_out):  # torch's legacy 'nearest': floor(i * n_in / n_out)
        if n_out % n_in == 0:
            return i // (n_out // n_in)
        g = math.gcd(n_in, n_out)
        return (i * (n_in // g)) // (n_out // g)
    H, W = x.shape[2:]
    return hd.compute(x.shape[:2] + size, lambda n, c, i, j:
                      x[n, c, src(i, H, size[0]), src(j, W, size[1])], name=name)


@hd.func
def resize(x, size, method="bilinear", align_corners=False):
    """x resampled to `size` = (H_out, W_out), as torch.nn.functional.interpolate(size=...):
    method 'bilinear' (align_corners either way) or 'nearest' (torch's legacy floor rule).

    x: (N, C, H, W) -> (N, C, H_out, W_out). All source indices are integer expressions of the
    output index, so the gradient is a gather for every size, not only integer scale factors.
    """
    x = check.tensor("resize", "x", x, ndim=4)
    size = check.ints("resize", "size", size, 2)
    check.choice("resize", "method", method, ("bilinear", "nearest"))
    if not isinstance(align_corners, bool):
        raise TraceError(f"ops.resize: align_corners must be True or False, got {align_corners!r}", user_loc())
    if method == "nearest":
        if align_corners:
            raise TraceError("ops.resize: align_corners applies to method='bilinear' only", user_loc())
        return _nearest(x, size, "resize")
    return _bilinear(x, size, align_corners, "resize")


@hd.func
def upsampling(x, scale_factor=2, method="nearest", align_corners=False):
    """x enlarged by integer scale factors (an int or (scale_h, scale_w)), as Relay's
    nn.upsampling and torch's interpolate(scale_factor=...): method 'nearest' reads
    x[n, c, i // scale_h, j // scale_w]; 'bilinear' is resize to (H * scale_h, W * scale_w).

    x: (N, C, H, W) -> (N, C, H * scale_h, W * scale_w).
    """
    x = check.tensor("upsampling", "x", x, ndim=4)
    scale = check.ints("upsampling", "scale_factor", scale_factor, 2)
    check.choice("upsampling", "method", method, ("nearest", "bilinear"))
    size = (x.shape[2] * scale[0], x.shape[3] * scale[1])
    if method == "nearest":
        if align_corners:
            raise TraceError("ops.upsampling: align_corners applies to method='bilinear' only", user_loc())
        return _nearest(x, size, "upsampling")
    return _bilinear(x, size, bool(align_corners), "upsampling")

