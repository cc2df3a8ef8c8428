import numpy as np
import pytest

import halide_ad as hd
from tests.updates import programs as P


def test_updating_an_argument_is_a_trace_error():
    @hd.func
    def f(x):
        r = hd.rdom(3)
        x[r] += 1.0
        return x

    with pytest.raises(hd.TraceError, match="writes into the argument x; arguments cannot be updated"):
        f(np.zeros(3))


def test_affine_out_of_bounds_write_is_a_bounds_error():
    @hd.func
    def f(x):
        t = hd.zeros((4,), x.dtype)
        r = hd.rdom(x.shape[0])
        t[r + 1] += x[r]
        return t

    with pytest.raises(hd.BoundsError, match=r"writes index 4 of dimension 0 \(valid: 0..3\).*r = 3"):
        f(np.zeros(4))


def test_data_dependent_write_is_checked_at_run_time(rng):
    w = rng.random(5)
    with pytest.raises(hd.BoundsError, match="a data-dependent index was 9, outside dimension 0"):
        P.unclamped(np.array([0, 1, 9, 2, 1]), w, 4)
    np.testing.assert_allclose(P.unclamped(np.array([0, 1, 3, 2, 1]), w, 4),
                               np.bincount([0, 1, 3, 2, 1], w, 4))


def test_pure_var_must_stand_alone():
    @hd.func
    def f(x):
        t = hd.compute(x.shape, lambda i: x[i])
        i = hd.var()
        t[i] = t[i + 1 - 1] * 2.0
        return t

    with pytest.raises(hd.TraceError, match="must use i there too"):
        f(np.zeros(3))


def test_float_value_into_int_tensor():
    @hd.func
    def f(x):
        t = hd.zeros((3,), "int64")
        r = hd.rdom(3)
        t[r] = x[r]
        return t

    with pytest.raises(hd.TraceError, match=r"hd.cast\(value, 'int64'\)"):
        f(np.zeros(3))


def test_reduction_over_the_updates_own_rdom():
    @hd.func
    def f(x):
        t = hd.zeros((3,), x.dtype)
        r, k = hd.rdom(3), hd.rdom(x.shape[1])
        t[r] += hd.sum(x[r, k])
        return t

    with pytest.raises(hd.TraceError, match="hd.sum inside the update of .* reduces over r, which the update"):
        f(np.zeros((3, 4)))
