"""Forward results against plain numpy (and PyTorch where it has the op)."""
import numpy as np
import pytest

import halide_ad as hd
from tests import programs as P


@pytest.mark.parametrize("view", list(P.VIEWS))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_blur3_matches_numpy_under_each_view(view, dtype, rng):
    img = rng.random((5, 7)).astype(dtype)
    out = P.blur3(img, view)
    assert out.dtype == dtype
    np.testing.assert_allclose(out, P.numpy_blur3(img, view), rtol=1e-6)


@pytest.mark.parametrize("view", list(P.VIEWS))
def test_blur1d_boundary_pixels(view):
    x = np.array([1.0, 10.0, 100.0, 1000.0])
    p = np.pad(x, 1, mode=P.NUMPY_PAD[view])
    np.testing.assert_allclose(P.blur1d(x, view), (p[:-2] + 2 * p[1:-1] + p[2:]) / 4)


def test_size_one_images():
    np.testing.assert_allclose(P.blur3(np.array([[2.0]]), "mirror"), [[2.0]])
    np.testing.assert_allclose(P.blur3(np.array([[2.0]]), "constant_exterior"), [[2.0 / 3]])


def test_conv2d_matches_direct_sum(rng):
    x, w = rng.random((2, 3, 6, 7)), rng.random((4, 3, 3, 2))
    ref = np.zeros((2, 4, 4, 6))
    for r in range(3):
        for s in range(2):
            ref += np.einsum("nchw,kc->nkhw", x[:, :, r:r + 4, s:s + 6], w[:, :, r, s])
    np.testing.assert_allclose(P.conv2d(x, w), ref, rtol=1e-12)


def test_maxpool_and_dense_and_softmax(rng):
    x = rng.random((2, 3, 6, 8))
    np.testing.assert_array_equal(P.maxpool2(x), x.reshape(2, 3, 3, 2, 4, 2).max(axis=(3, 5)))
    a, w, b = rng.random((3, 5)), rng.random((5, 4)), rng.random(4)
    np.testing.assert_allclose(P.dense(a, w, b), a @ w + b, rtol=1e-12)
    s = rng.standard_normal((3, 6)) * 10
    e = np.exp(s - s.max(axis=1, keepdims=True))
    np.testing.assert_allclose(P.softmax(s), e / e.sum(axis=1, keepdims=True), rtol=1e-12)


def test_noncontiguous_input(rng):
    img = rng.random((8, 14))[:, ::2]
    np.testing.assert_allclose(P.blur3(img), P.numpy_blur3(img, "repeat_edge"))


def test_tensor_sugar(rng):
    @hd.func
    def sugar(a, b):
        return {"sum": (a + b * 2.0).sum(axis=1), "t": a.T, "r": a.reshape(-1), "s": a[1:, ::2],
                "mean": hd.mean(a), "mm": a @ b.T}
    a, b = rng.random((3, 4)), rng.random((3, 4))
    out = sugar(a, b)
    np.testing.assert_allclose(out["sum"], (a + b * 2).sum(axis=1))
    np.testing.assert_array_equal(out["t"], a.T)
    np.testing.assert_array_equal(out["r"], a.reshape(-1))
    np.testing.assert_array_equal(out["s"], a[1:, ::2])
    np.testing.assert_allclose(out["mean"], a.mean())
    np.testing.assert_allclose(out["mm"], a @ b.T)


def test_float32_stays_float32_with_python_floats(rng):
    x = rng.random(5).astype(np.float32)
    out = hd.func(lambda x: x * 0.5 + 1)(x)
    assert out.dtype == np.float32


def test_floor_semantics_and_argmax():
    @hd.func
    def ops(x):
        n = x.shape[0]
        r = hd.rdom(n)
        return (hd.compute((n,), lambda i: x[(i - 3) % n] + (i - 3) // 2),
                hd.compute((), lambda: hd.argmax(x[r])))
    x = np.array([3.0, 1.0, 7.0, 7.0, 2.0])
    shifted, am = ops(x)
    i = np.arange(5)
    np.testing.assert_array_equal(shifted, x[(i - 3) % 5] + (i - 3) // 2)
    assert am == 2  # the first of the tied maxima
