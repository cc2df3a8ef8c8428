"""@hd.custom_jvp and @hd.custom_vjp: the rules are used in every mode they cover (a rule scaled on
purpose shows up in grad, vjp and jvp), compose inside @hd.func, and bad rules get clear errors."""
import numpy as np
import pytest

import halide_ad as hd


def softplus_body(x):
    return hd.compute(x.shape, lambda i: hd.log1p(hd.exp(x[i])))


@hd.custom_jvp
def softplus(x):
    return softplus_body(x)


@softplus.defjvp
def softplus_jvp(primals, tangents):
    (x,), (t,) = primals, tangents
    return softplus_body(x), hd.compute(x.shape, lambda i: hd.sigmoid(x[i]) * t[i])


@hd.custom_jvp
def scaled(x):  # the true derivative is 1; the rule says 3, so the rule's use is visible
    return hd.compute(x.shape, lambda i: x[i] * 1.0)


@scaled.defjvp
def scaled_jvp(primals, tangents):
    (x,), (t,) = primals, tangents
    return scaled(x), hd.compute(x.shape, lambda i: 3.0 * t[i])


@hd.custom_vjp
def clip_gradient(x, lo, hi):
    return x


def clip_fwd(x, lo, hi):
    return x, (lo, hi)


def clip_bwd(res, g):
    lo, hi = res
    return (hd.compute(g.shape, lambda i: hd.clamp(g[i], lo, hi)), None, None)


clip_gradient.defvjp(clip_fwd, clip_bwd)


@hd.custom_vjp
def smooth_sum(x, w):
    """A subgraph (a weighted window sum) whose whole gradient is given: bwd sums over a window."""
    r = hd.rdom(3)
    return hd.compute((x.shape[0] - 2,), lambda i: hd.sum(x[i + r] * w[r]))


def smooth_fwd(x, w):
    return smooth_sum.fn(x, w), (x, w)


def smooth_bwd(res, g):
    x, w = res
    gc = hd.constant_exterior(g)
    r = hd.rdom(3)
    dx = hd.compute(x.shape, lambda j: hd.sum(gc[j - r] * w[r]) * 2.0)  # scaled by 2 on purpose
    k = hd.rdom(g.shape[0])
    dw = hd.compute(w.shape, lambda s: hd.sum(g[k] * x[k + s]))
    return dx, dw


smooth_sum.defvjp(smooth_fwd, smooth_bwd)


def sigmoid(x):
    return 1 / (1 + np.exp(-x))


def test_custom_jvp_value_and_every_mode(rng):
    x = rng.standard_normal(5)
    np.testing.assert_allclose(softplus(x), np.log1p(np.exp(x)), rtol=1e-14)
    assert hd.check_grad(softplus, x, modes=("rev", "fwd")) < 1e-6
    assert hd.check_grad(softplus, x, modes=("fwd",), order=2) < 1e-5


def test_a_scaled_jvp_rule_shows_up_in_grad_vjp_and_jvp(rng):
    x, t = rng.standard_normal(4), rng.standard_normal(4)
    np.testing.assert_array_equal(scaled(x), x)
    np.testing.assert_allclose(hd.grad(lambda x: hd.sum(scaled(x) * x))(x), 3 * x + x)
    np.testing.assert_allclose(hd.vjp(scaled, x)[1](t)[0], 3 * t)
    np.testing.assert_allclose(hd.jvp(scaled, (x,), (t,))[1], 3 * t)


@hd.func
def uses_softplus(x, w):
    y = softplus(hd.compute(x.shape, lambda i: x[i] * w[i]))
    return hd.sum(y * y)


def test_custom_jvp_inside_an_hd_func(rng):
    x, w, tx, tw = (rng.standard_normal(5) for _ in range(4))
    g = hd.grad(uses_softplus, argnums=(0, 1))(x, w)
    s = np.log1p(np.exp(x * w))
    outer = 2 * s * sigmoid(x * w)
    np.testing.assert_allclose(g[0], outer * w, rtol=1e-12)
    np.testing.assert_allclose(g[1], outer * x, rtol=1e-12)
    np.testing.assert_allclose(hd.jvp(uses_softplus, (x, w), (tx, tw))[1], outer @ (tx * w + x * tw), rtol=1e-12)


def test_custom_vjp_clips_the_gradient(rng):
    x = np.array([-2.0, -0.1, 0.0, 0.1, 2.0])
    g = hd.grad(lambda x: hd.sum(clip_gradient(x * 5.0, -1.0, 1.0) ** 2))(x)
    np.testing.assert_allclose(g, 5 * np.clip(10 * x, -1, 1))
    np.testing.assert_array_equal(clip_gradient(x, -1.0, 1.0), x)


def test_custom_vjp_of_a_subgraph_is_used_in_grad_and_vjp(rng):
    x, w, c = rng.standard_normal(7), rng.standard_normal(3), rng.standard_normal(5)
    out, vjp = hd.vjp(smooth_sum, x, w)
    np.testing.assert_allclose(out, np.correlate(x, w, "valid"), rtol=1e-12)
    dx, dw = vjp(c)
    np.testing.assert_allclose(dx, 2.0 * np.convolve(c, w, "full"), rtol=1e-12)  # the rule's factor 2
    np.testing.assert_allclose(dw, np.correlate(x, c, "valid"), rtol=1e-12)
    g = hd.grad(lambda x, w: hd.sum(smooth_sum(hd.tanh(x), w)), argnums=0)(x, w)
    np.testing.assert_allclose(g, 2.0 * np.convolve(np.ones(5), w, "full") * (1 - np.tanh(x) ** 2), rtol=1e-12)


def test_custom_vjp_holds_in_a_gradient_taken_while_tracing(rng):
    """A gradient inside a traced function (halide_ad/retrace.py) uses the rule too, not the
    derivative of what fwd computed: the subgraph's rule doubles the input's gradient."""
    x, w = rng.standard_normal(7), rng.standard_normal(3)
    traced = hd.func(lambda x, w: hd.grad(lambda y: hd.sum(smooth_sum(y, w)))(x))
    np.testing.assert_allclose(traced(x, w), hd.grad(lambda y: hd.sum(smooth_sum(y, w)))(x), rtol=1e-12)
    np.testing.assert_allclose(traced(x, w), 2.0 * np.convolve(np.ones(5), w, "full"), rtol=1e-12)
    clipped = hd.func(lambda x: hd.grad(lambda y: hd.sum(clip_gradient(y * 5.0, -1.0, 1.0) ** 2))(x))
    x = np.array([-2.0, -0.1, 0.0, 0.1, 2.0])
    np.testing.assert_allclose(clipped(x), 5 * np.clip(10 * x, -1, 1))


def _rows_bwd(assign: bool):
    def bwd(res, g):
        x, idx = res
        d, r = hd.zeros(x.shape, x.dtype), hd.rdom(idx.shape[0])
        if assign:
            d[idx[r]] = g[r]
        else:
            d[idx[r]] += g[r] * 3.0  # scaled by 3 on purpose
        return d, None
    return bwd


def _rows(assign: bool):
    rows = hd.custom_vjp(lambda x, idx: hd.compute(idx.shape, lambda i: x[idx[i]]))
    rows.defvjp(lambda x, idx: (rows.fn(x, idx), (x, idx)), _rows_bwd(assign))
    return rows


def test_a_custom_vjp_bwd_that_accumulates_into_zeros(rng):
    """bwd's update `d[idx[r]] += ...` is its scatter, in grad and in a gradient's gradient."""
    x, idx, c = rng.standard_normal(4), np.array([0, 2, 2, 3, 0]), rng.standard_normal(5)
    rows = _rows(assign=False)
    expected = 3.0 * np.bincount(idx, c, minlength=4)
    np.testing.assert_allclose(hd.grad(lambda x: hd.sum(rows(x, idx) * c))(x), expected, rtol=1e-12)
    np.testing.assert_allclose(hd.grad(lambda x: hd.sum(hd.grad(lambda y: hd.sum(rows(y, idx) * c))(x) * x))(x),
                               expected, rtol=1e-12)
    with pytest.raises(hd.NotDifferentiableError, match="gives x .* not an accumulation .*hd.zeros"):
        hd.grad(lambda x: hd.sum(_rows(assign=True)(x, idx) * c))(x)


def test_jvp_through_custom_vjp_names_custom_jvp(rng):
    with pytest.raises(hd.NotDifferentiableError, match="custom_vjp function clip_gradient.*@hd.custom_jvp"):
        hd.jvp(lambda x: clip_gradient(x, -1.0, 1.0), (np.ones(3),), (np.ones(3),))


# ---- bad rules --------------------------------------------------------------------------------

def test_rule_arity():
    f = hd.custom_jvp(lambda x: x)
    with pytest.raises(hd.TraceError, match=r"must take \(primals, tangents\)"):
        f.defjvp(lambda primals: primals)
    g = hd.custom_vjp(lambda x: x)
    with pytest.raises(hd.TraceError, match=r"must take \(residuals, cotangent\)"):
        g.defvjp(lambda x: (x, None), lambda g: g)
    g.defvjp(lambda x, y: (x, None), lambda res, g: (g,))
    with pytest.raises(hd.TraceError, match="fwd of the custom_vjp function <lambda>.*must take the 1 argument"):
        g(np.ones(2))


def test_missing_rule():
    f = hd.custom_jvp(lambda x: x * 2.0)
    with pytest.raises(hd.TraceError, match="has no rule: define one with"):
        f(np.ones(2))


def custom_vjp_with(bwd_result):
    f = hd.custom_vjp(lambda x: x * 2.0)
    f.defvjp(lambda x: (x * 2.0, None), lambda res, g: bwd_result(g))
    return f


@pytest.mark.parametrize("bwd_result, error, message", [
    (lambda g: (g, g), hd.TraceError, "bwd of the custom_vjp function <lambda> returned a tuple of length 2; "
                                      "it must return a tuple of 1"),
    (lambda g: g, hd.TraceError, "returned a Tensor; it must return a tuple of 1"),
    (lambda g: (hd.compute((2,), lambda i: g[i]),), hd.ShapeError,
     r"cotangent 0 returned by bwd .* has shape \(2,\); it must have shape \(3,\)"),
    (lambda g: (hd.cast(g, "float32"),), hd.DTypeError, "cotangent 0 returned by bwd .* is float32; it must be float64"),
])
def test_bad_cotangents(bwd_result, error, message):
    f = custom_vjp_with(bwd_result)
    with pytest.raises(error, match=message):
        hd.grad(lambda x: hd.sum(f(x)))(np.ones(3))


def custom_jvp_with(tangent):
    f = hd.custom_jvp(lambda x: x * 2.0)
    f.defjvp(lambda p, t: (p[0] * 2.0, tangent(p[0], t[0])))
    return f


@pytest.mark.parametrize("tangent, error, message", [
    (lambda x, t: t * t, hd.NotDifferentiableError, "not linear in the tangents"),
    (lambda x, t: t + 1.0, hd.NotDifferentiableError, "not linear in the tangents"),
    (lambda x, t: hd.exp(t), hd.NotDifferentiableError, "not linear in the tangents"),
    (lambda x, t: hd.where(t > 0, t, 0.0), hd.NotDifferentiableError, "not linear in the tangents"),
    (lambda x, t: hd.sum(t), hd.ShapeError, r"tangent 0 returned by the rule .* has shape \(\); it must have shape \(3,\)"),
])
def test_bad_tangents(tangent, error, message):
    f = custom_jvp_with(tangent)
    with pytest.raises(error, match=message):
        hd.jvp(f, (np.ones(3),), (np.ones(3),))


def test_linear_rules_pass_the_check(rng):
    f = custom_jvp_with(lambda x, t: hd.sin(x) * t / (1.0 + x * x) - hd.where(x > 0, t, 0.0))
    x, t = rng.standard_normal(3), rng.standard_normal(3)
    expected = np.sin(x) * t / (1 + x * x) - np.where(x > 0, t, 0)
    np.testing.assert_allclose(hd.jvp(f, (x,), (t,))[1], expected, rtol=1e-12)


def test_reverse_over_forward_through_a_rule(rng):
    """The gradient of a jvp differentiates the rule's tangent program: softplus'' = s (1 - s)."""
    x, t = rng.standard_normal(4), rng.standard_normal(4)
    hvp = hd.grad(lambda x: hd.sum(hd.jvp(softplus, (x,), (t,))[1]))(x)
    np.testing.assert_allclose(hvp, sigmoid(x) * (1 - sigmoid(x)) * t, rtol=1e-12)


@hd.custom_jvp
def power_pair(x, p):
    """(x ** p, x ** (p + 1)) with a static p."""
    return hd.compute(x.shape, lambda i: x[i] ** p), hd.compute(x.shape, lambda i: x[i] ** (p + 1))


@power_pair.defjvp
def power_pair_jvp(primals, tangents):
    (x, p), (t, t_p) = primals, tangents
    assert t_p is None  # a static argument has no tangent
    return power_pair(x, p), (hd.compute(x.shape, lambda i: p * x[i] ** (p - 1) * t[i]),
                              hd.compute(x.shape, lambda i: (p + 1) * x[i] ** p * t[i]))


@hd.custom_vjp
def split_scale(x):
    return x * 2.0, x * 3.0


split_scale.defvjp(lambda x: (split_scale.fn(x), None),
                   lambda res, g: (hd.compute(g[0].shape, lambda i: 2.0 * g[0][i] + 3.0 * g[1][i]),))


def test_several_outputs_and_a_static_argument(rng):
    x, t = rng.random(4) + 0.5, rng.standard_normal(4)
    out, tangent = hd.jvp(power_pair, (x, 3), (t, None))
    np.testing.assert_allclose(out[0], x ** 3)
    np.testing.assert_allclose(tangent[0], 3 * x ** 2 * t, rtol=1e-12)
    np.testing.assert_allclose(tangent[1], 4 * x ** 3 * t, rtol=1e-12)
    assert hd.check_grad(lambda x: power_pair(x, 2), x) < 1e-6
    c0, c1 = rng.standard_normal(4), rng.standard_normal(4)
    (g,) = hd.vjp(split_scale, x)[1]((c0, c1))
    np.testing.assert_allclose(g, 2 * c0 + 3 * c1)


@hd.custom_jvp
def take(x, idx):
    return hd.compute(idx.shape, lambda i: x[idx[i]] * 2.0)


@take.defjvp
def take_jvp(primals, tangents):
    (x, idx), (t, _) = primals, tangents
    return take(x, idx), hd.compute(idx.shape, lambda i: t[idx[i]] * 2.0)


def test_a_rule_whose_transpose_scatters_to_data_dependent_places_works_in_both_modes():
    """The transpose of `t[idx[i]]` scatters to data-dependent places: an update of the cotangent,
    held in the Override as that scatter (tests/compose/test_data_dependent_orders.py: every order)."""
    x, idx = np.arange(4.0), np.array([0, 2, 2, 3])
    np.testing.assert_array_equal(hd.jvp(lambda x: take(x, idx), (x,), (np.arange(4.0),))[1], 2 * x[idx])
    np.testing.assert_array_equal(hd.grad(lambda x: hd.sum(take(x, idx)))(x), [2.0, 0, 4, 2])
