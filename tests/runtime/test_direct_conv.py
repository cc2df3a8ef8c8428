"""Direct SIMD convolution kernels (`runtime/engines/direct_conv.py`): the forward and both gradients
against numpy's einsum in float64, finite differences and PyTorch, at shapes that exercise the
blocks' edges: channels and widths that do not fill the last block, spare taps, a kernel stored
in another axis order, a scale, a second contribution added to an adjoint, float32 and float64."""
import numpy as np
import pytest
from numba import njit

import halide_ad as hd
from halide_ad import config
from halide_ad.compiler import engine_choices, plan_gradient
from halide_ad.runtime.contract import Contraction
from halide_ad.runtime.engines import direct_conv, simd
from halide_ad.runtime.route import engines

DIRECT = "[computed by a direct convolution kernel]"
# The kernels' vector intrinsics exist only compiled: under HALIDE_AD_JIT=0 convolutions keep BLAS
# (test_plain_python_kernels_keep_blas), and the tests that look for the kernels do not apply.
compiled_only = pytest.mark.skipif(not config.jit_enabled(), reason="HALIDE_AD_JIT=0: no direct kernels")


@pytest.fixture(autouse=True)
def direct_at_any_size(monkeypatch):
    """The kernels serve only big convolutions by default (MIN_WORK); these shapes are small."""
    monkeypatch.setattr(direct_conv, "MIN_WORK", 0)


@hd.func
def conv(x, w):
    N, C, H, W = x.shape
    K, _, R, S = w.shape
    c, r, s = hd.rdom(C, R, S)
    return hd.compute((N, K, H - R + 1, W - S + 1),
                      lambda n, k, i, j: hd.sum(x[n, c, i + r, j + s] * w[k, c, r, s]))


@hd.func
def conv_hwio_scaled(x, w):
    """The kernel stored (R, S, C, K), as TensorFlow stores it, and the sum scaled."""
    N, C, H, W = x.shape
    R, S, _, K = w.shape
    c, r, s = hd.rdom(C, R, S)
    return hd.compute((N, K, H - R + 1, W - S + 1),
                      lambda n, k, i, j: hd.sum(x[n, c, i + r, j + s] * w[r, s, c, k]) / 4)


@hd.func
def two_convs(x, w, v, sh, sw):
    """x's gradient gets two contributions (the second adds to the first), as does v's."""
    a = conv_strided(x, w, sh, sw)
    b = conv_strided(x, v, sh, sw)
    return hd.compute(a.shape, lambda n, k, i, j: a[n, k, i, j] * b[n, k, i, j] + b[n, k, i, j])


@hd.func
def conv_strided(x, w, sh, sw):
    N, C, H, W = x.shape
    K, _, R, S = w.shape
    c, r, s = hd.rdom(C, R, S)
    return hd.compute((N, K, (H - R) // sh + 1, (W - S) // sw + 1),
                      lambda n, k, i, j: hd.sum(x[n, c, sh * i + r, sw * j + s] * w[k, c, r, s]))


def windows(x, R, S, stride=(1, 1)):
    """x's windows, (n, c, i, j, r, s)."""
    return np.lib.stride_tricks.sliding_window_view(x, (R, S), axis=(2, 3))[:, :, ::stride[0], ::stride[1]]


def reference(x, w, g, stride=(1, 1)):
    """y, dx, dw of the valid correlation of x with w (O, C, R, S) at `stride`, and cotangent g,
    in float64."""
    x, w, g = (a.astype(np.float64) for a in (x, w, g))
    R, S = w.shape[2:]
    (sh, sw), (Ho, Wo) = stride, g.shape[2:]
    y = np.einsum("ncijrs,kcrs->nkij", windows(x, R, S, stride), w)
    dw = np.einsum("nkij,ncijrs->kcrs", g, windows(x, R, S, stride))
    dx = np.zeros_like(x)
    for r in range(R):
        for s in range(S):
            rows, cols = slice(r, r + sh * (Ho - 1) + 1, sh), slice(s, s + sw * (Wo - 1) + 1, sw)
            dx[:, :, rows, cols] += np.einsum("nkij,kc->ncij", g, w[:, :, r, s])
    return y, dx, dw


SHAPES = [  # (N, C, H, W), (K, C, R, S), the gradients by the kernels. A sum over fewer than 16
    # channels is a loop nest (contract.MIN_CONTRACTED): the forward's over C, the input gradient's over K.
    ((2, 17, 12, 21), (18, 17, 3, 3), 2),  # 18 and 17 channels, 19 columns: no last block is full
    ((1, 16, 10, 10), (1, 16, 3, 3), 1),  # one channel out; 8 columns, a single float32 vector
    ((2, 16, 7, 26), (16, 16, 2, 5), 2),  # 10 taps: the last block of 3 has two spare
]


def tolerance(dtype):
    return dict(rtol=2e-4, atol=2e-4) if dtype == np.float32 else dict(rtol=1e-10, atol=1e-10)


@compiled_only
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("xs, ws, direct", SHAPES)
def test_forward_and_gradients_match_einsum(xs, ws, direct, dtype):
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal(xs).astype(dtype), rng.standard_normal(ws).astype(dtype)
    report = hd.explain(conv, x, w)
    assert "by a direct convolution kernel" in report.forward_source, report.forward_source
    assert str(report).count(DIRECT) == direct, str(report)
    y, vjp = hd.vjp(conv, x, w)
    g = rng.standard_normal(y.shape).astype(dtype)
    dx, dw = vjp(g)
    ry, rdx, rdw = reference(x, w, g)
    assert y.dtype == dx.dtype == dw.dtype == dtype
    for got, want in ((y, ry), (dx, rdx), (dw, rdw)):
        np.testing.assert_allclose(got, want, **tolerance(dtype))


@compiled_only
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("xs, stride", [((2, 16, 11, 41), (2, 2)), ((1, 16, 6, 40), (1, 3))])
def test_strided_forward_and_weight_gradient(xs, stride, dtype):
    """A strided sum reads x's columns split by phase, and the input gradient writes them so
    (41 columns: phases of 21 and 20; with 11 rows at stride 2 and 3 taps the last row gets no
    gradient)."""
    rng = np.random.default_rng(7)
    x, w = rng.standard_normal(xs).astype(dtype), rng.standard_normal((17, 16, 3, 3)).astype(dtype)
    report = hd.explain(conv_strided, x, w, *stride)
    assert "by a direct convolution kernel" in report.forward_source, report.forward_source
    direct = [c.buffer for c in report.contributions if DIRECT in c.formula]
    assert sorted(direct) == ["w", "x"], str(report)
    y, vjp = hd.vjp(conv_strided, x, w, *stride)
    g = rng.standard_normal(y.shape).astype(dtype)
    for got, want in zip((y, *vjp(g)), reference(x, w, g, stride)):
        np.testing.assert_allclose(got, want, **tolerance(dtype))
    if dtype == np.float64:
        hd.check_grad(conv_strided, x, w, *stride)


@compiled_only
def test_gradients_match_finite_differences():
    rng = np.random.default_rng(1)
    x, w = rng.standard_normal((2, 16, 5, 11)), rng.standard_normal((17, 16, 3, 2))
    assert str(hd.explain(conv, x, w)).count(DIRECT) == 2
    hd.check_grad(conv, x, w)


@compiled_only
def test_kernel_in_another_axis_order_and_a_scale():
    rng = np.random.default_rng(2)
    x, w = rng.standard_normal((2, 16, 5, 19)), rng.standard_normal((3, 3, 16, 17))  # (R, S, C, K)
    assert str(hd.explain(conv_hwio_scaled, x, w)).count(DIRECT) == 2
    y, vjp = hd.vjp(conv_hwio_scaled, x, w)
    g = rng.standard_normal(y.shape)
    dx, dw = vjp(g)
    oihw = w.transpose(3, 2, 0, 1)
    ry, rdx, rdw = reference(x, oihw, g)
    np.testing.assert_allclose(y, ry / 4, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(dx, rdx / 4, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(dw, rdw.transpose(2, 3, 1, 0) / 4, rtol=1e-10, atol=1e-10)
    hd.check_grad(conv_hwio_scaled, x, w)


@compiled_only
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("stride", [(1, 1), (2, 2)])
def test_a_second_contribution_adds_to_the_first(dtype, stride):
    """Where a kernel adds to what the gradient holds, blocks that overlap the one before must
    leave out the columns and channels it wrote (17 channels, 19 columns)."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 17, 5, 21) if stride == (1, 1) else (2, 17, 7, 35)).astype(dtype)
    w, v = (rng.standard_normal((18, 17, 3, 3)).astype(dtype) for _ in range(2))
    assert str(hd.explain(two_convs, x, w, v, *stride)).count(DIRECT) == 4
    y, vjp = hd.vjp(two_convs, x, w, v, *stride)
    g = rng.standard_normal(y.shape).astype(dtype)
    dx, dw, dv = vjp(g)[:3]  # (and None for the strides)
    a, _, _ = reference(x, w, g, stride)
    b, _, _ = reference(x, v, g, stride)
    _, dx_a, dw_ = reference(x, w, g * b, stride)
    _, dx_b, dv_ = reference(x, v, g * a + g, stride)
    np.testing.assert_allclose(dx, dx_a + dx_b, **tolerance(dtype))
    np.testing.assert_allclose(dw, dw_, **tolerance(dtype))
    np.testing.assert_allclose(dv, dv_, **tolerance(dtype))
    if dtype == np.float64:
        hd.check_grad(two_convs, x, w, v, *stride)


def test_rows_narrower_than_a_vector_stay_with_blas():
    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, 16, 5, 9)).astype(np.float32)
    w = rng.standard_normal((16, 16, 3, 3)).astype(np.float32)
    report = hd.explain(conv, x, w)  # 7 output columns, less than 8 float32 lanes
    assert "f by BLAS" in report.forward_source
    assert str(report).count("[computed by BLAS]") == 2 and DIRECT not in str(report), str(report)
    y, vjp = hd.vjp(conv, x, w)
    g = rng.standard_normal(y.shape).astype(np.float32)
    ry, rdx, rdw = reference(x, w, g)
    for got, want in zip((y, *vjp(g)), (ry, rdx, rdw)):
        np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-4)


def test_plain_python_kernels_keep_blas(monkeypatch):
    """HALIDE_AD_JIT=0 runs the generated source as Python, where the vector intrinsics do not exist."""
    monkeypatch.setenv("HALIDE_AD_JIT", "0")
    rng = np.random.default_rng(6)
    x, w = rng.standard_normal((1, 16, 4, 12)), rng.standard_normal((16, 16, 3, 3))
    report = hd.explain(conv, x, w)
    assert DIRECT not in str(report) and "f by BLAS" in report.forward_source, str(report)
    y, vjp = hd.vjp(conv, x, w)
    g = rng.standard_normal(y.shape)
    ry, rdx, rdw = reference(x, w, g)
    for got, want in zip((y, *vjp(g)), (ry, rdx, rdw)):
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10)


def test_matches_torch():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 16, 6, 30)).astype(np.float32)
    w = rng.standard_normal((16, 16, 3, 3)).astype(np.float32)
    y, vjp = hd.vjp(conv, x, w)
    g = rng.standard_normal(y.shape).astype(np.float32)
    xt, wt = torch.from_numpy(x).requires_grad_(), torch.from_numpy(w).requires_grad_()
    yt = torch.nn.functional.conv2d(xt, wt)
    yt.backward(torch.from_numpy(g))
    for got, want in zip((y, *vjp(g)), (yt.detach(), xt.grad, wt.grad)):
        np.testing.assert_allclose(got, want.numpy(), rtol=1e-4, atol=1e-4)


@njit
def _lanes_ops(a, out):
    v = simd.fma(simd.load(a, 0), simd.splat(a, 1), simd.zero(a))
    simd.store(out, 0, simd.add(v, simd.keep_from(simd.load(a, 1), 2)))
    return simd.total(v)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_vector_operations(dtype):
    a = np.arange(1, 10, dtype=dtype)
    out = np.zeros_like(a)
    n = simd.lanes(a.itemsize)
    total = _lanes_ops(a, out)
    expected = a[:n] * a[1] + np.where(np.arange(n) >= 2, a[1:n + 1], 0)
    np.testing.assert_array_equal(out[:n], expected)
    np.testing.assert_array_equal(out[n:], 0)
    assert total == (a[:n] * a[1]).sum()


@compiled_only
def test_a_contraction_named_in_route_engines_takes_that_engine_at_any_size(monkeypatch):
    """What halide_ad.dask's blocks rely on: `compiler.engine_choices` records each contraction's
    engine, and within `route.engines` of a choice, a contraction too small for the direct kernels
    takes them (planned only, nothing compiled)."""
    monkeypatch.setattr(direct_conv, "MIN_WORK", 1 << 24)
    traced, _ = conv.trace((np.zeros((1, 16, 12, 12)), np.zeros((16, 16, 3, 3))), {})
    chosen = engine_choices(traced.program, ("x",), ("w",))
    assert sorted(out for out, _ in chosen) == ["adj_w", "adj_x", "f"]  # the forward and both gradients
    assert set(chosen.values()) == {"blas"}  # 16 * 16 * 10 * 10 * 9 multiply-adds: below MIN_WORK
    pinned = dict.fromkeys(chosen, "direct_conv")
    with engines(pinned):
        plans = plan_gradient(traced.program, ("x", "w"))
    taken = [c.plan for p in plans for c in p.contributions if isinstance(c, Contraction)]
    assert len(taken) == 2 and all(isinstance(plan, direct_conv.DirectPlan) for plan in taken)
    assert pinned == dict.fromkeys(chosen, "direct_conv")  # nothing new to record
