"""The DSL's math: each function works on element expressions inside `hd.compute`, elementwise on
whole Tensors (numpy broadcasting), and on plain Python numbers."""
from __future__ import annotations

import math

import numpy as np

from halide_ad import ir
from halide_ad.errors import TraceError, user_loc
from halide_ad.expr import Expr, binary, call, is_tensorlike, select
from halide_ad.tensor import map_elementwise, reduce
from halide_ad.trace import current


def _elementwise(name: str, scalar_fn, numpy_fn):
    def api(*args):
        if any(is_tensorlike(a) for a in args) or _captures(args):
            return map_elementwise(scalar_fn, args, name)
        if any(isinstance(a, Expr) for a in args):
            return scalar_fn(*args)
        return numpy_fn(*args)
    api.__name__ = api.__qualname__ = name
    api.__doc__ = f"hd.{name}: on expressions, on Tensors (elementwise, broadcasting) and on numbers."
    return api


def _captures(args) -> bool:
    """Whether `args` hold a numpy array that the trace under way captures (halide_ad/capture.py):
    one used whole, outside hd.compute's function."""
    state = current()
    return state is not None and state.compute_vars is None and any(isinstance(a, np.ndarray) for a in args)


def _unary(name: str, numpy_fn):
    return _elementwise(name, lambda x: call(name, x), numpy_fn)


exp = _unary("exp", np.exp)
log = _unary("log", np.log)
log1p = _unary("log1p", np.log1p)
sqrt = _unary("sqrt", np.sqrt)
rsqrt = _unary("rsqrt", lambda x: 1 / np.sqrt(x))
sin = _unary("sin", np.sin)
cos = _unary("cos", np.cos)
tan = _unary("tan", np.tan)
tanh = _unary("tanh", np.tanh)
erf = _unary("erf", np.vectorize(math.erf))
abs = _unary("abs", np.abs)  # noqa: A001  (hd.abs is the DSL's spelling)
sign = _unary("sign", np.sign)
floor = _unary("floor", np.floor)
ceil = _unary("ceil", np.ceil)
round = _unary("round", np.rint)  # noqa: A001  half to even, as numpy
# x's value with no gradient through it (jax.lax.stop_gradient, torch's detach): for terms whose
# gradient is zero in exact arithmetic (softmax's shift by its maximum), so it is not computed
stop_gradient = _unary("stop_gradient", lambda x: x)
atan2 = _elementwise("atan2", lambda y, x: call("atan2", y, x), np.arctan2)
pow = _elementwise("pow", lambda a, b: a ** b, np.power)  # noqa: A001
sigmoid = _unary("sigmoid", lambda x: 1 / (1 + np.exp(-x)))
relu = _elementwise("relu", lambda x: select(x > 0, x, 0), lambda x: np.maximum(x, 0))  # 0 at 0
where = _elementwise("where", select, np.where)


def _minmax(op: ir.Op):
    return lambda a, b: binary(op, a, b)


maximum = _elementwise("maximum", _minmax(ir.Op.MAX), np.maximum)
minimum = _elementwise("minimum", _minmax(ir.Op.MIN), np.minimum)
clamp = _elementwise("clamp", lambda x, lo, hi: _minmax(ir.Op.MIN)(_minmax(ir.Op.MAX)(x, lo), hi), np.clip)


def cast(x, dtype):
    """`x` converted to `dtype` (a numpy dtype or its name)."""
    try:
        name = np.dtype(dtype).name
    except TypeError:
        raise TraceError(f"hd.cast: {dtype!r} is not a numpy dtype", user_loc()) from None
    if name not in ("float32", "float64", "int64", "int32", "bool"):
        raise TraceError(f"hd.cast to {name} is not supported; use float32, float64, int32, int64 "
                         "or bool", user_loc())
    if is_tensorlike(x):
        return map_elementwise(lambda e: cast(e, name), (x,), f"cast_{name}")
    if isinstance(x, Expr):
        return Expr(ir.cast(name, x.node))
    return np.dtype(name).type(x)


def _reduction(op: str):
    def api(x, axis=None, keepdims=False):
        return reduce(op, x, axis=axis, keepdims=keepdims)
    api.__name__ = op
    api.__doc__ = (f"hd.{op}: on an expression, over the rdom variables in it; on a Tensor, "
                   "numpy-style over `axis`.")
    return api


sum = _reduction("sum")  # noqa: A001
prod = _reduction("prod")
max = _reduction("max")  # noqa: A001
min = _reduction("min")  # noqa: A001
argmax = _reduction("argmax")
argmin = _reduction("argmin")


def mean(x, axis=None, keepdims=False):
    """numpy's mean over `axis` of a Tensor."""
    return x.mean(axis, keepdims)
