"""Normalization, softmax and losses, written as reductions and broadcasting tensor arithmetic.

Conventions follow torch.nn.functional: the channel (class) axis is 1, `reduction` is 'mean',
'sum' or 'none', and the normalizations use the biased variance.
"""
from __future__ import annotations

import math
import numbers

import numpy as np

import halide_ad as hd
from halide_ad.errors import ShapeError, TraceError, user_loc
from halide_ad.ops import _checks as check
from halide_ad.ops._fuse import at_kept, reduce_axes
from halide_ad.tensor import Tensor, broadcast_shape, map_elementwise

_REDUCTIONS = ("mean", "sum", "none")


def _number(op: str, name: str, v, *, lo: float | None = None, hi: float | None = None,
            open_hi: bool = False) -> float:
    if not isinstance(v, numbers.Real) or isinstance(v, bool) or not math.isfinite(v):
        raise TraceError(f"ops.{op}: {name} must be a finite number, got {v!r}", user_loc())
    if (lo is not None and v < lo) or (hi is not None and (v >= hi if open_hi else v > hi)):
        interval = f"[{lo}, {hi}{')' if open_hi else ']'}"
        raise TraceError(f"ops.{op}: {name}={v!r} is outside {interval}", user_loc())
    return float(v)


def _softmax_parts(op: str, x, axis):
    """(x, axis, m, e, s): the maximum m along `axis`, e = exp(x - m), and the sum s of e along
    `axis` (m and s kept as size 1). e is a Func of its own: its derivative is its value, so the
    gradient reads it instead of computing exp again (a third of softmax's gradient). The shift
    by m changes no result, so its gradient is zero in exact arithmetic: m is a stop_gradient,
    and the gradient makes no pass for it."""
    x = check.tensor(op, "x", x)
    a = check.axis(op, axis, x.ndim)
    m = reduce_axes("max", lambda i: x[i], x.shape, (a,), name=f"{op}_max")
    e = hd.compute(x.shape, lambda *i: hd.exp(x[i] - hd.stop_gradient(m[at_kept(i, (a,))])),
                   name=f"{op}_exp")
    s = reduce_axes("sum", lambda i: e[i], x.shape, (a,), name=f"{op}_sum")
    return x, a, m, e, s


@hd.func
def softmax(x, axis=-1):
    """exp(x) / sum(exp(x)) along `axis`, with the maximum subtracted first. Same shape as x."""
    x, a, m, e, s = _softmax_parts("softmax", x, axis)
    # e times a reciprocal per row, as PyTorch's CPU kernel: the gradient then reads e and the
    # cotangent and multiplies, where e / s divided twice per element and read y as well
    # (s read at its kept 0, not at r's own point: a plain call would inline the sum into r, as
    # one scalar chain of adds)
    r = hd.compute(s.shape, lambda *i: 1.0 / s[at_kept(i, (a,))], name="softmax_reciprocal")
    return hd.compute(x.shape, lambda *i: e[i] * r[at_kept(i, (a,))], name="softmax")


@hd.func
def log_softmax(x, axis=-1):
    """x - log(sum(exp(x))) along `axis`, computed stably. Same shape as x."""
    x, a, m, e, s = _softmax_parts("log_softmax", x, axis)
    shift = lambda i: hd.stop_gradient(m[at_kept(i, (a,))]) + hd.log(s[at_kept(i, (a,))])  # noqa: E731
    return hd.compute(x.shape, lambda *i: x[i] - shift(i), name="log_softmax")


@hd.func
def bias_add(x, bias, axis=1):
    """x + bias broadcast along `axis`: x (..., C at axis, ...), bias (C,) -> x's shape."""
    x = check.tensor("bias_add", "x", x)
    bias = check.tensor("bias_add", "bias", bias, ndim=1)
    a = check.axis("bias_add", axis, x.ndim)
    if bias.shape[0] != x.shape[a]:
        raise ShapeError(f"ops.bias_add: bias has {bias.shape[0]} entries but axis {a} of x (shape "
                         f"{x.shape}) has {x.shape[a]}", user_loc())
    return hd.compute(x.shape, lambda *i: x[i] + bias[i[a]], name="bias_add")


def _normalized(op: str, x: Tensor, gamma, beta, axes: tuple[int, ...], param_axes: tuple[int, ...],
                eps: float) -> Tensor:
    """(x - mean) / sqrt(var + eps) * gamma + beta, statistics over `axes` (biased variance);
    gamma and beta (each optional) are indexed by x's `param_axes`. Three Funcs: mean, var, out."""
    shape = tuple(x.shape[a] for a in param_axes)
    params = []
    for pname, p in (("gamma", gamma), ("beta", beta)):
        if p is not None:
            p = check.tensor(op, pname, p)
            if p.shape != shape:
                raise ShapeError(f"ops.{op}: {pname} has shape {p.shape}; it must be {shape}, axes "
                                 f"{param_axes} of x", user_loc())
        params.append(p)
    g, b = params
    inv_count = 1.0 / math.prod(x.shape[a] for a in axes)
    mean = reduce_axes("sum", lambda i: x[i], x.shape, axes, scale=inv_count, name=f"{op}_mean")

    def centered(i):
        return x[i] - mean[at_kept(i, axes)]

    def centered_for_var(i):  # d var / d mean = -2 mean(x - mean) = 0: no pass for it
        return x[i] - hd.stop_gradient(mean[at_kept(i, axes)])
    var = reduce_axes("sum", lambda i: centered_for_var(i) * centered_for_var(i), x.shape, axes,
                      scale=inv_count, name=f"{op}_var")

    def body(*i):
        v = centered(i) * hd.rsqrt(var[at_kept(i, axes)] + eps)
        if g is not None:
            v = v * g[tuple(i[a] for a in param_axes)]
        if b is not None:
            v = v + b[tuple(i[a] for a in param_axes)]
        return v
    return hd.compute(x.shape, body, name=op)


@hd.func
def batch_norm(x, gamma=None, beta=None, eps=1e-5):
    """Batch normalization in training mode: statistics over every axis but the channel axis 1.

    x: (N, C, ...); gamma, beta: (C,) or None -> x's shape. Uses the batch's biased variance,
    as torch.nn.functional.batch_norm(training=True).
    """
    x = check.tensor("batch_norm", "x", x)
    if x.ndim < 2:
        raise ShapeError(f"ops.batch_norm: x must be (N, C, ...), got shape {x.shape}", user_loc())
    eps = _number("batch_norm", "eps", eps, lo=0)
    axes = (0,) + tuple(range(2, x.ndim))
    return _normalized("batch_norm", x, gamma, beta, axes, (1,), eps)


@hd.func
def layer_norm(x, gamma=None, beta=None, axis=-1, eps=1e-5):
    """Layer normalization over `axis` (an int or a tuple, e.g. the trailing axes).

    x: any shape; gamma, beta: the shape of x's normalized axes, or None -> x's shape.
    torch.nn.functional.layer_norm(x, x.shape[-k:], ...) is axis=(-k, ..., -1).
    """
    x = check.tensor("layer_norm", "x", x)
    axes = check.axes("layer_norm", axis, x.ndim)
    eps = _number("layer_norm", "eps", eps, lo=0)
    return _normalized("layer_norm", x, gamma, beta, axes, axes, eps)


@hd.func
def l2_normalize(x, axis=1, eps=1e-12):
    """x / max(||x||_2, eps) along `axis`, as torch.nn.functional.normalize. Same shape as x."""
    x = check.tensor("l2_normalize", "x", x)
    a = check.axes("l2_normalize", axis, x.ndim)
    eps = _number("l2_normalize", "eps", eps, lo=0)
    sq = reduce_axes("sum", lambda i: x[i] * x[i], x.shape, a, name="l2_normalize_sq")
    return hd.compute(x.shape, lambda *i: x[i] / hd.maximum(hd.sqrt(sq[at_kept(i, a)]), eps),
                      name="l2_normalize")


@hd.func
def lrn(x, size=5, alpha=1e-4, beta=0.75, k=1.0):
    """Local response normalization across channels (axis 1), as torch's local_response_norm:

        out[n, c] = x[n, c] / (k + alpha / size * sum_{c' in window(c)} x[n, c']^2) ** beta

    with the window c - size//2 .. c + (size-1)//2, zero outside. x: (N, C, ...) -> x's shape.
    """
    x = check.tensor("lrn", "x", x)
    if x.ndim < 2:
        raise ShapeError(f"ops.lrn: x must be (N, C, ...), got shape {x.shape}", user_loc())
    size = check.ints("lrn", "size", size, 1)[0]
    alpha, beta, k = (_number("lrn", n, v) for n, v in (("alpha", alpha), ("beta", beta), ("k", k)))
    xe = hd.constant_exterior(x)
    r = hd.rdom((-(size // 2), (size - 1) // 2 + 1))

    def body(*i):
        near = xe[(i[0], i[1] + r) + i[2:]]
        window = hd.sum(near * near)
        return x[i] / (k + alpha / size * window) ** beta
    return hd.compute(x.shape, body, name="lrn")


@hd.func
def dropout(x, mask, p=0.5):
    """x * mask / (1 - p): inverted dropout with a given mask (1 keeps, 0 drops).

    x: any shape; mask: a float or bool tensor that broadcasts to x (data, not differentiated).
    """
    x = check.tensor("dropout", "x", x)
    mask = check.tensor("dropout", "mask", mask, float_only=False)
    p = _number("dropout", "p", p, lo=0, hi=1, open_hi=True)
    scale = 1.0 / (1.0 - p)
    if mask.dtype.kind not in "bf":
        raise TraceError(f"ops.dropout: mask must be a float or bool tensor, got {mask.dtype}", user_loc())
    if broadcast_shape(x.shape, mask.shape) != x.shape:
        raise ShapeError(f"ops.dropout: mask of shape {mask.shape} does not broadcast to x's {x.shape}",
                         user_loc())
    if mask.dtype.kind == "b":
        return map_elementwise(lambda v, m: hd.where(m, v * scale, 0.0), (x, mask), "dropout")
    return map_elementwise(lambda v, m: v * m * scale, (x, mask), "dropout")


def _loss(op: str, summand, shape: tuple[int, ...], classes: int | None, reduction: str, *,
          weight_summand=None, name: str) -> Tensor:
    """A loss whose value at element i of `shape` is sum over classes c of summand(i, c) (or
    summand(i, None) without classes), reduced over the elements: one Func for 'none', 'sum'
    and 'mean' by a count; for 'mean' weighted by weight_summand, a ratio of two sums."""
    def over_classes(i, f):
        if classes is None:
            return f(i, None)
        c = hd.rdom(classes)
        return hd.sum(f(i, c))

    if reduction == "none":
        return hd.compute(shape, lambda *i: over_classes(i, summand), name=name)

    def total(f, scale=None):
        i = hd.rdom(*shape)
        i = i if isinstance(i, tuple) else (i,)
        rc = (hd.rdom(classes),) if classes is not None else ()
        term = f(i, rc[0] if rc else None)
        return hd.sum(term if scale is None else term * scale)

    if reduction == "sum":
        return hd.compute((), lambda: total(summand), name=name)
    if weight_summand is None:
        return hd.compute((), lambda: total(summand, 1.0 / math.prod(shape)), name=name)
    return hd.compute((), lambda: total(summand) / total(weight_summand), name=name)


def _check_weight(op: str, weight, C: int):
    if weight is None:
        return None
    weight = check.tensor(op, "weight", weight, ndim=1)
    if weight.shape != (C,):
        raise ShapeError(f"ops.{op}: weight has shape {weight.shape}; it needs one entry per class ({C},)",
                         user_loc())
    return weight


def _nll(op: str, logp_at, C: int, target: Tensor, weight, ignore_index, reduction: str,
         dtype: np.dtype) -> Tensor:
    """nll_loss over log-probabilities logp_at(n, c, *rest), written as a sum over the classes c
    of `target == c` selections: the gradient is a gather, with no data-dependent index."""
    check.choice(op, "reduction", reduction, _REDUCTIONS)
    if not check.is_int(ignore_index):
        raise TraceError(f"ops.{op}: ignore_index must be an int, got {ignore_index!r}", user_loc())
    weight = _check_weight(op, weight, C)
    classes = hd.compute((C,), lambda c: c, name="classes")

    def chosen(i, c):
        t = target[i]
        # Read `classes` at the target itself: a run-time BoundsError if it is no class. It comes
        # first because & short-circuits in the kernels.
        valid = classes[hd.where(t == ignore_index, 0, t)] >= 0
        return valid & (t == c) & (t != ignore_index)

    def w(c):  # a typed 1, so that float32 losses stay float32
        return dtype.type(1) if weight is None else weight[c]

    def summand(i, c):
        return hd.where(chosen(i, c), -logp_at(i[0], c, *i[1:]) * w(c), 0.0)

    def weight_summand(i, c):  # 'mean' divides by the total weight of the targets not ignored
        return hd.where(chosen(i, c), w(c), dtype.type(0))
    return _loss(op, summand, target.shape, C, reduction, weight_summand=weight_summand, name=op)


def _check_target(op: str, x: Tensor, target: Tensor) -> None:
    if x.ndim < 2 or target.shape != (x.shape[0],) + x.shape[2:]:
        raise ShapeError(f"ops.{op}: input (N, C, ...) of shape {x.shape} needs target of shape "
                         f"{(x.shape[0],) + x.shape[2:]}, got {target.shape}", user_loc())


@hd.func
def nll_loss(logp, target, weight=None, ignore_index=-100, reduction="mean"):
    """The negative log-likelihood of integer class targets, as torch.nn.functional.nll_loss.

    logp: (N, C) or (N, C, d1, ...) log-probabilities; target: (N,) or (N, d1, ...) ints in
    [0, C) or equal to ignore_index; weight: (C,) or None. 'mean' divides by the total weight of
    the targets not ignored. A target outside [0, C) raises BoundsError at run time.
    -> () for 'mean' and 'sum', target's shape for 'none'.
    """
    logp = check.tensor("nll_loss", "logp", logp)
    target = check.int_tensor("nll_loss", "target", target)
    _check_target("nll_loss", logp, target)
    return _nll("nll_loss", lambda *i: logp[i], logp.shape[1], target, weight, ignore_index, reduction,
                logp.dtype)


@hd.func
def cross_entropy(logits, target, weight=None, ignore_index=-100, reduction="mean"):
    """Softmax cross-entropy, as torch.nn.functional.cross_entropy.

    logits: (N, C) or (N, C, d1, ...). target: integer classes (N,) or (N, d1, ...) (as in
    nll_loss), or class probabilities of the shape of logits. weight: (C,) or None.
    -> () for 'mean' and 'sum', (N, d1, ...) for 'none'.
    """
    op = "cross_entropy"
    logits = check.tensor(op, "logits", logits, ndim=tuple(range(2, 9)))
    target = check.tensor(op, "target", target, float_only=False)
    if target.dtype.kind not in "fiu":
        raise TraceError(f"ops.{op}: target must hold class indices (ints) or probabilities (floats), got "
                         f"{target.dtype}", user_loc())
    if target.dtype.kind != "f":
        _check_target(op, logits, target)
    elif target.shape != logits.shape:
        raise ShapeError(f"ops.{op}: probability targets must have the shape of logits {logits.shape}, got "
                         f"{target.shape}", user_loc())
    _, _, m, _, s = _softmax_parts(op, logits, 1)

    def logp_at(n, c, *rest):  # log_softmax, fused into the loss: no Func of its own
        return logits[(n, c) + rest] - hd.stop_gradient(m[(n, 0) + rest]) - hd.log(s[(n, 0) + rest])

    if target.dtype.kind != "f":
        return _nll(op, logp_at, logits.shape[1], target, weight, ignore_index, reduction, logits.dtype)
    check.choice(op, "reduction", reduction, _REDUCTIONS)
    weight = _check_weight(op, weight, logits.shape[1])

    def summand(i, c):
        at = (i[0], c) + i[1:]
        term = -target[at] * logp_at(*at)
        return term if weight is None else term * weight[c]
    return _loss(op, summand, (logits.shape[0],) + logits.shape[2:], logits.shape[1], reduction, name=op)


@hd.func
def mse_loss(input, target, reduction="mean"):
    """(input - target) ** 2, reduced by 'mean', 'sum' or 'none'. Shapes must match.
    -> () for 'mean' and 'sum', input's shape for 'none'."""
    input = check.tensor("mse_loss", "input", input)
    target = check.tensor("mse_loss", "target", target)
    check.choice("mse_loss", "reduction", reduction, _REDUCTIONS)
    if input.shape != target.shape:
        raise ShapeError(f"ops.mse_loss: input {input.shape} and target {target.shape} must have the same "
                         "shape", user_loc())

    def summand(i, _):
        d = input[i] - target[i]
        return d * d
    return _loss("mse_loss", summand, input.shape, None, reduction, name="mse_loss")
