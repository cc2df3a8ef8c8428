"""`hd.check_grad`: derivatives against central finite differences, in float64, without a Jacobian."""
from __future__ import annotations

import numpy as np

from halide_ad.api import as_function
from halide_ad.trees import flatten_values, restructure
from halide_ad.transforms import vjp
from halide_ad.errors import DTypeError, NotDifferentiableError
from halide_ad.forward import jvp

MODES = ("rev", "fwd")


def check_grad(fn, *args, modes=MODES, order: int = 1, eps: float = 1e-6, rtol: float = 1e-5,
               atol: float = 1e-8, directions: int = 3, seed: int = 0) -> float:
    """Check fn's derivatives along random directions t, as jax.test_util.check_grads:

    * "rev": <t, vjp(c)> == <(f(x + eps t) - f(x - eps t)) / 2 eps, c> for a random cotangent c;
    * "fwd": <jvp(t), c> == the same finite difference.

    `order=2` also checks the derivative of the forward-mode derivative, x -> jvp(f, x, t1), in each
    mode (forward over forward, reverse over forward), and with "rev" the first-order function
    `(x, c) -> vjp(c)`, traced as a program of its own (reverse over reverse). Float arguments are
    promoted to float64. Returns the worst relative error; raises AssertionError describing the
    worst mismatch.
    """
    modes = (modes,) if isinstance(modes, str) else tuple(modes)
    unknown = [m for m in modes if m not in MODES]
    if unknown or not modes:
        raise NotDifferentiableError(f"check_grad: modes={modes!r}; choose from {MODES}")
    if order not in (1, 2):
        raise NotDifferentiableError(f"check_grad: order={order!r}; orders 1 and 2 are checked")
    args = tuple(a.astype(np.float64) if isinstance(a, np.ndarray) and a.dtype.kind == "f" else a for a in args)
    float_args = [k for k, a in enumerate(args) if isinstance(a, np.ndarray) and a.dtype.kind == "f"]
    if not float_args:
        got = ", ".join(str(a.dtype) if isinstance(a, np.ndarray) else type(a).__name__ for a in args)
        raise DTypeError(f"check_grad needs at least one float32 or float64 array argument, got {got or 'none'}")
    rng = np.random.default_rng(seed)
    worst = 0.0
    for mode in modes:
        worst = max(worst, _check(fn, args, float_args, mode, rng, eps, rtol, atol, directions, ""))
    if order == 2:
        t1 = [rng.standard_normal(args[k].shape) if k in float_args else None for k in range(len(args))]

        def derivative(*a):
            return jvp(fn, a, tuple(t1))[1]
        for mode in modes:
            worst = max(worst, _check(derivative, args, float_args, mode, rng, eps, rtol, atol, directions,
                                      " of the derivative x -> jvp(fn, x, t1)"))
        if "rev" in modes:
            cts = _cotangents(fn, args, rng)
            both = float_args + list(range(len(args), len(args) + len(cts)))
            worst = max(worst, _check(_first_order(fn, args), args + tuple(cts), both, "rev", rng, eps, rtol,
                                      atol, directions, " of the first-order function (x, c) -> vjp(c)"))
    return worst


def _cotangents(fn, args, rng) -> list[np.ndarray]:
    return [rng.standard_normal(o.shape) for o in flatten_values(_call(fn, args))]


def _first_order(fn, args):
    """(x, c) -> the gradients vjp(c) of fn at x: the arguments, then the cotangents, both
    differentiated (a gradient of a gradient, traced as one program)."""
    count = len(args)
    out = _call(fn, args)

    def first_order(*inputs):
        _, pull = vjp(fn, *inputs[:count])
        return tuple(g for g in pull(restructure(out, inputs[count:])) if g is not None)
    first_order.__name__ = f"vjp_of_{getattr(fn, '__name__', 'fn')}"
    return first_order


def _check(fn, args, float_args, mode, rng, eps, rtol, atol, directions, what) -> float:
    out, vjp_fn = vjp(fn, *args) if mode == "rev" else (_call(fn, args), None)
    outs = flatten_values(out)
    cts = [rng.standard_normal(o.shape) for o in outs]
    grads = vjp_fn(restructure(out, cts)) if mode == "rev" else None
    worst = (0.0, None)
    for d in range(directions):
        t = {k: rng.standard_normal(args[k].shape) for k in float_args}
        shifted = [list(args), list(args)]
        for k in float_args:
            shifted[0][k] = args[k] + eps * t[k]
            shifted[1][k] = args[k] - eps * t[k]
        plus = flatten_values(_call(fn, shifted[0]))
        minus = flatten_values(_call(fn, shifted[1]))
        numeric = sum(np.vdot((p - m) / (2 * eps), c) for p, m, c in zip(plus, minus, cts, strict=True))
        if mode == "rev":
            analytic = sum(np.vdot(t[k], grads[k]) for k in float_args)
        else:
            tangents = tuple(t.get(k) for k in range(len(args)))
            analytic = sum(np.vdot(j, c) for j, c in zip(flatten_values(jvp(fn, args, tangents)[1]), cts,
                                                         strict=True))
        err = abs(numeric - analytic)
        tol = atol + rtol * max(abs(numeric), abs(analytic))
        rel = err / max(abs(numeric), abs(analytic), 1e-300)
        if rel >= worst[0]:
            worst = (rel, (d, numeric, analytic, err, tol))
        if err > tol:
            name = "gradient" if mode == "rev" else "forward-mode derivative (jvp)"
            raise AssertionError(f"{name}{what} mismatch along random direction {d}: finite differences "
                                 f"give {numeric!r}, the {name} gives {analytic!r} "
                                 f"(|difference| {err:.3g} > tolerance {tol:.3g})")
    return worst[0]


def _call(fn, args):
    return as_function(fn)(*args)
