"""halide_ad: differentiate array programs written as index expressions, and compile the forward
program and its gradient into parallel numba kernels (gathers, not racy scatters)."""
__version__ = "0.1.0"

from halide_ad.errors import (BoundsError, DTypeError, HalideADError, HalideADWarning, InternalError,
                              NotDifferentiableError, ShapeError, TraceError)
from halide_ad.expr import Expr
from halide_ad.tensor import BoundaryView, Tensor, compute, rdom
from halide_ad.functions import (abs, argmax, argmin, atan2, cast, ceil, clamp, cos, erf, exp, floor, log,
                                 log1p, max, maximum, mean, min, minimum, pow, prod, relu, round, rsqrt,
                                 sigmoid, sign, sin, sqrt, stop_gradient, sum, tan, tanh, where)
from halide_ad.api import Function, func, grad, value_and_grad, vjp
from halide_ad.checkpoint import checkpoint
from halide_ad.compose import adjoints, hessian, jacobian, jacrev
from halide_ad.explain import explain
from halide_ad.check import check_grad


def repeat_edge(t: Tensor) -> BoundaryView:
    """A view of `t` that any integer index may read: out-of-range indices clamp to the edge."""
    return BoundaryView(t, "repeat_edge")


def constant_exterior(t: Tensor, value=0.0) -> BoundaryView:
    """A view of `t` that reads `value` outside its bounds."""
    return BoundaryView(t, "constant_exterior", value)


def mirror(t: Tensor) -> BoundaryView:
    """A view of `t` reflected at its edges without repeating them (numpy's 'reflect',
    Halide's mirror_interior)."""
    return BoundaryView(t, "mirror")


__all__ = [
    "BoundaryView", "BoundsError", "DTypeError", "Expr", "Function", "HalideADError", "HalideADWarning",
    "InternalError", "NotDifferentiableError", "ShapeError", "Tensor", "TraceError", "abs", "adjoints",
    "argmax", "argmin", "atan2", "cast", "ceil", "check_grad", "checkpoint", "clamp", "compute",
    "constant_exterior", "cos", "erf", "exp", "explain", "floor", "func", "grad", "hessian", "jacobian",
    "jacrev", "log", "log1p", "max", "maximum", "mean", "min", "minimum", "mirror", "pow", "prod", "rdom",
    "relu", "repeat_edge", "round", "rsqrt", "sigmoid", "sign", "sin", "sqrt", "stop_gradient", "sum",
    "tan", "tanh", "value_and_grad", "vjp", "where",
]
