"""Gradients through update definitions taken while tracing (halide_ad/retrace_scan.py), so that
they are differentiated again: Hessian-vector products through a scan and a histogram, both
ways, against JAX and finite differences; and the refusal for taped updates."""
import numpy as np
import pytest

import halide_ad as hd
from halide_ad import ops
from tests.updates import programs as P


def iir_energy(a, b):
    return hd.sum(hd.sin(P.iir(a, b)) * P.iir(a, b))


def histogram_energy(w, idx):
    return hd.sum(hd.exp(P.histogram(idx, w, 5) * 0.5))


def _hvps(loss, args, v):
    """(forward over reverse, reverse over reverse) along v in the first argument."""
    rest = tuple(None for _ in args[1:])
    forward = hd.jvp(hd.grad(loss), args, (v, *rest))[1]
    reverse = hd.grad(lambda x, *others: hd.sum(hd.grad(loss)(x, *others) * v))(*args)
    return forward, reverse


def _fd_hvp(loss, args, v, eps=1e-6):
    g = hd.grad(loss)
    return (g(args[0] + eps * v, *args[1:]) - g(args[0] - eps * v, *args[1:])) / (2 * eps)


def test_hvp_through_a_scan_matches_jax_both_ways(rng, jax_x64):
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    a, b, v = rng.random((3, 6)), rng.random((3, 6)), rng.standard_normal((3, 6))

    def jax_iir(a, b):
        def step(y, ab):
            y = ab[0] * y + ab[1]
            return y, y
        _, ys = jax.lax.scan(step, b[:, 0], (a[:, 1:].T, b[:, 1:].T))
        return jnp.concatenate([b[:, :1], ys.T], axis=1)

    def jax_energy(a):
        y = jax_iir(a, b)
        return jnp.sum(jnp.sin(y) * y)

    expected = jax.jvp(jax.grad(jax_energy), (a,), (v,))[1]
    forward, reverse = _hvps(iir_energy, (a, b), v)
    np.testing.assert_allclose(forward, expected, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(reverse, expected, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(forward, _fd_hvp(iir_energy, (a, b), v), rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(hd.hessian(iir_energy, argnums=1)(a, b), jax.hessian(lambda b: jnp.sum(
        jnp.sin(jax_iir(a, b)) * jax_iir(a, b)))(b), rtol=1e-11, atol=1e-12)


def test_hvp_through_a_histogram_a_nonlinear_scan_and_two_updates_matches_finite_differences(rng):
    idx = rng.integers(-1, 6, 12)
    cases = [(histogram_energy, (rng.random(12), idx)),
             (lambda w, u: hd.sum(P.rnn(w, u) ** 3), (rng.standard_normal(1), rng.standard_normal(6))),
             (lambda x: hd.sum(hd.sin(P.two_updates(x))), (rng.random(9),))]
    for loss, args in cases:
        v = rng.standard_normal(args[0].shape)
        forward, reverse = _hvps(loss, args, v)
        np.testing.assert_allclose(forward, reverse, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(forward, _fd_hvp(loss, args, v), rtol=1e-6, atol=1e-8)


def test_hvp_is_symmetric_through_a_scan(rng):
    # test_hvp_through_a_scan_matches_jax_both_ways's shapes: its kernels serve this test (a new shape
    # would compile every kernel again)
    a, b = rng.random((3, 6)), rng.random((3, 6))
    v, w = rng.standard_normal((3, 6)), rng.standard_normal((3, 6))
    hv = _hvps(iir_energy, (a, b), v)[0]
    hw = _hvps(iir_energy, (a, b), w)[0]
    np.testing.assert_allclose(np.vdot(w, hv), np.vdot(v, hw), rtol=1e-12)


def test_a_traced_gradient_through_a_taped_update_is_refused_with_the_way_out(rng):
    x = rng.random((3, 4))
    loss = lambda x: hd.sum(P.row_max(x) ** 2)  # noqa: E731  (an in-place max over colliding writes)
    with pytest.raises(hd.NotDifferentiableError, match=r"runs the update of .* backwards from a record of "
                                                         r"what each point overwrote.*hd.jvp goes through"):
        hd.jvp(hd.grad(loss), (x,), (x,))
    # the way out it names: a gradient at the top level, and forward mode over forward mode
    np.testing.assert_allclose(hd.grad(loss)(x), 2 * np.where(x == x.max(1, keepdims=True), x, 0))
    hd.check_grad(lambda x: P.row_max(x), x, modes=("fwd",), order=2)
    # and reverse over forward at the top level: the gradient of Horner's tangent (a dual update)
    c, z, tc, tz = rng.standard_normal(3), rng.standard_normal(2), rng.standard_normal(3), rng.standard_normal(2)
    hd.check_grad(lambda c, z: hd.jvp(P.horner, (c, z), (tc, tz))[1], c, z, modes=("rev",))


def test_the_jax_wrapper_of_a_scan_under_jvp_and_hessian(rng, jax_x64):
    jax = pytest.importorskip("jax")
    import halide_ad.jax as hd_jax
    jnp = jax.numpy
    a, b = rng.random((2, 4)), rng.random((2, 4))

    def reference(a):
        y = [b[:, 0]]
        for n in range(1, 4):
            y.append(a[:, n] * y[-1] + b[:, n])
        return jnp.sum(jnp.sin(jnp.stack(y, axis=1)))

    wrapped = lambda a: jnp.sum(jnp.sin(hd_jax.function(P.iir)(a, b)))  # noqa: E731
    np.testing.assert_allclose(jax.jvp(wrapped, (a,), (b,))[1], jax.jvp(reference, (a,), (b,))[1], rtol=1e-12)
    np.testing.assert_allclose(jax.hessian(wrapped)(a), jax.hessian(reference)(a), rtol=1e-10, atol=1e-14)


def test_second_order_every_mode_through_scans_whose_start_is_nonlinear(rng):
    """rnn's start is tanh(u), whose derivative reads tanh(u); cumprod's value reads the element
    it overwrites: each derivative program reads the scan's start, which is computed where it is
    read so that the scan stays its only reader when differentiated again."""
    hd.check_grad(P.rnn, rng.standard_normal(1), rng.standard_normal(4), modes=("rev", "fwd"), order=2)
    hd.check_grad(ops.cumprod, rng.random((2, 3)) + 0.5, 1, modes=("rev",), order=2)
