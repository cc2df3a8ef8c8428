"""Captured arrays: numpy arrays read from a closure or a global are non-differentiated inputs,
read afresh at every call; a new lambda of the same code neither traces nor compiles again."""
import numpy as np
import pytest

import halide_ad as hd
from halide_ad import api

TARGET = np.linspace(0.0, 1.0, 6)  # a global, read by `fit` below
KERNEL = np.array([0.25, 0.5, 0.25])


@hd.func
def blur(u):
    c = hd.repeat_edge(u)
    k = hd.constant_exterior(KERNEL)  # a captured array read through a boundary view
    r = hd.rdom(3)
    return hd.compute(u.shape, lambda i: hd.sum(k[r] * c[i + r - 1]))


def blur_np(u):
    p = np.pad(u, 1, mode="edge")
    return sum(KERNEL[r] * p[r:r + len(u)] for r in range(3))


def fit(u):
    return hd.sum((blur(u) - TARGET) ** 2)


def loss_of(target):
    return lambda u: hd.sum((blur(u) - target) ** 2)


def numeric_grad(f, u, eps=1e-6):
    return np.array([(f(u + eps * e) - f(u - eps * e)) / (2 * eps) for e in np.eye(u.size)])


@pytest.fixture
def counts(monkeypatch):
    """How many times a program was traced, and its forward and gradient kernels built (kernels
    built at once, not in the background while the interpreter runs)."""
    monkeypatch.setenv("HALIDE_AD_TIERED", "0")
    seen = {"trace": 0, "forward": 0, "gradient": 0}

    def counting(name, fn):
        def wrapper(*args, **kwargs):
            seen[name] += 1
            return fn(*args, **kwargs)
        return wrapper
    monkeypatch.setattr(api.Function, "_trace", counting("trace", api.Function._trace))
    monkeypatch.setattr(api, "compile_forward", counting("forward", api.compile_forward))
    monkeypatch.setattr(api, "compile_gradient", counting("gradient", api.compile_gradient))
    return seen


def test_closure_gradient_matches_finite_differences(rng):
    u, target = rng.standard_normal(6), rng.standard_normal(6)
    g = hd.grad(loss_of(target))(u)
    np.testing.assert_allclose(g, numeric_grad(lambda v: np.sum((blur_np(v) - target) ** 2), u), rtol=1e-7)


def test_a_new_lambda_per_call_sees_new_values_without_tracing_again(rng, counts):
    u = rng.standard_normal(6)
    hd.grad(loss_of(rng.standard_normal(6)))(u)
    before = dict(counts)
    for _ in range(3):
        target = rng.standard_normal(6)
        g = hd.grad(loss_of(target))(u)  # a new lambda, closing over a new array, each time
        np.testing.assert_allclose(g, numeric_grad(lambda v: np.sum((blur_np(v) - target) ** 2), u), rtol=1e-7)
    assert counts == before


def test_global_values_are_read_at_every_call(rng, monkeypatch, counts):
    u = rng.standard_normal(6)
    original = TARGET
    first = hd.value_and_grad(fit)(u)[0]
    monkeypatch.setitem(globals(), "TARGET", original + 1.0)
    second = hd.value_and_grad(fit)(u)[0]
    np.testing.assert_allclose(first, np.sum((blur_np(u) - original) ** 2))
    np.testing.assert_allclose(second, np.sum((blur_np(u) - original - 1.0) ** 2))
    assert counts["trace"] == 1


def test_a_shape_change_traces_again(rng, counts):
    u = rng.standard_normal(6)
    scale = np.ones(6)
    f = hd.func(lambda u: u * scale)
    np.testing.assert_allclose(f(u), u)
    scale = np.full(1, 3.0)  # broadcasts: a new program
    np.testing.assert_allclose(f(u), 3 * u)
    scale = np.full(6, 2.0)  # back to the first shape: traced again, same kernels
    np.testing.assert_allclose(f(u), 2 * u)
    assert counts["trace"] == 3 and counts["forward"] == 2
    scale = np.ones(4)
    with pytest.raises(hd.ShapeError, match="do not broadcast"):
        f(u)


def test_kinds_of_captured_arrays(rng):
    u = rng.standard_normal((3, 4))
    mask = u > 0                        # bool
    weights = np.float32(2.0) * np.ones((1, 4), np.float32)  # float32, broadcast into float64
    offset = np.array(0.5)              # 0-d, read inside hd.compute
    steps = np.arange(4)                # integer data

    @hd.func
    def f(u):
        masked = hd.where(mask, u, 0.0) * weights + u * steps
        return hd.compute((3,), lambda i: masked[i, 3] + u[i, 1] * offset)

    def reference(u):
        return (np.where(mask, u, 0.0) * weights + u * np.arange(4))[:, 3] + u[:, 1] * 0.5
    np.testing.assert_allclose(f(u), reference(u))
    out, vjp = hd.vjp(f, u)
    assert len(vjp(np.ones(3))) == 1  # captured arrays are no arguments: no gradient for them
    hd.check_grad(f, u)


def test_an_array_computed_while_tracing_is_traced_at_every_call(rng, counts):
    u = rng.standard_normal(4)
    base = np.ones(4)
    f = hd.func(lambda u: u * (base * 2))  # base * 2 is a new array at every trace: no path finds it
    np.testing.assert_allclose(f(u), 2 * u)
    base = np.full(4, 5.0)
    np.testing.assert_allclose(f(u), 10 * u)
    assert counts["trace"] == 2 and counts["forward"] == 1


def test_jvp_of_a_closure(rng):
    u, t, target = rng.standard_normal(6), rng.standard_normal(6), rng.standard_normal(6)
    _, tangent = hd.jvp(loss_of(target), (u,), (t,))
    np.testing.assert_allclose(tangent, numeric_grad(lambda v: np.sum((blur_np(v) - target) ** 2), u) @ t, rtol=1e-7)


def test_captured_array_of_an_unsupported_dtype():
    text = np.array(["a", "b"])
    with pytest.raises(hd.DTypeError, match="captured numpy array has dtype <U1"):
        hd.func(lambda u: u * text)(np.ones(2))


def test_static_values_in_a_closure_or_default_are_part_of_the_key(rng, counts):
    u = rng.standard_normal(3)

    def scaled(s):
        return lambda u: u * s

    def keyword(s):
        def f(u, *, scale=s):
            return u * scale
        return f
    for factor in (2.0, 3.0, 2.0):
        np.testing.assert_allclose(hd.jvp(scaled(factor), (u,), (u,))[0], factor * u)
        np.testing.assert_allclose(hd.vjp(keyword(factor), u)[1](np.ones(3))[0], np.full(3, factor))
    assert counts["trace"] == 4  # two functions, two factors each: the third round traces nothing


def test_hd_functions_and_reductions_of_a_captured_array(rng, counts):
    u = rng.standard_normal(4)
    weights = rng.random(4)
    f = hd.func(lambda u: u * hd.exp(weights) / hd.sum(weights))
    np.testing.assert_allclose(f(u), u * np.exp(weights) / weights.sum())
    weights = rng.random(4)
    np.testing.assert_allclose(f(u), u * np.exp(weights) / weights.sum())
    assert counts["trace"] == 1  # the captured array is an input, not a constant computed by numpy


STEP = None  # a global function, rebound by the test below


def test_a_global_rebound_to_another_function_traces_again(rng):
    global STEP
    u = rng.standard_normal(3)
    for power in (2, 3):
        STEP = hd.func(lambda u, p=power: u ** p)
        np.testing.assert_allclose(hd.grad(lambda u: hd.sum(STEP(u)))(u), power * u ** (power - 1))
