"""halide_ad.jax: an @hd.func as a JAX primitive over jax.pure_callback."""
import numpy as np
import pytest

jax = pytest.importorskip("jax")
hd_jax = pytest.importorskip("halide_ad.jax")
import jax.numpy as jnp

from tests import programs as P
from tests.integration import programs as IP

conv2d = hd_jax.function(P.conv2d)
blur1d = hd_jax.function(P.blur1d)


pytestmark = pytest.mark.usefixtures("jax_x64")


def reference_conv(x, w):
    return jax.lax.conv(x, w, (1, 1), "VALID")


def test_grad_matches_lax_conv(rng):
    x = jnp.asarray(rng.standard_normal((2, 3, 6, 7)))
    w = jnp.asarray(rng.standard_normal((4, 3, 3, 2)))
    np.testing.assert_allclose(conv2d(x, w), reference_conv(x, w), rtol=1e-12, atol=1e-12)
    loss = lambda f: lambda x, w: jnp.sum(jnp.tanh(f(x, w)))
    got = jax.grad(loss(conv2d), argnums=(0, 1))(x, w)
    want = jax.grad(loss(reference_conv), argnums=(0, 1))(x, w)
    for g, r in zip(got, want, strict=True):
        assert g.dtype == jnp.float64
        np.testing.assert_allclose(g, r, rtol=1e-10, atol=1e-12)
    jitted = jax.jit(jax.grad(loss(conv2d), argnums=1))(x, w)
    np.testing.assert_allclose(jitted, want[1], rtol=1e-10, atol=1e-12)


def test_check_grads_with_static_argument_and_vmap(rng):
    from jax.test_util import check_grads
    a = jnp.asarray(rng.standard_normal(6))
    check_grads(lambda t: blur1d(t, "mirror"), (a,), order=1, modes=["rev"])
    batch = jnp.stack([a, 2 * a])
    out = jax.vmap(lambda t: blur1d(t, "mirror"))(batch)
    np.testing.assert_allclose(out[1], 2 * out[0])
    g = jax.grad(lambda b: jnp.sum(jax.vmap(lambda t: blur1d(t, "mirror"))(b) ** 2))(batch)
    np.testing.assert_allclose(g[1], 2 * g[0])  # d/db |J b|^2 = 2 J^T J b: linear in b


def test_integer_inputs_and_structured_outputs():
    x = jnp.arange(5.0)
    idx = jnp.array([4, 0, 0, 2])
    g = jax.grad(lambda x: jnp.sum(hd_jax.function(IP.take)(x, idx)))(x)
    np.testing.assert_allclose(g, [2.0, 0, 1, 0, 1])

    f = hd_jax.function(IP.scale_shift)
    a = jnp.linspace(-1.0, 1.0, 5)
    res = f(x, a, 0.5)
    np.testing.assert_allclose(res["y"], a * x + 0.5)
    gx, ga = jax.grad(lambda x, a: jnp.sum(f(x, a, 0.5)["y"]) + f(x, a, 0.5)["sq"], argnums=(0, 1))(x, a)
    np.testing.assert_allclose(gx, a + 2 * x)
    np.testing.assert_allclose(ga, x)


def test_float32_without_x64():
    jax.config.update("jax_enable_x64", False)
    x = jnp.ones((1, 1, 4, 4), jnp.float32)
    w = jnp.ones((1, 1, 2, 2), jnp.float32)
    g = jax.grad(lambda w: jnp.sum(conv2d(x, w)))(w)
    assert g.dtype == jnp.float32
    np.testing.assert_allclose(g, np.full((1, 1, 2, 2), 9.0))
