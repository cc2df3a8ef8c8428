"""Indices that the interval analysis settles before z3, and float-derived indices that z3 treats as
uninterpreted integers (so their scatters still find a parallel loop)."""
import warnings

import numpy as np
import pytest

import halide_ad as hd
from halide_ad.ir import Bin as binary, Call, Cast, Load, Op, Range, Scatter, Var, const
from halide_ad.solver.bounds import interval
from halide_ad.solver.invert import parallel_var

i, h, w, n = Var("i"), Var("h"), Var("w"), Var("n")


def _float_index(e):
    return Cast("int64", Call("floor", (e,)))


def test_a_clamp_bounds_what_it_clamps():
    anything = _float_index(binary(Op.MUL, Cast("float64", i), const(0.58)))
    clamped = binary(Op.MIN, binary(Op.MAX, anything, const(0)), const(6))
    assert interval(anything, {i: (0, 11)}) is None
    assert interval(clamped, {i: (0, 11)}) == (0, 6)
    assert interval(binary(Op.MIN, binary(Op.ADD, clamped, const(1)), const(6)), {i: (0, 11)}) == (1, 6)
    assert interval(binary(Op.MAX, anything, const(0)), {i: (0, 11)}) is None  # no upper side


H, W, OH, OW = 7, 9, 12, 15


@hd.func
def resize_by_floor(x):
    """Bilinear resize written with float source coordinates and floor, as users write it."""
    def body(i, j):
        fy, fx = (i + 0.5) * (H / OH) - 0.5, (j + 0.5) * (W / OW) - 0.5
        y0 = hd.clamp(hd.cast(hd.floor(fy), "int32"), 0, H - 1)
        x0 = hd.clamp(hd.cast(hd.floor(fx), "int32"), 0, W - 1)
        y1, x1 = hd.minimum(y0 + 1, H - 1), hd.minimum(x0 + 1, W - 1)
        wy, wx = fy - hd.floor(fy), fx - hd.floor(fx)
        return ((1 - wy) * ((1 - wx) * x[y0, x0] + wx * x[y0, x1])
                + wy * ((1 - wx) * x[y1, x0] + wx * x[y1, x1]))
    return hd.compute((OH, OW), body)


def test_floor_indices_are_proved_in_bounds_without_z3_timeouts():
    x = np.random.default_rng(0).random((H, W))
    with warnings.catch_warnings():
        warnings.simplefilter("error", hd.HalideADWarning)  # the z3 time-out warning fails the test
        y = resize_by_floor(x)
    assert y.shape == (OH, OW)
    hd.check_grad(lambda x: hd.sum(resize_by_floor(x) ** 2), x)


def test_a_float_derived_index_scatters_in_parallel():
    """U[n, c, clamp(int(floor(v[n, h, w]))), w]: the row is data, but distinct (n, w) write distinct
    addresses whatever it is, and z3 proves that with the row as an uninterpreted integer."""
    row = binary(Op.MIN, binary(Op.MAX, _float_index(Load("v", (n, h, w), "float64")), const(0)), const(4))
    scatter = Scatter("adj_U", (n, row, w), const(1.0),
                      (Range(n, 0, 2), Range(h, 0, 5), Range(w, 0, 6)))
    assert parallel_var(scatter) in (n, w)
    same_point = Scatter("adj_U", (row,), const(1.0), (Range(n, 0, 2), Range(h, 0, 5), Range(w, 0, 6)))
    assert parallel_var(same_point) is None  # every point may write the same row: no parallel loop


N, C, SH, SW = 2, 3, 5, 6


@hd.func
def sample_rows(U, v):
    return hd.compute((N, C, SH, SW), lambda n, c, h, w:
                      U[n, c, hd.clamp(hd.cast(hd.floor(v[n, h, w]), "int64"), 0, SH - 1), w])


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_float_derived_index_gradient(dtype):
    rng = np.random.default_rng(1)
    U = rng.random((N, C, SH, SW)).astype(dtype)
    v = (rng.random((N, SH, SW)) * 7 - 1).astype(dtype)  # rows below 0 and past the end clamp
    weights = rng.random((N, C, SH, SW)).astype(dtype)
    loss = lambda U, v, weights: hd.sum(sample_rows(U, v) * weights)  # noqa: E731
    g = hd.grad(loss)(U, v, weights)
    rows = np.clip(np.floor(v), 0, SH - 1).astype(int)
    expected = np.zeros_like(U)
    for n_, c_, h_, w_ in np.ndindex(N, C, SH, SW):
        expected[n_, c_, rows[n_, h_, w_], w_] += weights[n_, c_, h_, w_]
    np.testing.assert_allclose(g, expected, rtol=1e-6)
    assert "scatter-parallel" in str(hd.explain(loss, U, v, weights))
    if dtype == "float64":
        hd.check_grad(lambda U, v: hd.sum(sample_rows(U, v) ** 2), U, v)  # v: floor, zero gradient
