"""Elementwise operators and activations. Every operator broadcasts its tensor arguments with
numpy's rules and keeps the shape of the broadcast; a Python number may stand for any operand
but the first. Gradients are derived by halide_ad from the expressions below."""
from __future__ import annotations

import numbers

import halide_ad as hd
from halide_ad.errors import TraceError, user_loc
from halide_ad.ops import _checks as check
from halide_ad.tensor import BoundaryView, Tensor, map_elementwise


def _operand(op: str, name: str, v):
    if isinstance(v, BoundaryView):
        v = v.tensor
    if isinstance(v, Tensor) or (isinstance(v, numbers.Real) and not isinstance(v, bool)):
        return v
    raise TraceError(f"ops.{op}: {name} must be an hd.Tensor or a Python number, got "
                     f"{type(v).__name__}", user_loc())


def _map(op: str, fn, *args, first_name: str = "x"):
    """`fn` applied elementwise over the broadcast of `args` (the first must be a float tensor)."""
    first = check.tensor(op, first_name, args[0])
    rest = [_operand(op, f"argument {k + 2}", a) for k, a in enumerate(args[1:])]
    for k, a in enumerate(rest):
        if isinstance(a, Tensor) and a.dtype.kind != "f":
            raise TraceError(f"ops.{op}: argument {k + 2} must be a float tensor, got {a.dtype}", user_loc())
    return map_elementwise(fn, (first, *rest), op)


# ---- activations and unary math -----------------------------------------------------------------

@hd.func
def log(x):
    """Natural logarithm, elementwise. x: any shape -> same shape."""
    return _map("log", hd.log, x)


@hd.func
def sqrt(x):
    """Square root, elementwise. x: any shape -> same shape."""
    return _map("sqrt", hd.sqrt, x)


@hd.func
def exp(x):
    """e ** x, elementwise. x: any shape -> same shape."""
    return _map("exp", hd.exp, x)


@hd.func
def sigmoid(x):
    """1 / (1 + exp(-x)), elementwise. x: any shape -> same shape."""
    return _map("sigmoid", hd.sigmoid, x)


@hd.func
def tanh(x):
    """Hyperbolic tangent, elementwise. x: any shape -> same shape."""
    return _map("tanh", hd.tanh, x)


@hd.func
def relu(x):
    """max(x, 0), elementwise, with gradient 0 at 0. x: any shape -> same shape."""
    return _map("relu", hd.relu, x)


@hd.func
def leaky_relu(x, negative_slope=0.01):
    """x if x > 0 else negative_slope * x (torch.nn.functional.leaky_relu). x: any shape -> same."""
    if not isinstance(negative_slope, numbers.Real) or isinstance(negative_slope, bool):
        raise TraceError(f"ops.leaky_relu: negative_slope must be a number, got {negative_slope!r}",
                         user_loc())
    return _map("leaky_relu", lambda e: hd.where(e > 0, e, e * negative_slope), x)


@hd.func
def prelu(x, alpha):
    """x if x > 0 else alpha[c] * x, with c the channel (axis 1) of x, as torch's prelu.

    x: (N, C, ...) or (C,); alpha: (C,) or (1,) -> the shape of x.
    """
    x = check.tensor("prelu", "x", x)
    alpha = check.tensor("prelu", "alpha", alpha, ndim=1)
    channels = x.shape[1] if x.ndim >= 2 else x.shape[0]
    if alpha.shape[0] not in (1, channels):
        raise hd.ShapeError(f"ops.prelu: alpha has {alpha.shape[0]} entries; it needs 1 or one per "
                            f"channel ({channels}, axis 1 of x of shape {x.shape})", user_loc())
    cdim = 1 if x.ndim >= 2 else 0

    def body(*i):
        a = alpha[0 if alpha.shape[0] == 1 else i[cdim]]
        return hd.where(x[i] > 0, x[i], a * x[i])
    return hd.compute(x.shape, body, name="prelu")


@hd.func
def abs(x):
    """|x|, elementwise, with gradient 0 at 0. x: any shape -> same shape."""
    return _map("abs", hd.abs, x)


@hd.func
def negative(x):
    """-x, elementwise. x: any shape -> same shape."""
    return _map("negative", lambda e: -e, x)


@hd.func
def clip(x, a_min=None, a_max=None):
    """x limited to [a_min, a_max] (numbers or broadcastable tensors; None means unbounded).

    The gradient is 1 where a_min <= x <= a_max (bounds included, as torch.clamp) and 0 outside;
    tensor bounds receive the gradient of the elements they clip.
    """
    if a_min is None and a_max is None:
        raise TraceError("ops.clip: give a_min, a_max or both", user_loc())
    lo = None if a_min is None else _operand("clip", "a_min", a_min)
    hi = None if a_max is None else _operand("clip", "a_max", a_max)
    if isinstance(lo, numbers.Real) and isinstance(hi, numbers.Real) and lo > hi:
        raise TraceError(f"ops.clip: a_min={lo!r} is larger than a_max={hi!r}", user_loc())
    if lo is None:
        return _map("clip", lambda e, h: hd.where(e > h, h, e), x, hi)
    if hi is None:
        return _map("clip", lambda e, lo_: hd.where(e < lo_, lo_, e), x, lo)
    return _map("clip", lambda e, lo_, h: hd.where(e < lo_, lo_, hd.where(e > h, h, e)), x, lo, hi)


@hd.func
def power(x, p):
    """x ** p, elementwise; p is a number or a broadcastable tensor (its gradient x^p log x needs
    x > 0). Shapes broadcast."""
    return _map("power", lambda a, b: a ** b, x, p)


# ---- binary -------------------------------------------------------------------------------------

def _binary(op: str, fn, a, b):
    a, b = _operand(op, "a", a), _operand(op, "b", b)
    if not isinstance(a, Tensor):
        if not isinstance(b, Tensor):
            raise TraceError(f"ops.{op}: at least one operand must be an hd.Tensor", user_loc())
        return _map(op, lambda y, x: fn(x, y), b, a, first_name="b")
    return _map(op, fn, a, b, first_name="a")


@hd.func
def maximum(a, b):
    """The larger of a and b, elementwise; ties split the gradient evenly (torch.maximum)."""
    return _binary("maximum", hd.maximum, a, b)


@hd.func
def minimum(a, b):
    """The smaller of a and b, elementwise; ties split the gradient evenly (torch.minimum)."""
    return _binary("minimum", hd.minimum, a, b)


@hd.func
def add(a, b):
    """a + b with broadcasting."""
    return _binary("add", lambda x, y: x + y, a, b)


@hd.func
def subtract(a, b):
    """a - b with broadcasting."""
    return _binary("subtract", lambda x, y: x - y, a, b)


@hd.func
def multiply(a, b):
    """a * b with broadcasting."""
    return _binary("multiply", lambda x, y: x * y, a, b)


@hd.func
def divide(a, b):
    """a / b with broadcasting."""
    return _binary("divide", lambda x, y: x / y, a, b)


@hd.func
def where(condition, a, b):
    """a where condition holds, else b; condition is a bool tensor (data, not differentiated),
    a and b are tensors or numbers. All three broadcast together."""
    cond = check.tensor("where", "condition", condition, float_only=False)
    if cond.dtype.kind != "b":
        raise TraceError(f"ops.where: condition must be a bool tensor, got {cond.dtype}; compare "
                         "first, e.g. x > 0", user_loc())
    a, b = _operand("where", "a", a), _operand("where", "b", b)
    if not isinstance(a, Tensor) and not isinstance(b, Tensor):
        raise TraceError("ops.where: at least one of a and b must be an hd.Tensor", user_loc())
    return map_elementwise(hd.where, (cond, a, b), "where")
