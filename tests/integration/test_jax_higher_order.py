"""halide_ad.jax in every mode: jax.jvp, jax.hessian, jax.jacfwd and gradients of gradients of a
wrapped op, against JAX's own derivatives of the same function written in jax.numpy."""
import numpy as np
import pytest

jax = pytest.importorskip("jax")
hd_jax = pytest.importorskip("halide_ad.jax")
import jax.numpy as jnp

import halide_ad as hd

from tests import programs as P
from tests.integration import programs as IP

energy = hd_jax.function(IP.stencil_energy)
take = hd_jax.function(IP.take)
conv2d = hd_jax.function(P.conv2d)


pytestmark = pytest.mark.usefixtures("jax_x64")


def jax_energy(u, target):
    c = jnp.pad(u, 1, mode="edge")
    blur = (c[:-2, 1:-1] + c[2:, 1:-1] + c[1:-1, :-2] + c[1:-1, 2:] + 4 * c[1:-1, 1:-1]) / 8
    tv = jnp.sqrt((c[1:-1, 2:] - c[1:-1, 1:-1]) ** 2 + (c[2:, 1:-1] - c[1:-1, 1:-1]) ** 2 + 0.01)
    return 0.5 * jnp.sum((blur - target) ** 2) + 0.1 * jnp.sum(tv)


@pytest.fixture
def problem(jax_x64):
    rng = np.random.default_rng(5)
    return tuple(jnp.asarray(rng.standard_normal((3, 4))) for _ in range(3))


def test_jvp_and_forward_over_reverse_hvp_match_jax(problem):
    u, target, v = problem
    ours = jax.jvp(lambda x: energy(x, target), (u,), (v,))
    expected = jax.jvp(lambda x: jax_energy(x, target), (u,), (v,))
    np.testing.assert_allclose(ours, expected, rtol=1e-10)
    hvp = lambda f: jax.jvp(jax.grad(lambda x: f(x, target)), (u,), (v,))[1]  # noqa: E731
    np.testing.assert_allclose(hvp(energy), hvp(jax_energy), rtol=1e-10, atol=1e-12)
    assert np.abs(hvp(energy)).max() > 0.01


def test_hessian_matches_jax_also_under_jit_and_in_both_arguments(problem):
    u, target, _ = problem
    ours = jax.jit(jax.hessian(energy, argnums=(0, 1)))(u, target)
    expected = jax.hessian(jax_energy, argnums=(0, 1))(u, target)
    for a, b in zip(jax.tree_util.tree_leaves(ours), jax.tree_util.tree_leaves(expected)):
        assert a.shape == b.shape == (3, 4, 3, 4)
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)


def test_float32_hessian_of_a_single_row():
    jax.config.update("jax_enable_x64", False)
    rng = np.random.default_rng(6)
    u, target = (jnp.asarray(rng.standard_normal((1, 3)), dtype=jnp.float32) for _ in range(2))
    ours = jax.hessian(energy)(u, target)
    assert ours.dtype == jnp.float32
    np.testing.assert_allclose(ours, jax.hessian(jax_energy)(u, target), rtol=1e-4, atol=1e-5)


def test_jacfwd_of_conv_and_reverse_over_reverse_match_jax(rng):
    x = jnp.asarray(rng.standard_normal((1, 2, 4, 4)))
    w = jnp.asarray(rng.standard_normal((2, 2, 2, 2)))
    reference = lambda x, w: jax.lax.conv(x, w, (1, 1), "VALID")  # noqa: E731
    np.testing.assert_allclose(jax.jacfwd(conv2d, argnums=1)(x, w), jax.jacfwd(reference, argnums=1)(x, w),
                               rtol=1e-10, atol=1e-12)
    loss = lambda f: lambda x, w: jnp.sum(jnp.tanh(f(x, w)))  # noqa: E731
    second = lambda f: jax.grad(lambda w: jnp.sum(jax.grad(loss(f), argnums=1)(x, w) ** 2))(w)  # noqa: E731
    np.testing.assert_allclose(second(conv2d), second(reference), rtol=1e-10, atol=1e-12)


def test_gradients_go_through_data_dependent_indices_at_every_order():
    x = jnp.asarray(np.arange(5.0))
    idx = jnp.asarray(np.array([0, 2, 2, 4]))
    np.testing.assert_allclose(jax.grad(lambda x: jnp.sum(take(x, idx) ** 2))(x), [0, 0, 8, 0, 8])
    np.testing.assert_allclose(jax.jvp(lambda x: take(x, idx), (x,), (jnp.ones(5),))[1], np.ones(4))
    cubed = lambda f: lambda x: jnp.sum(f(x, idx) ** 3)  # noqa: E731
    np.testing.assert_allclose(jax.hessian(cubed(take))(x), jax.hessian(cubed(lambda x, i: x[i]))(x), rtol=1e-12)


def test_a_gradient_runs_no_forward_mode_program(rng):
    """jax.grad transposes the JVP rule's tangent program without running it: only fn's own
    forward and gradient kernels are traced."""
    from halide_ad import derived
    fresh = hd.func(P.conv2d.fn)
    x, w = jnp.asarray(rng.standard_normal((1, 2, 4, 4))), jnp.asarray(rng.standard_normal((2, 2, 2, 2)))
    dw = jax.grad(lambda w: jnp.sum(hd_jax.function(fresh)(x, w) ** 2))(w)
    expected = jax.grad(lambda w: jnp.sum(jax.lax.conv(x, w, (1, 1), "VALID") ** 2))(w)
    np.testing.assert_allclose(dw, expected, rtol=1e-10)
    over_arrays = hd_jax._over_arrays(fresh, 2, (0, 1), ())  # what the primitive runs
    assert over_arrays._calls  # (ran)
    tangent = derived.tangent_program(over_arrays, (1,), 2)  # the JVP rule's, in w
    assert tangent in derived._tangents and not tangent._calls
