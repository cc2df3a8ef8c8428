"""Reductions with axis and keepdims: finite differences, PyTorch, first-element ties."""
import numpy as np
import pytest

import halide_ad as hd
from halide_ad import ops
from tests.ops.helpers import all_gathers, matches_torch


@hd.func
def reductions(x):
    return {
        "sum": ops.sum(x), "sum_1": ops.sum(x, axis=1), "mean_02": ops.mean(x, axis=(0, 2)),
        "max_last": ops.max(x, axis=-1), "min_0_keep": ops.min(x, axis=0, keepdims=True),
        "prod_1": ops.prod(x, axis=1), "max": ops.max(x), "mean_keep": ops.mean(x, axis=-1, keepdims=True),
    }


def torch_reductions(x):
    return {
        "sum": x.sum(), "sum_1": x.sum(1), "mean_02": x.mean((0, 2)), "max_last": x.amax(-1),
        "min_0_keep": x.amin(0, keepdim=True), "prod_1": x.prod(1), "max": x.max(),
        "mean_keep": x.mean(-1, keepdim=True),
    }


def test_reductions_gradients_and_torch(rng):
    x = rng.standard_normal((2, 3, 4))
    hd.check_grad(reductions, x)
    matches_torch(reductions, torch_reductions, x)
    assert all_gathers(reductions, x)


def test_max_min_send_ties_to_the_first_element():
    x = np.zeros((2, 3, 4))
    x[1, 2, 1:] = 5.0
    _, f_vjp = hd.vjp(reductions, x)
    cts = {k: np.zeros(v.shape) for k, v in reductions(x).items()}
    cts["max_last"] = np.ones((2, 3))
    (g,) = f_vjp(cts)
    expected = np.zeros((2, 3, 4))
    expected[:, :, 0] = 1.0  # rows of zeros: the first zero wins
    expected[1, 2] = [0.0, 1.0, 0.0, 0.0]  # 5.0 first appears at position 1
    np.testing.assert_array_equal(g, expected)


def test_prod_gradient_with_zeros(rng):
    x = rng.standard_normal((2, 3, 4))
    x[0, :2, 0] = 0.0  # two zeros in one product: every gradient there is 0
    x[1, 1, 3] = 0.0
    matches_torch(reductions, torch_reductions, x)


def test_argument_checks():
    with pytest.raises(hd.ShapeError, match="ops.sum: axis=3 is not an axis of a 2-d tensor"):
        hd.func(lambda x: ops.sum(x, axis=3))(np.ones((2, 2)))
    with pytest.raises(hd.ShapeError, match="repeats an axis"):
        hd.func(lambda x: ops.mean(x, axis=(0, -2)))(np.ones((2, 2)))
