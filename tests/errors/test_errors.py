"""Every user mistake raises a HalideADError subclass whose message says what and how to fix it."""
import numpy as np
import pytest

import halide_ad as hd
from tests import programs as P


def test_out_of_bounds_read_names_tensor_value_and_fix():
    f = hd.func(lambda img: hd.compute(img.shape, lambda y, x: img[y, x - 1] + img[y, x]))
    with pytest.raises(hd.BoundsError, match=r"reads index -1 of dimension 1 of img \(valid: 0..4\) when") as e:
        f(np.zeros((3, 5)))
    assert "hd.repeat_edge(img)" in str(e.value) and "test_errors.py" in str(e.value)
    assert isinstance(e.value, IndexError)


def test_data_dependent_index_checked_at_run_time():
    f = hd.func(lambda t, idx: hd.compute(idx.shape, lambda i: t[idx[i]]))
    with pytest.raises(hd.BoundsError, match=r"was 7, outside dimension 0 of t \(valid: 0..3\)"):
        f(np.zeros(4), np.array([0, 7]))


def test_python_control_flow_and_builtins():
    def branchy(x):
        return hd.compute(x.shape, lambda i: x[i] if x[i] > 0 else 0.0)
    with pytest.raises(hd.TraceError, match="hd.where"):
        hd.func(branchy)(np.ones(3))
    with pytest.raises(hd.TraceError, match="hd.maximum"):
        hd.func(lambda x: hd.compute(x.shape, lambda i: max(x[i], 0.0)))(np.ones(3))
    with pytest.raises(hd.TraceError, match="hd.abs"):
        hd.func(lambda x: hd.compute(x.shape, lambda i: abs(x[i])))(np.ones(3))


def test_gradient_requests_that_have_no_answer():
    with pytest.raises(hd.NotDifferentiableError, match="one scalar"):
        hd.grad(P.blur3)(np.ones((3, 3)))
    with pytest.raises(hd.NotDifferentiableError, match="integer and bool arrays are data"):
        hd.grad(lambda x: hd.sum(x * 1.0))(np.arange(3))


def test_argument_problems():
    with pytest.raises(hd.DTypeError, match="complex128"):
        P.blur3(np.ones((3, 3), complex))
    with pytest.raises(hd.ShapeError, match="no elements"):
        P.blur3(np.ones((0, 3)))
    with pytest.raises(hd.ShapeError, match="do not broadcast"):
        hd.func(lambda a, b: a + b)(np.ones(3), np.ones(4))
    with pytest.raises(hd.ShapeError, match="extents must be positive"):
        hd.func(lambda a: hd.compute((), lambda: hd.sum(a[hd.rdom(0)])))(np.ones(3))
    with pytest.raises(hd.ShapeError, match="indexed with 1 index"):
        hd.func(lambda a: hd.compute((2,), lambda i: a[i]))(np.ones((2, 2)))
    with pytest.raises(hd.TraceError, match="pass numpy arrays"):
        P.blur3([[1.0]])
    with pytest.raises(hd.ShapeError, match="cotangent"):
        hd.vjp(P.blur3, np.ones((3, 3)))[1](np.ones((2, 2)))


def test_user_exceptions_propagate_unchanged():
    def broken(x):
        raise KeyError("mine")
    with pytest.raises(KeyError, match="mine"):
        hd.func(broken)(np.ones(2))
