"""Reduction variables keep the names the user gave them, in hd.explain and in generated code."""
import numpy as np

import halide_ad as hd


@hd.func
def conv(x, k):
    C, H, W = x.shape
    c, dy, dx = hd.rdom(C, 3, 3)
    return hd.compute((H - 2, W - 2), lambda i, j: hd.sum(x[c, i + dy, j + dx] * k[c, dy, dx]))


@hd.func
def generated_names(x):
    """rdom names that the generated kernels also use for themselves."""
    status = hd.rdom(x.shape[0])
    np = hd.rdom(x.shape[1])
    acc, *rest = hd.rdom(2, 2)  # starred unpacking: no plain names to read, so r
    return hd.compute((1,), lambda i: hd.sum(x[status, np] * 2.0) + hd.sum(x[acc, rest[0]]))


def test_explain_shows_the_users_rdom_names():
    x, k = np.random.default_rng(0).random((2, 6, 6)), np.random.default_rng(1).random((2, 3, 3))
    text = str(hd.explain(lambda x, k: hd.sum(conv(x, k)), x, k))
    assert "x[c, i + dy, j + dx] * k[c, dy, dx] for c in [0, 2), dy in [0, 3), dx in [0, 3)" in text
    assert "adj_x[c, i + dy, j + dx] += adj_f[i, j] * k[c, dy, dx]" in text


def test_names_that_generated_code_uses_still_work():
    x = np.random.default_rng(2).random((3, 4))
    expected = 2 * x.sum() + x[:2, :2].sum()
    np.testing.assert_allclose(generated_names(x), [expected])
    g = hd.grad(lambda x: hd.sum(generated_names(x)))(x)
    want = np.full_like(x, 2.0)
    want[:2, :2] += 1
    np.testing.assert_allclose(g, want)
    text = str(hd.explain(lambda x: hd.sum(generated_names(x)), x))
    assert "for status in [0, 3), np in [0, 4)" in text and "for r in [0, 2), r_1 in [0, 2)" in text
