"""A convolution written through `hd.constant_exterior` (examples/train_digits.py's): its weight
gradient reads `select(in bounds, x[...], 0)`, which the BLAS engine computes on a zero-padded copy
of x (`contract.Padding`); gradients against torch in float32 and float64, new data through the
same compiled program, and non-contiguous inputs."""
import threading

import numpy as np
import pytest

import halide_ad as hd
from halide_ad.ir import Bin, Const, Load, Op, Range, Select, Var, const
from halide_ad.runtime.contract import contraction
from halide_ad.runtime.engines import matmuls


def _conv(x, w, b, pad):
    N, C, H, W = x.shape
    K, _, R, S = w.shape
    xp = hd.constant_exterior(x)
    c, r, s = hd.rdom(C, R, S)
    out = (N, K, H + 2 * pad - R + 1, W + 2 * pad - S + 1)
    return hd.compute(out, lambda n, k, i, j:
                      hd.relu(hd.sum(xp[n, c, i + r - pad, j + s - pad] * w[k, c, r, s]) + b[k]), name="conv")


@hd.func
def padded_conv(x, w, b):
    return _conv(x, w, b, 1)


@hd.func
def wide_padded_conv(x, w, b):
    return _conv(x, w, b, 2)


def _torch_grads(x, w, b, ct, pad):
    torch = pytest.importorskip("torch")
    tx, tw, tb = (torch.from_numpy(np.ascontiguousarray(a)).requires_grad_() for a in (x, w, b))
    y = torch.relu(torch.nn.functional.conv2d(tx, tw, tb, padding=pad))
    y.backward(torch.from_numpy(ct))
    return y.detach().numpy(), tx.grad.numpy(), tw.grad.numpy(), tb.grad.numpy()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("fn, pad", [(padded_conv, 1), (wide_padded_conv, 2)])
def test_a_zero_exterior_convolution_matches_torch_with_new_data(fn, pad, dtype, monkeypatch):
    """Two calls of one compiled program with different data, each against torch: the padded
    copy is made per call, not kept from the first. The weight gradient is one BLAS product."""
    rng = np.random.default_rng(0)
    tol = 1e-4 if dtype == np.float32 else 1e-10
    for _ in range(2):
        x, w, b = (rng.standard_normal(s).astype(dtype) for s in ((4, 2, 8, 7), (16, 2, 3, 3), (16,)))
        out, vjp_fn = hd.vjp(fn, x, w, b)
        ct = rng.standard_normal(out.shape).astype(dtype)
        ty, gx, gw, gb = _torch_grads(x, w, b, ct, pad)
        ours = vjp_fn(ct)
        for a, t in zip((out, *ours), (ty, gx, gw, gb), strict=True):
            np.testing.assert_allclose(a, t, rtol=tol, atol=tol)
    products = []
    real = matmuls.einsum_matmul
    monkeypatch.setattr(matmuls, "einsum_matmul", lambda *args: products.append(args[4]) or real(*args))
    vjp_fn(ct)
    assert len(products) == 1, products  # every tap stacked: the operands are small (BlasPlan.SMALL_STACK)
    report = str(hd.explain(fn, x, w, b))
    (weights,) = [line for line in report.splitlines() if line.strip().startswith("[gather-window] adj_w[")]
    assert "[computed by BLAS]" in weights, report


def test_non_contiguous_inputs_give_the_same_gradients():
    """x and w as strided views (the same shapes and dtypes as contiguous arrays before)."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((4, 2, 16, 7))[:, :, ::2]
    w = rng.standard_normal((3, 3, 2, 16)).transpose(3, 2, 1, 0)
    b = rng.standard_normal(16)
    hd.vjp(padded_conv, np.ascontiguousarray(x), np.ascontiguousarray(w), b)  # compiled for C order first
    out, vjp_fn = hd.vjp(padded_conv, x, w, b)
    ct = rng.standard_normal(out.shape)
    ty, gx, gw, gb = _torch_grads(x, w, b, ct, 1)
    for a, t in zip((out, *vjp_fn(ct)), (ty, gx, gw, gb), strict=True):
        np.testing.assert_allclose(a, t, rtol=1e-10, atol=1e-10)


def test_only_an_exact_bounds_test_becomes_a_padded_read():
    """select(0 <= i + r - 1 < 8, x[n, c, i + r - 1], 0) * w[c, r] is a contraction over a copy
    of x padded by one on each side of its last axis; a test that is not x's bounds (< 7), or
    misses a side that the ranges reach, leaves the select to the loop nest, and so does a
    contraction of too little work to pay for the copies (MIN_PADDED_WORK)."""
    n, c, i, r = Var("n"), Var("c"), Var("i"), Var("r")
    at = Bin(Op.SUB, Bin(Op.ADD, i, r), const(1))
    x, w = Load("x", (n, c, at), "float64"), Load("w", (c, r), "float64")

    def bounds(hi):
        return Bin(Op.AND, Bin(Op.GE, at, const(0)), Bin(Op.LT, at, const(hi)))

    def recognized(cond, images=128):
        domain = (Range(n, 0, images), Range(i, 0, 8), Range(c, 0, 16), Range(r, 0, 3))
        shapes = {"x": (images, 16, 8), "w": (16, 3), "y": (images, 8)}
        value = Bin(Op.MUL, Select(cond, x, Const(0.0, "float64")), w)
        return contraction("y", (n, i), value, domain, None, shapes)

    found = recognized(bounds(8))
    assert found is not None
    (padding,) = found.padded
    assert padding.pads == ((0, 0), (0, 0), (1, 1)) and padding.source == x
    assert [p.buffer for p in found.loads] == ["x", "w"] and dict(found.shapes)[padding.name] == (128, 16, 10)
    assert recognized(bounds(7)) is None
    assert recognized(Bin(Op.GE, at, const(0))) is None
    assert recognized(bounds(8), images=2) is None


def test_two_threads_calling_at_once_get_their_own_gradients():
    """Two threads run the same compiled gradient (padded copies per call, BLAS held on one
    thread by each kernel) on different data at once; each gets what a lone call gives."""
    rng = np.random.default_rng(2)
    w, b = rng.standard_normal((16, 2, 3, 3)), rng.standard_normal(16)
    xs = [rng.standard_normal((4, 2, 8, 7)) for _ in range(2)]
    out, _ = hd.vjp(padded_conv, xs[0], w, b)
    ct = rng.standard_normal(out.shape)
    alone = [hd.vjp(padded_conv, x, w, b)[1](ct) for x in xs]
    results: list = [None, None]

    def run(k):
        for _ in range(20):
            results[k] = hd.vjp(padded_conv, xs[k], w, b)[1](ct)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for got, expected in zip(results, alone, strict=True):
        for a, e in zip(got, expected, strict=True):
            np.testing.assert_array_equal(a, e)
