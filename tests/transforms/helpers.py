"""Shared checks for the transformations: forward mode against finite differences (float64) and
against torch.func.jvp."""
from __future__ import annotations

import numpy as np
import pytest

import halide_ad as hd
from halide_ad.trees import flatten_values


def random_tangents(args, rng) -> tuple:
    """A random tangent for each float array argument, None for the rest."""
    return tuple(rng.standard_normal(a.shape).astype(a.dtype) if _is_float(a) else None for a in args)


def _is_float(a) -> bool:
    return isinstance(a, np.ndarray) and a.dtype.kind == "f"


def finite_difference(fn, args, tangents, eps: float = 1e-6) -> list[np.ndarray]:
    """(f(x + eps t) - f(x - eps t)) / 2 eps, output by output."""
    f = hd.api.as_function(fn)
    plus = [a + eps * t if t is not None else a for a, t in zip(args, tangents, strict=True)]
    minus = [a - eps * t if t is not None else a for a, t in zip(args, tangents, strict=True)]
    return [(p - m) / (2 * eps) for p, m in zip(flatten_values(f(*plus)), flatten_values(f(*minus)), strict=True)]


def check_jvp(fn, *args, torch_fn=None, seed: int = 0, fd: bool = True, rtol: float = 1e-9, atol: float = 1e-11):
    """hd.jvp(fn) agrees with fn itself (primal), with central differences (fd) and with
    torch.func.jvp(torch_fn) over the float arguments (torch_fn takes those only, as tensors).
    Returns (out, tangent_out)."""
    rng = np.random.default_rng(seed)
    tangents = random_tangents(args, rng)
    out, tangent_out = hd.jvp(fn, args, tangents)
    outs, touts = flatten_values(out), flatten_values(tangent_out)
    for o, ref in zip(outs, flatten_values(hd.api.as_function(fn)(*args)), strict=True):
        np.testing.assert_array_equal(o, ref)
    for t, o in zip(touts, outs, strict=True):
        assert t.shape == o.shape and t.dtype == o.dtype
    if fd:
        for t, numeric in zip(touts, finite_difference(fn, args, tangents), strict=True):
            np.testing.assert_allclose(t, numeric, rtol=1e-5, atol=1e-7, err_msg="jvp against finite differences")
    if torch_fn is not None:
        torch = pytest.importorskip("torch")
        floats = [k for k, a in enumerate(args) if _is_float(a)]
        _, reference = torch.func.jvp(torch_fn, tuple(torch.tensor(args[k]) for k in floats),
                                      tuple(torch.tensor(tangents[k]) for k in floats))
        refs = reference if isinstance(reference, (tuple, list)) else [reference]
        for t, ref in zip(touts, refs, strict=True):
            np.testing.assert_allclose(t, ref.numpy(), rtol=rtol, atol=atol, err_msg="jvp against torch.func.jvp")
    return out, tangent_out
