"""halide_ad: differentiate array programs written as index expressions, and compile the forward
program and its gradient into parallel numba kernels (gathers, not racy scatters).

The names below load on first use, so that `import halide_ad.ir` (the IR, reverse mode, the
affine algebra) needs neither numba nor z3.
"""
import importlib

__version__ = "0.1.0"

_EXPORTS = {
    "halide_ad.errors": ("BoundsError", "DTypeError", "HalideADError", "HalideADWarning", "InternalError",
                         "NotDifferentiableError", "ShapeError", "TraceError"),
    "halide_ad.expr": ("Expr",),
    "halide_ad.tensor": ("BoundaryView", "Tensor", "compute", "constant_exterior", "full", "mirror",
                         "repeat_edge", "zeros"),
    "halide_ad.stages": ("rdom",),
    "halide_ad.functions": ("abs", "argmax", "argmin", "atan2", "cast", "ceil", "clamp", "cos", "erf", "exp",
                            "floor", "log", "log1p", "max", "maximum", "mean", "min", "minimum", "pow", "prod",
                            "relu", "round", "rsqrt", "sigmoid", "sign", "sin", "sqrt", "stop_gradient", "sum",
                            "tan", "tanh", "where"),
    "halide_ad.api": ("Function", "func"),
    "halide_ad.transforms": ("grad", "value_and_grad", "vjp"),
    "halide_ad.explanation": ("explain",),
    "halide_ad.updates": ("var",),
    "halide_ad.check": ("check_grad",),
    "halide_ad.forward": ("jacfwd", "jvp"),
    "halide_ad.custom": ("custom_jvp", "custom_vjp"),
    "halide_ad.compose": ("adjoints", "checkpoint", "hessian", "jacobian", "jacrev"),
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}
# (no name here may be a submodule's as well: importing `halide_ad.<name>` would set the attribute
# to the module, past __getattr__; tests/test_imports.py checks it)


def __getattr__(name: str):
    if name not in _MODULE_OF:
        raise AttributeError(f"module 'halide_ad' has no attribute {name!r}")
    value = getattr(importlib.import_module(_MODULE_OF[name]), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__():
    return sorted(set(globals()) | set(_MODULE_OF))


__all__ = sorted(_MODULE_OF)
