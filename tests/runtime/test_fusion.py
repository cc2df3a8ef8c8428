"""Forward fusion (runtime/inline.py): which Funcs the forward computes where they are read, and
that values and gradients are unchanged (against numpy, PyTorch and finite differences)."""
import re

import numpy as np
import pytest

import halide_ad as hd
from halide_ad import ops
from halide_ad import ad, compiler
from halide_ad.api import CALL, as_function


def _stored(fn, *args) -> set[str]:
    """The Funcs the forward kernel writes."""
    traced, arrays = as_function(fn).trace(args, {})
    return {f.name for f in traced.program.funcs} & set(traced.run(arrays))


def _funcs(fn, *args) -> set[str]:
    traced, _ = as_function(fn).trace(args, {})
    return {f.name for f in traced.program.funcs}


@hd.func
def box_mean(x):
    r, s = hd.rdom(3, 3)
    return hd.compute((x.shape[0] - 2, x.shape[1] - 2), lambda i, j: hd.sum(x[i + r, j + s]) / 9, name="box")


@hd.func
def sum_of_squares(x):
    return ops.sum(x * x)


@hd.func
def pooled_relu(x):
    return ops.max_pool2d(ops.relu(x), 2)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_sum_and_its_scaling_are_one_pass(rng, dtype):
    x = rng.standard_normal((7, 9)).astype(dtype)
    assert _stored(box_mean, x) == {"box"} and _funcs(box_mean, x) == {"box", "box_sum"}
    explained = hd.explain(box_mean, x)
    assert explained.fused == ("box_sum",)
    listing = str(explained)
    assert re.search(r"box_sum\[i, j\] = sum\(.*\[not stored: computed where it is read\]", listing), listing
    want = sum(x[r:r + 5, s:s + 7] for r in range(3) for s in range(3)) / 9
    np.testing.assert_allclose(box_mean(x), want, rtol=1e-6 if dtype == np.float32 else 1e-13)
    if dtype == np.float64:
        hd.check_grad(box_mean, x)


def test_squares_are_summed_where_they_are_made(rng):
    x = rng.standard_normal((6, 5))
    assert _stored(sum_of_squares, x) == {"f_sum"}, hd.explain(sum_of_squares, x).forward_source
    np.testing.assert_allclose(sum_of_squares(x), (x * x).sum(), rtol=1e-13)
    (g,) = hd.vjp(sum_of_squares, x)[1](np.float64(1.5))
    np.testing.assert_allclose(g, 3 * x, rtol=1e-13)


def test_a_cheap_pointwise_func_is_recomputed_per_tap(rng):
    x = rng.standard_normal((2, 3, 6, 8))
    stored = _stored(pooled_relu, x)
    assert not any("relu" in name for name in stored), stored
    torch = pytest.importorskip("torch")
    tx = torch.tensor(x, requires_grad=True)
    ty = torch.nn.functional.max_pool2d(torch.relu(tx), 2)
    out, f_vjp = hd.vjp(pooled_relu, x)
    ct = rng.standard_normal(out.shape)
    (tg,) = torch.autograd.grad(ty, tx, torch.tensor(ct))
    np.testing.assert_allclose(out, ty.detach().numpy(), rtol=1e-13)
    np.testing.assert_allclose(f_vjp(ct)[0], tg.numpy(), rtol=1e-13)


def test_what_a_gradient_reads_is_stored(rng):
    @hd.func
    def softplus_sum(x):  # d exp(x) is exp(x): the gradient reads the stored exp
        e = hd.compute(x.shape, lambda i: hd.exp(x[i]), name="e")
        return ops.sum(ops.log(e + 1.0))

    x = rng.standard_normal(40)
    assert "e" in _stored(softplus_sum, x)
    np.testing.assert_allclose(softplus_sum(x), np.log1p(np.exp(x)).sum(), rtol=1e-13)
    hd.check_grad(softplus_sum, x)


def test_a_plain_call_runs_no_reverse_mode_and_stores_only_its_outputs(rng, monkeypatch):
    """The forward a gradient runs after keeps `e` for it; a plain call's forward, compiled
    without reverse mode, computes exp where log reads it."""
    @hd.func
    def softplus_sum(x):
        e = hd.compute(x.shape, lambda i: hd.exp(x[i]), name="e")
        return ops.sum(ops.log(e + 1.0))

    monkeypatch.setenv("HALIDE_AD_TIERED", "0")  # the kernels' buffers, not the interpreter's
    x = rng.standard_normal(40)
    traced, arrays = as_function(softplus_sum).trace((x,), {})

    def no_reverse_mode(*args):
        raise AssertionError("a plain call's forward ran reverse mode")

    with monkeypatch.context() as patched:
        patched.setattr(ad, "reverse_mode", no_reverse_mode)
        patched.setattr(compiler, "reverse_mode", no_reverse_mode)
        buffers = traced.run(arrays, CALL)
    assert "e" not in buffers
    np.testing.assert_allclose(traced.outputs(buffers), np.log1p(np.exp(x)).sum(), rtol=1e-13)
    assert "e" in traced.run(arrays)
    np.testing.assert_allclose(softplus_sum(x), np.log1p(np.exp(x)).sum(), rtol=1e-13)
    hd.check_grad(softplus_sum, x)


def test_funcs_stay_stored_for_blas_maxima_two_readers_and_outputs(rng):
    @hd.func
    def net(x, w, b):
        h = ops.relu(ops.dense(x, w, b))  # BLAS sums the product (20 terms), then the bias is added
        top = ops.max(h, axis=1)  # a max keeps its argmax for the gradient
        shared = hd.compute(h.shape, lambda i, j: h[i, j] * 2.0, name="shared")
        return top * 3.0, ops.sum(shared) + ops.mean(shared), h

    x, w, b = rng.standard_normal((4, 20)), rng.standard_normal((6, 20)), rng.standard_normal(6)
    stored = _stored(net, x, w, b)
    assert {"dense", "relu", "shared", "f_max"} <= stored, stored
    assert "by BLAS" in hd.explain(net, x, w, b).forward_source
    h = np.maximum(x @ w.T + b, 0)
    got = net(x, w, b)
    np.testing.assert_allclose(got[0], 3 * h.max(axis=1), rtol=1e-13)
    np.testing.assert_allclose(got[1], 2 * h.sum() + 2 * h.mean(), rtol=1e-13)
    np.testing.assert_allclose(got[2], h, rtol=1e-13)
    hd.check_grad(lambda x, w, b: net(x, w, b)[1], x, w, b)


def test_an_inlined_sum_keeps_its_variables_apart_from_the_readers(rng):
    @hd.func
    def shifted(x):
        k = hd.rdom(3)
        inner = hd.compute((x.shape[0], x.shape[1] - 2), lambda i, j: hd.sum(x[i, j + k]), name="inner")
        return hd.compute(inner.shape, lambda i, r: inner[i, r] * 2.0, name="outer")

    x = rng.standard_normal((3, 7))
    assert _stored(shifted, x) == {"outer"}
    want = 2 * (x[:, :-2] + x[:, 1:-1] + x[:, 2:])
    np.testing.assert_allclose(shifted(x), want, rtol=1e-13)
    hd.check_grad(shifted, x)


def test_a_func_read_at_a_data_dependent_index_stays_stored():
    @hd.func
    def pick(x, idx):
        f = hd.compute((5,), lambda j: x[j] * 2.0, name="f")
        return hd.compute(idx.shape, lambda i: f[idx[i]], name="picked")

    x = np.arange(10.0)
    np.testing.assert_array_equal(pick(x, np.array([0, 4, 2])), [0.0, 8.0, 4.0])
    # 7 is inside x but outside f: inlined, f's read of x[7] would pass its check
    with pytest.raises(hd.BoundsError, match="outside dimension 0 of f"):
        pick(x, np.array([0, 4, 7]))


def test_a_window_recomputes_only_cheap_funcs(rng):
    @hd.func
    def windows(x):
        r, s = hd.rdom(3, 3)
        wave = hd.compute(x.shape, lambda i, j: hd.sin(x[i, j]), name="wave")  # a math call: costly
        clipped = hd.compute(x.shape, lambda i, j: hd.maximum(x[i, j], 0.0), name="clipped")
        shape = (x.shape[0] - 2, x.shape[1] - 2)
        return (hd.compute(shape, lambda i, j: hd.sum(wave[i + r, j + s]), name="smooth_wave"),
                hd.compute(shape, lambda i, j: hd.sum(clipped[i + r, j + s]), name="smooth_clipped"))

    x = rng.standard_normal((8, 9))
    stored = _stored(windows, x)
    assert "wave" in stored and "clipped" not in stored, stored
    got = windows(x)
    for out, inner in zip(got, (np.sin(x), np.maximum(x, 0)), strict=True):
        want = sum(inner[r:r + 6, s:s + 7] for r in range(3) for s in range(3))
        np.testing.assert_allclose(out, want, rtol=1e-13)
    hd.check_grad(lambda x: windows(x)[0] + windows(x)[1], x + 0.01)  # (no kink of the max at 0)


def test_one_cost_model_counts_a_windows_taps_on_both_sides(rng):
    """A value recomputed at each of a window's taps is weighed by taps x operations, forward and
    backward alike: a relu (one operation) under a 5x5 window is recomputed, and so is the
    average's adjoint `adj * (1/25)` under the gradient's 5x5 window."""
    @hd.func
    def blur5_relu(x):
        r, s = hd.rdom(5, 5)
        clipped = hd.compute(x.shape, lambda i, j: hd.maximum(x[i, j], 0.0), name="clipped")
        shape = (x.shape[0] - 4, x.shape[1] - 4)
        return hd.compute(shape, lambda i, j: hd.sum(clipped[i + r, j + s]) / 25, name="blurred")

    x = rng.standard_normal((24, 24))
    assert "clipped" not in _stored(blur5_relu, x)
    traced, _ = as_function(blur5_relu).trace((x,), {})
    plans = compiler.plan_gradient(traced.program, ("x",))
    assert [p.adjoint.buffer for p in plans if p.inlined] == ["blurred_sum"]
    clipped = np.maximum(x, 0)
    want = sum(clipped[r:r + 20, s:s + 20] for r in range(5) for s in range(5)) / 25
    np.testing.assert_allclose(blur5_relu(x), want, rtol=1e-13)
    hd.check_grad(blur5_relu, x + 0.01)


def _smoothness(x):
    return hd.sum((x[1:] - x[:-1]) ** 2) + hd.sum(x * x * x)


@hd.func
def smoothness_gradient(x):
    return hd.grad(_smoothness)(x)


def test_the_copy_a_gradient_taken_while_tracing_makes_is_read_from_its_argument(rng):
    x = rng.standard_normal(9)
    assert "x_arg" in _funcs(smoothness_gradient, x)  # the copy that the gradient differentiates
    traced, arrays = as_function(smoothness_gradient).trace((x,), {})
    assert "x_arg" not in traced.run(arrays, CALL)  # read by several Funcs, stored by none
    d = x[1:] - x[:-1]
    want = 3 * x * x
    want[1:] += 2 * d
    want[:-1] -= 2 * d
    np.testing.assert_allclose(smoothness_gradient(x), want, rtol=1e-13)
