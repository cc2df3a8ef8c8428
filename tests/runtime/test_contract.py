"""BLAS contractions: `_matmul` against numpy's einsum on the layouts contractions produce
(transposed and strided views, size-1 and empty axes, stacked taps), and convolution gradients
whose taps go through im2col / col2im against finite differences."""
import itertools

import numpy as np
import pytest
from halide_ad.runtime.contract import _matmul

import halide_ad as hd

CASES = [  # (a subscripts, b subscripts, out subscripts, sizes)
    ("ik", "kj", "ij", dict(i=5, j=7, k=3)),
    ("ik", "kj", "ji", dict(i=5, j=7, k=3)),
    ("nkij", "kc", "cnij", dict(n=3, k=4, i=5, j=6, c=2)),  # a convolution's input gradient
    ("nkij", "nrcij", "kcr", dict(n=3, k=4, i=5, j=6, c=2, r=3)),  # its weight gradient
    ("nrcij", "krc", "nkij", dict(n=3, k=4, i=5, j=6, c=2, r=3)),  # the forward
    ("nk", "k", "n", dict(n=4, k=9)),
    ("k", "k", "", dict(k=9)),
    ("nk", "kc", "nc", dict(n=1, k=1, c=1)),
    ("nk", "kc", "nc", dict(n=0, k=3, c=2)),
    ("nk", "nc", "nkc", dict(n=3, k=2, c=4)),  # a letter in all three: einsum
]


@pytest.mark.parametrize("sa, sb, out, sizes", CASES)
@pytest.mark.parametrize("layout", ["contiguous", "transposed", "strided"])
def test_matmul_equals_einsum(sa, sb, out, sizes, layout):
    rng = np.random.default_rng(0)

    def operand(subs):
        shape = [sizes[c] for c in subs]
        if layout == "contiguous":
            return rng.standard_normal(shape)
        if layout == "transposed":
            return rng.standard_normal(shape[::-1]).transpose()
        big = rng.standard_normal([2 * n + 1 for n in shape])
        return big[tuple(slice(1, 1 + 2 * n, 2) for n in shape)]

    va, vb = operand(sa), operand(sb)
    np.testing.assert_allclose(_matmul(va, sa, vb, sb, out), np.einsum(f"{sa},{sb}->{out}", va, vb),
                               rtol=1e-12, atol=1e-12)


@hd.func
def conv(x, w, stride):
    N, C, H, W = x.shape
    K, _, R, S = w.shape
    c, r, s = hd.rdom(C, R, S)
    return hd.compute((N, K, (H - R) // stride + 1, (W - S) // stride + 1),
                      lambda n, k, i, j: hd.sum(x[n, c, stride * i + r, stride * j + s] * w[k, c, r, s]))


@pytest.mark.parametrize("stride, shape", itertools.product([1, 2], [(2, 3, 9, 8), (1, 2, 11, 10)]))
def test_convolution_through_blas_matches_finite_differences(stride, shape):
    rng = np.random.default_rng(1)
    x = rng.standard_normal(shape)
    w = rng.standard_normal((16, shape[1], 3, 3))  # 16 channels out: BLAS computes the input gradient too
    hd.check_grad(lambda x, w: conv(x, w, stride), x, w)
    explained = str(hd.explain(conv, x, w, stride))
    assert explained.count("[computed by BLAS]") == 2, explained  # the input's and the weight's gradients
