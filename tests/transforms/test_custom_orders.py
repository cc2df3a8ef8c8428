"""A custom_jvp rule holds at every order: reverse mode is the transpose of the rule at the real
primal, so gradients of gradients differentiate the rule's dependence on x like any program's.
Checked against the analytic derivatives of softplus, against jax.custom_jvp with the same rule
(a rule that is not fn's derivative, so only the rule can give the numbers) and against finite
differences, all in float64."""
import numpy as np
import pytest

import halide_ad as hd

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

pytestmark = pytest.mark.usefixtures("jax_x64")


@hd.custom_jvp
def softplus(x):
    return hd.compute(x.shape, lambda i: hd.log1p(hd.exp(x[i])))


@softplus.defjvp
def softplus_jvp(primals, tangents):
    (x,), (t,) = primals, tangents
    return softplus(x), hd.compute(x.shape, lambda i: hd.sigmoid(x[i]) * t[i])


@hd.custom_jvp
def blur(x, w):
    """A clamped 3-tap blur of x ** 3 whose rule says the derivative of x ** 3 is cos(x) + x ** 2,
    on purpose: w's tangent is the true one, x's is the rule's."""
    xc, r = hd.repeat_edge(x), hd.rdom(3)
    return hd.compute(x.shape, lambda i: hd.sum(w[r] * xc[i + r - 1] ** 3))


@blur.defjvp
def blur_jvp(primals, tangents):
    (x, w), (t, tw) = primals, tangents
    xc, tc, r = hd.repeat_edge(x), hd.repeat_edge(t), hd.rdom(3)
    return blur(x, w), hd.compute(x.shape, lambda i: hd.sum(
        w[r] * (hd.cos(xc[i + r - 1]) + xc[i + r - 1] ** 2) * tc[i + r - 1] + tw[r] * xc[i + r - 1] ** 3))


@jax.custom_jvp
def jax_blur(x, w):
    c = jnp.pad(x, 1, mode="edge") ** 3
    return w[0] * c[:-2] + w[1] * c[1:-1] + w[2] * c[2:]


@jax_blur.defjvp
def jax_blur_jvp(primals, tangents):
    (x, w), (t, tw) = primals, tangents
    c, d, tc = (jnp.pad(a, 1, mode="edge") for a in (x, jnp.cos(x) + x ** 2, t))
    dc, cube = d * tc, c ** 3
    return jax_blur(x, w), (w[0] * dc[:-2] + w[1] * dc[1:-1] + w[2] * dc[2:]
                            + tw[0] * cube[:-2] + tw[1] * cube[1:-1] + tw[2] * cube[2:])


def energy(x, w):
    return hd.sum(hd.sin(blur(x, w)))


def jax_energy(x, w):
    return jnp.sum(jnp.sin(jax_blur(x, w)))


def along(gradient, v):
    """x -> the derivative of gradient along v: <gradient(x), v>, differentiated again."""
    return lambda x, w: hd.grad(lambda x: hd.sum(gradient(x, w) * v))(x)


def sigmoid(x):
    return 1 / (1 + np.exp(-x))


def test_softplus_up_to_the_fourth_derivative_by_reverse_mode(rng):
    x = rng.standard_normal(6) * 2
    s = sigmoid(x)
    expected = [s, s * (1 - s), s * (1 - s) * (1 - 2 * s), s * (1 - s) * (1 - 6 * s + 6 * s * s)]
    derivative = lambda x: softplus(x)  # noqa: E731
    for k, want in enumerate(expected):
        derivative = (lambda d: lambda x: hd.grad(lambda y: hd.sum(d(y)))(x))(derivative)
        np.testing.assert_allclose(derivative(x), want, rtol=1e-12, atol=1e-15, err_msg=f"order {k + 1}")


def test_third_derivatives_of_a_stencil_rule_match_jax_in_every_mix_of_modes(rng):
    """d³E[v, v, ·] by reverse over reverse over reverse, and forward over reverse over reverse,
    against JAX's; E's third derivative reads the rule's second derivative in x."""
    x, w, v = rng.standard_normal(7), rng.standard_normal(3), rng.standard_normal(7)
    g1 = hd.grad(energy)
    rrr = along(along(g1, v), v)(x, w)
    frr = hd.jvp(lambda x: along(g1, v)(x, w), (x,), (v,))[1]
    jg1 = jax.grad(jax_energy)
    jg2 = lambda x: jax.grad(lambda x: jnp.vdot(jg1(x, w), v))(x)  # noqa: E731
    expected = np.asarray(jax.grad(lambda x: jnp.vdot(jg2(x), v))(x))
    assert np.abs(expected).max() > 0.1
    np.testing.assert_allclose(rrr, expected, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(frr, expected, rtol=1e-10, atol=1e-12)
    hvp = hd.jvp(lambda x: g1(x, w), (x,), (v,))[1]
    np.testing.assert_allclose(hvp, jax.jvp(lambda x: jg1(x, w), (x,), (v,))[1], rtol=1e-10, atol=1e-12)


def test_gradients_in_w_go_through_the_rule_too(rng):
    x, w = rng.standard_normal(7), rng.standard_normal(3)
    ours = hd.hessian(lambda w: energy(x, w))(w)
    np.testing.assert_allclose(ours, jax.hessian(lambda w: jax_energy(x, w))(w), rtol=1e-10, atol=1e-12)
    mixed = hd.grad(lambda x, w: hd.sum(hd.grad(energy, argnums=1)(x, w)))(x, w)
    expected = jax.grad(lambda x: jnp.sum(jax.grad(jax_energy, argnums=1)(x, w)))(x)
    np.testing.assert_allclose(mixed, expected, rtol=1e-10, atol=1e-12)


def test_a_rule_that_is_the_true_derivative_passes_check_grad_at_order_2_and_finite_differences_at_3(rng):
    x, v = rng.standard_normal(5), rng.standard_normal(5)
    assert hd.check_grad(softplus, x, order=2) < 1e-6
    second = lambda x: along(lambda x, w: hd.grad(lambda y: hd.sum(softplus(y)))(x), v)(x, None)  # noqa: E731
    third = hd.grad(lambda x: hd.sum(second(x) * v))(x)
    eps = 1e-5
    numeric = (second(x + eps * v) - second(x - eps * v)) / (2 * eps)
    np.testing.assert_allclose(third @ v, numeric @ v, rtol=1e-6)


def test_inf_and_nan_inputs_stay_where_they_are(rng):
    """The forward pass computes fn only: an inf or nan input gives fn's value there and leaves
    the other elements' values and gradients alone."""
    x = np.array([0.5, np.inf, -1.0, np.nan])
    np.testing.assert_array_equal(softplus(x)[[1, 3]], [np.inf, np.nan])
    g = hd.grad(lambda x: hd.sum(softplus(x)))(x)
    np.testing.assert_allclose(g[[0, 2]], sigmoid(x[[0, 2]]), rtol=1e-14)
    assert g[1] == 1.0 and np.isnan(g[3])


@hd.custom_jvp
def square(x):
    return hd.compute(x.shape, lambda i: x[i] * x[i])


@square.defjvp
def square_jvp(primals, tangents):  # 3x where 2x is true: the rule's use is visible
    (x,), (t,) = primals, tangents
    return square(x), hd.compute(x.shape, lambda i: 3.0 * x[i] * t[i])


@hd.custom_jvp
def cube(x):
    return hd.compute(x.shape, lambda i: x[i] * x[i] * x[i] / 3.0)


@cube.defjvp
def cube_jvp(primals, tangents):  # its factor comes from another custom_jvp function
    (x,), (t,) = primals, tangents
    s = square(x)
    return cube(x), hd.compute(x.shape, lambda i: s[i] * t[i])


def test_a_rule_that_calls_another_custom_function_uses_that_ones_rule_at_every_order(rng):
    """cube's gradient is square(x); its second and third derivatives are square's rule, 3x and 3,
    as JAX gives them, not the 2x and 2 of differentiating square's body."""
    x = rng.standard_normal(5)
    derivative = lambda x: cube(x)  # noqa: E731
    for k, want in enumerate([x * x, 3 * x, np.full(5, 3.0)]):
        derivative = (lambda d: lambda x: hd.grad(lambda y: hd.sum(d(y)))(x))(derivative)
        np.testing.assert_allclose(derivative(x), want, rtol=1e-12, err_msg=f"order {k + 1}")
    np.testing.assert_allclose(hd.jvp(hd.grad(lambda y: hd.sum(cube(y))), (x,), (np.ones(5),))[1], 3 * x, rtol=1e-12)


@jax.custom_jvp
def jax_softplus(x):
    return jnp.log1p(jnp.exp(x))


jax_softplus.defjvp(lambda p, t: (jax_softplus(p[0]), jax.nn.sigmoid(p[0]) * t[0]))


def test_hessian_vector_products_through_two_rules_match_jax_both_ways(rng):
    """Forward over reverse through softplus then blur: the gradient reads the rules' factors,
    whose tangents forward mode takes like any Func's."""
    x, w, v = rng.standard_normal(7), rng.standard_normal(3), rng.standard_normal(7)
    loss = lambda x: energy(softplus(x), w)  # noqa: E731
    expected = jax.jvp(jax.grad(lambda x: jax_energy(jax_softplus(x), w)), (x,), (v,))[1]
    np.testing.assert_allclose(hd.jvp(hd.grad(loss), (x,), (v,))[1], expected, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(hd.grad(lambda x: hd.sum(hd.grad(loss)(x) * v))(x), expected, rtol=1e-10, atol=1e-12)
