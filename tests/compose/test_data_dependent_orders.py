"""Derivatives of gradients through data-dependent indices: the gradient's scatter to
`adj_w[idx[i]]` is written back as an update definition (halide_ad/retrace.py), differentiated
again like any update. Hessian-vector products both ways and Hessians of an embedding lookup and
of a floor-index interpolation (and of row products, whose scatter's value holds a reduction),
and a custom_jvp rule that reads its tangent at `idx[i]`, against JAX in float64; the same bits
on every run."""
import numpy as np
import pytest

import halide_ad as hd

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

pytestmark = pytest.mark.usefixtures("jax_x64")

IDX = np.array([3, 0, 3, 1, 4, 3, 0])       # repeats: several rows read the same entry
POS = np.array([0.25, 2.5, 2.75, 0.0, 3.9, 1.5, -0.5, 4.2])  # past both ends too: clamped


def embedding(w, idx):
    """A row of w per index, a dot with a fixed vector through tanh, plus the rows cubed."""
    u, r = hd.repeat_edge(np.array([0.5, -1.0, 2.0])), hd.rdom(3)
    dots = hd.compute(idx.shape, lambda i: hd.sum(w[idx[i], r] * u[r]))
    rows = hd.compute((idx.shape[0], 3), lambda i, j: w[idx[i], j])
    return hd.sum(hd.tanh(dots)) + hd.sum(rows ** 3) * 0.1


def jax_embedding(w):
    rows = w[IDX]
    return jnp.sum(jnp.tanh(rows @ jnp.array([0.5, -1.0, 2.0]))) + jnp.sum(rows ** 3) * 0.1


def interpolated(x, pos):
    """x linearly interpolated at pos (grid_sample along one axis: floor index, fraction)."""
    n = x.shape[0]
    k = hd.compute(pos.shape, lambda i: hd.clamp(hd.cast(hd.floor(pos[i]), "int64"), 0, n - 2))
    a = hd.compute(pos.shape, lambda i: hd.clamp(pos[i] - hd.cast(k[i], "float64"), 0.0, 1.0))
    s = hd.compute(pos.shape, lambda i: x[k[i]] * (1 - a[i]) + x[k[i] + 1] * a[i])
    return hd.sum(hd.sin(s) * s)


def jax_interpolated(x):
    k = jnp.clip(jnp.floor(POS).astype(jnp.int64), 0, x.shape[0] - 2)
    a = jnp.clip(POS - k, 0.0, 1.0)
    s = x[k] * (1 - a) + x[k + 1] * a
    return jnp.sum(jnp.sin(s) * s)


def row_products(x, idx):
    """A product over each looked-up row: the scatter's value holds a reduction (the others' product)."""
    r = hd.rdom(3)
    return hd.sum(hd.sin(hd.compute(idx.shape, lambda i: hd.prod(x[idx[i], r]))))


def jax_row_products(x):
    return jnp.sum(jnp.sin(jnp.prod(x[IDX], axis=1)))


CASES = {"embedding": (embedding, jax_embedding, (5, 3), IDX),
         "floor index": (interpolated, jax_interpolated, (6,), POS),
         "row products": (row_products, jax_row_products, (5, 3), IDX)}


def _hvps(loss, x, data, v):
    forward = hd.jvp(hd.grad(loss), (x, data), (v, None))[1]
    reverse = hd.grad(lambda x, data: hd.sum(hd.grad(loss)(x, data) * v))(x, data)
    return forward, reverse


@pytest.mark.parametrize("case", CASES)
def test_hvp_and_hessian_through_a_data_dependent_index_match_jax(rng, case):
    loss, jax_loss, shape, data = CASES[case]
    x, v = rng.standard_normal(shape), rng.standard_normal(shape)
    expected = jax.jvp(jax.grad(jax_loss), (x,), (v,))[1]
    forward, reverse = _hvps(loss, x, data, v)
    np.testing.assert_allclose(forward, expected, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(reverse, expected, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(hd.hessian(loss)(x, data), jax.hessian(jax_loss)(x), rtol=1e-10, atol=1e-12)
    again = [_hvps(loss, x, data, v) for _ in range(2)]
    assert all(np.array_equal(a, b) for run in again for a, b in zip(run, (forward, reverse), strict=True))


def test_a_third_derivative_through_the_scatter_s_update(rng):
    """The update that holds the scatter is differentiated again: forward over reverse over reverse."""
    x, v, w = rng.standard_normal(6), rng.standard_normal(6), rng.standard_normal(6)
    hvp = lambda x, pos: hd.sum(hd.grad(interpolated)(x, pos) * v)  # noqa: E731
    expected = jax.jvp(jax.grad(lambda x: jnp.vdot(jax.grad(jax_interpolated)(x), v)), (x,), (w,))[1]
    got = hd.jvp(hd.grad(hvp), (x, POS), (w, None))[1]
    np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-12)


@hd.custom_jvp
def cubes(x, idx):
    return hd.compute(idx.shape, lambda i: x[idx[i]] ** 3)


@cubes.defjvp
def cubes_jvp(primals, tangents):
    """Not the derivative of x ** 3, on purpose: only the rule gives these numbers."""
    (x, idx), (t, _) = primals, tangents
    return cubes(x, idx), hd.compute(idx.shape, lambda i: (hd.cos(x[idx[i]]) + x[idx[i]] ** 2) * t[idx[i]])


@jax.custom_jvp
def jax_cubes(x):
    return x[IDX] ** 3


@jax_cubes.defjvp
def jax_cubes_jvp(primals, tangents):
    (x,), (t,) = primals, tangents
    return jax_cubes(x), (jnp.cos(x[IDX]) + x[IDX] ** 2) * t[IDX]


def test_a_custom_jvp_rule_reading_its_tangent_at_an_index_array_holds_at_every_order(rng):
    x, v = rng.standard_normal(5), rng.standard_normal(5)
    loss = lambda x, idx: hd.sum(hd.sin(cubes(x, idx)))  # noqa: E731
    jax_loss = lambda x: jnp.sum(jnp.sin(jax_cubes(x)))  # noqa: E731
    np.testing.assert_allclose(hd.grad(loss)(x, IDX), jax.grad(jax_loss)(x), rtol=1e-10, atol=1e-12)
    expected = jax.jvp(jax.grad(jax_loss), (x,), (v,))[1]
    for got in _hvps(loss, x, IDX, v):
        np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(hd.hessian(loss)(x, IDX), jax.hessian(jax_loss)(x), rtol=1e-10, atol=1e-12)
    first = hd.grad(loss)(x, IDX)
    assert all(np.array_equal(hd.grad(loss)(x, IDX), first) for _ in range(2))
