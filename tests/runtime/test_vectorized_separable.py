"""The interpreter's separable windows (runtime/vectorized_separable.py): which Funcs and scatters
run as two passes, and their values and gradients against the reference interpreter's at the
edges (size-1 axes, indices clamped at both ends, views), in float32 and float64."""
import numpy as np
import pytest

import halide_ad as hd
from halide_ad.ad import reverse_mode
from halide_ad.api import as_function
from halide_ad.runtime import reference, vectorized_separable as separable
from tests import programs as P
from tests.runtime.test_vectorized import _assert_one


def _splits(fn, args):
    """({Func name: the first pass's shape}, {adjoint buffer: the temporary's shape}) of the
    Funcs and adjoints of fn at args that run as two passes."""
    traced, arrays = as_function(fn).trace(tuple(args), {})
    program = traced.program
    shapes = {k: np.shape(v) for k, v in (arrays | reference.evaluate(program, arrays)).items()}
    funcs = {f.name: passes[0].shape for f in program.funcs if (passes := separable.split_func(f, shapes))}
    scatters = {a.buffer: passes[1] for a in reverse_mode(program, traced.float_args)
                if a.scatters and (passes := separable.split_scatters(a.scatters, a.shape))}
    return funcs, scatters


@hd.func
def separable_conv(x, a, b):
    """A 3x3 window of weights a[r] * b[s] over a repeat_edge image: the weights are loads."""
    e = hd.repeat_edge(x)
    r, s = hd.rdom(3, 3)
    return hd.compute(x.shape, lambda i, j: hd.sum(a[r] * b[s] * e[i + r - 1, j + s - 1]), name="sep")


@hd.func
def cross(x):
    """The four taps of a plus sign: four of the nine pairings of a row tap with a column tap,
    weights not of rank one."""
    e = hd.repeat_edge(x)
    return hd.compute(x.shape, lambda i, j: e[i - 1, j] + e[i + 1, j] + e[i, j - 1] + e[i, j + 1], name="cross")


@hd.func
def diagonal(x):
    """Taps whose row index reads j: the axes share a variable."""
    e = hd.repeat_edge(x)
    return hd.compute(x.shape, lambda i, j: e[i + j, j] + e[i, j + 1] + e[i + 1, j] + e[i + 1, j + 1], name="diag")


def test_which_windows_run_as_two_passes():
    from benchmarks.cases import CASES
    cases = {c.name: c for c in CASES}
    # the bilinear resize: rows first, into (N, C, 2H, W); its gradient's columns first, into the same shape
    funcs, scatters = _splits(cases["bilinear"].halide_ad, cases["bilinear"].make_inputs(small=True))
    assert funcs == {"resize_bilinear2x": (2, 3, 20, 14)} and scatters == {"x": (2, 3, 20, 14)}
    funcs, scatters = _splits(cases["pipeline"].halide_ad, cases["pipeline"].make_inputs(small=True))
    assert funcs == {"blur3x3_nchw_sum": (2, 3, 10, 14)} and scatters == {"x": (2, 3, 10, 14)}
    rng = np.random.default_rng(0)
    x = rng.standard_normal((6, 7))
    assert _splits(separable_conv, (x, rng.standard_normal(3), rng.standard_normal(3))) == ({"sep": (6, 7)},
                                                                                             {"x": (6, 7)})
    for fn in (cross, diagonal):
        assert _splits(fn, (x,)) == ({}, {})
    for name in ("conv2d", "maxpool", "avgpool", "upsample"):  # (a 3x3/2 average: two passes would cost more)
        assert _splits(cases[name].halide_ad, cases[name].make_inputs(small=True)) == ({}, {}), name


def test_skip_turns_the_passes_off(monkeypatch):
    monkeypatch.setenv("HALIDE_AD_SKIP", "separable_window")
    assert _splits(P.blur2d, (np.ones((4, 5)), "repeat_edge")) == ({}, {})


def test_the_cost_model_counts_the_two_passes(monkeypatch):
    """vectorized_cost plans by `split_func` and `scatter_plan`: 3 + 3 taps a point, not 9."""
    from benchmarks.cases import blur_relu_maxpool
    from tests.runtime.test_vectorized import _passes
    shape = (2, 8, 64, 64)
    forward, gradient = _passes(blur_relu_maxpool, shape)
    monkeypatch.setenv("HALIDE_AD_SKIP", "separable_window")
    taps_forward, taps_gradient = _passes(blur_relu_maxpool, shape)
    points = np.prod(shape)
    assert 3 * points <= taps_forward - forward and 3 * points <= taps_gradient - gradient


SHAPES = [((1, 1), None),                          # one pixel: every tap clamps to it, at both ends
          ((1, 6), None), ((5, 1), None),          # a size-1 axis
          ((6, 5), lambda a: a.T),                 # a transposed view
          ((5, 14), lambda a: a[:, ::-2])]         # a reversed strided view


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape, layout", SHAPES)
def test_two_passes_equal_the_reference_at_the_edges(shape, layout, dtype):
    """A Reduce window (a blur), a sum of taps (a bilinear resize), weights that are loads (a
    separable convolution, its gradients by the weights too): values and gradients."""
    from benchmarks.cases import resize_bilinear2x
    rng = np.random.default_rng(8)
    x = (layout or np.asarray)(rng.standard_normal(shape).astype(dtype))
    a, b = rng.standard_normal((2, 3)).astype(dtype)
    tol = 2e-6 if dtype == np.float32 else 1e-12
    for fn, args in ((P.blur2d, (x, "repeat_edge")), (separable_conv, (x, a, b)),
                     (resize_bilinear2x, (x[None, None],))):
        funcs, scatters = _splits(fn, args)
        assert funcs and scatters, fn  # (the two passes run)
        _assert_one(fn, args, tol, "separable")


@pytest.mark.parametrize("fn", [cross, diagonal])
def test_windows_not_of_rank_one_run_their_taps(fn):
    _assert_one(fn, (np.random.default_rng(9).standard_normal((5, 6)),), 1e-12, "separable")
