"""`hd.check_grad`: gradients against central finite differences, in float64, without a Jacobian."""
from __future__ import annotations

import numpy as np

from halide_ad.errors import DTypeError


def check_grad(fn, *args, eps: float = 1e-6, rtol: float = 1e-5, atol: float = 1e-8,
               directions: int = 3, seed: int = 0, order: int = 1) -> float:
    """Check <t, vjp(c)> == <(f(x + eps t) - f(x - eps t)) / 2 eps, c> along random directions t.

    Float arguments are promoted to float64. With `order=2` (or more) the same check runs again on
    the first-order function `(x, c) -> vjp(c)`, traced as a program of its own (a gradient of a
    gradient, reverse over reverse), as `jax.test_util.check_grads`. Returns the worst relative
    error; raises AssertionError describing the worst mismatch.
    """
    if not isinstance(order, int) or order < 1:
        raise ValueError(f"check_grad's order must be a positive int, got {order!r}")
    from halide_ad.api import _flatten_values, vjp
    args = tuple(a.astype(np.float64) if isinstance(a, np.ndarray) and a.dtype.kind == "f" else a for a in args)
    float_args = [k for k, a in enumerate(args) if isinstance(a, np.ndarray) and a.dtype.kind == "f"]
    if not float_args:
        got = ", ".join(str(a.dtype) if isinstance(a, np.ndarray) else type(a).__name__ for a in args)
        raise DTypeError(f"check_grad needs at least one float32 or float64 array argument, got {got or 'none'}")
    rng = np.random.default_rng(seed)
    out, vjp_fn = vjp(fn, *args)
    outs = _flatten_values(out)
    cts = [rng.standard_normal(o.shape) for o in outs]
    grads = vjp_fn(_restructure(out, cts))
    worst = (0.0, None)
    for d in range(directions):
        t = {k: rng.standard_normal(args[k].shape) for k in float_args}
        shifted = [list(args), list(args)]
        for k in float_args:
            shifted[0][k] = args[k] + eps * t[k]
            shifted[1][k] = args[k] - eps * t[k]
        plus = _flatten_values(_call(fn, shifted[0]))
        minus = _flatten_values(_call(fn, shifted[1]))
        numeric = sum(np.vdot((p - m) / (2 * eps), c) for p, m, c in zip(plus, minus, cts, strict=True))
        analytic = sum(np.vdot(t[k], grads[k]) for k in float_args)
        err = abs(numeric - analytic)
        tol = atol + rtol * max(abs(numeric), abs(analytic))
        rel = err / max(abs(numeric), abs(analytic), 1e-300)
        if rel >= worst[0]:
            worst = (rel, (d, numeric, analytic, err, tol))
        if err > tol:
            raise AssertionError(f"gradient mismatch along random direction {d}: finite differences "
                                 f"give {numeric!r}, the gradient gives {analytic!r} "
                                 f"(|difference| {err:.3g} > tolerance {tol:.3g})")
    if order == 1:
        return worst[0]
    count = len(args)

    def first_order(*inputs):  # the arguments, then the cotangents: both differentiated
        _, pull = vjp(fn, *inputs[:count])
        return tuple(g for g in pull(_restructure(out, inputs[count:])) if g is not None)

    first_order.__name__ = f"vjp_of_{getattr(fn, '__name__', 'fn')}"
    return max(worst[0], check_grad(first_order, *args, *cts, eps=eps, rtol=rtol, atol=atol,
                                    directions=directions, seed=seed + 1, order=order - 1))


def _call(fn, args):
    from halide_ad.api import as_function
    return as_function(fn)(*args)


def _restructure(out, leaves):
    """`leaves` arranged in the structure of `out`."""
    it = iter(leaves)

    def go(o):
        if isinstance(o, np.ndarray):
            return next(it)
        if isinstance(o, dict):
            return {k: go(v) for k, v in o.items()}
        return type(o)(go(v) for v in o)
    return go(out)
