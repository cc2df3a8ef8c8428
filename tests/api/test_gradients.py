"""Gradients against float64 central finite differences, and against PyTorch where it has the op."""
import re

import numpy as np
import pytest

import halide_ad as hd
from halide_ad import ops
from tests import programs as P


@pytest.mark.parametrize("view", list(P.VIEWS))
def test_blur_1d_and_2d_under_each_view(view, rng):
    hd.check_grad(P.blur1d, rng.random(6), view)
    hd.check_grad(P.blur2d, rng.random((5, 6)), view)


def test_blur_boundary_pixels_exact():
    """repeat_edge sends the gradient of the pixels beyond the edge to the edge pixel."""
    _, f_vjp = hd.vjp(P.blur1d, np.zeros(4), "repeat_edge")
    (g, _) = f_vjp(np.array([1.0, 0.0, 0.0, 0.0]))
    np.testing.assert_allclose(g, [0.75, 0.25, 0.0, 0.0])  # c[-1] -> x[0]: 1/4 + 2/4
    _, f_vjp = hd.vjp(P.blur1d, np.zeros(4), "mirror")
    (g, _) = f_vjp(np.array([1.0, 0.0, 0.0, 0.0]))
    np.testing.assert_allclose(g, [0.5, 0.5, 0.0, 0.0])  # c[-1] reads x[1]


def test_conv2d_maxpool_dense_softmax_chain(rng):
    hd.check_grad(P.conv2d, rng.standard_normal((2, 3, 6, 7)), rng.standard_normal((4, 3, 3, 2)))
    hd.check_grad(P.maxpool2, rng.standard_normal((2, 3, 6, 8)))
    hd.check_grad(P.dense, rng.standard_normal((3, 5)), rng.standard_normal((5, 4)), rng.standard_normal(4))
    hd.check_grad(P.softmax, rng.standard_normal((3, 6)))
    hd.check_grad(P.chain, rng.standard_normal(7))


def test_two_stage_pipeline_and_fan_out(rng):
    hd.check_grad(P.blur_pool, rng.standard_normal((6, 8)))
    hd.check_grad(P.fan_out, rng.standard_normal(6))


def test_taylor_remainder_shrinks_quadratically(rng):
    """|f(x+ht) - f(x) - h<g,t>| falls ~100x when h falls 10x: no tolerance to tune."""
    loss = lambda x, w: hd.sum(P.conv2d(x, w) ** 2)  # noqa: E731
    x, w = rng.standard_normal((1, 2, 5, 5)), rng.standard_normal((3, 2, 3, 3))
    t = rng.standard_normal(x.shape)
    f0, g = hd.value_and_grad(loss)(x, w)
    f = hd.func(loss)
    rem = [abs(f(x + h * t, w) - f0 - h * np.vdot(g, t)) for h in (1e-2, 1e-3)]
    assert 50 < rem[0] / rem[1] < 200


def test_maxpool_ties_go_to_first_element():
    x = np.ones((1, 1, 2, 2))
    _, f_vjp = hd.vjp(P.maxpool2, x)
    np.testing.assert_array_equal(f_vjp(np.ones((1, 1, 1, 1)))[0], [[[[1.0, 0.0], [0.0, 0.0]]]])


def test_maximum_splits_ties_and_relu_abs_are_zero_at_zero():
    f = hd.func(lambda a, b: hd.maximum(a, b) + hd.relu(a) + hd.abs(b))
    _, f_vjp = hd.vjp(f, np.array([0.0, 1.0]), np.array([0.0, 2.0]))
    ga, gb = f_vjp(np.ones(2))
    np.testing.assert_array_equal(ga, [0.5, 1.0])
    np.testing.assert_array_equal(gb, [0.5, 2.0])


def test_grad_argnums_dtypes_and_vjp_structure(rng):
    x32 = rng.random((4, 5)).astype(np.float32)
    g = hd.grad(lambda im: hd.sum(P.blur3(im) ** 2))(x32)
    assert g.dtype == np.float32 and g.shape == x32.shape
    a, w, b = rng.random((2, 3)), rng.random((3, 2)), rng.random(2)
    gw, gb = hd.grad(lambda a, w, b: hd.sum(P.dense(a, w, b)), argnums=(1, 2))(a, w, b)
    np.testing.assert_allclose(gb, [2.0, 2.0])
    np.testing.assert_allclose(gw, np.repeat(a.sum(axis=0)[:, None], 2, axis=1))
    out, f_vjp = hd.vjp(P.blur3, rng.random((3, 3)), "mirror")
    grads = f_vjp(np.ones_like(out))
    assert len(grads) == 2 and grads[1] is None


def test_several_outputs_and_integer_arguments(rng):
    @hd.func
    def two(x, idx):
        return {"gathered": hd.compute(idx.shape, lambda i: x[idx[i]] * 2.0), "total": hd.sum(x)}
    x, idx = rng.random(5), np.array([0, 3, 3, 1])
    out, f_vjp = hd.vjp(two, x, idx)
    gx, gidx = f_vjp({"gathered": np.ones(4), "total": np.array(10.0)})
    assert gidx is None
    np.testing.assert_allclose(gx, [12.0, 12.0, 10.0, 14.0, 10.0])


def test_prod_gradient_with_zeros():
    g = hd.grad(lambda x: hd.prod(x))(np.array([2.0, 0.0, 3.0]))
    np.testing.assert_allclose(g, [0.0, 6.0, 0.0])


def test_against_torch(rng):
    torch = pytest.importorskip("torch")
    x, w = rng.standard_normal((2, 3, 6, 7)), rng.standard_normal((4, 3, 3, 2))  # check_grad's shapes above
    ct = rng.standard_normal((2, 4, 4, 6))
    _, f_vjp = hd.vjp(P.conv2d, x, w)
    dx, dw = f_vjp(ct)
    xt, wt = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
    tx, tw = torch.autograd.grad(torch.nn.functional.conv2d(xt, wt), (xt, wt), torch.tensor(ct))
    np.testing.assert_allclose(dx, tx.numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(dw, tw.numpy(), rtol=1e-10, atol=1e-12)
    x = rng.standard_normal((2, 3, 6, 8))
    ct = rng.standard_normal((2, 3, 3, 4))
    _, f_vjp = hd.vjp(P.maxpool2, x)
    xt = torch.tensor(x, requires_grad=True)
    (tx,) = torch.autograd.grad(torch.nn.functional.max_pool2d(xt, 2), (xt,), torch.tensor(ct))
    np.testing.assert_array_equal(f_vjp(ct)[0], tx.numpy())
    s = rng.standard_normal((3, 6))
    ct = rng.standard_normal((3, 6))
    _, f_vjp = hd.vjp(P.softmax, s)
    st = torch.tensor(s, requires_grad=True)
    (ts,) = torch.autograd.grad(torch.softmax(st, dim=1), (st,), torch.tensor(ct))
    np.testing.assert_allclose(f_vjp(ct)[0], ts.numpy(), rtol=1e-10, atol=1e-12)


def test_stop_gradient_keeps_the_value_and_drops_the_gradient(rng):
    @hd.func
    def damped(x):  # x * detach(x): the value x**2, the gradient x (not 2x)
        return hd.compute(x.shape, lambda i: x[i] * hd.stop_gradient(x[i]))

    x = rng.standard_normal(7)
    out, f_vjp = hd.vjp(damped, x)
    np.testing.assert_allclose(out, x * x, rtol=1e-15)
    (g,) = f_vjp(np.ones(7))
    np.testing.assert_allclose(g, x, rtol=1e-15)
    torch = pytest.importorskip("torch")
    tx = torch.tensor(x, requires_grad=True)
    (tg,) = torch.autograd.grad((tx * tx.detach()).sum(), tx)
    np.testing.assert_allclose(g, tg.numpy(), rtol=1e-15)
    assert hd.stop_gradient(2.5) == 2.5  # on numbers and arrays, the identity
    np.testing.assert_array_equal(hd.stop_gradient(x), x)


def test_a_fully_stopped_input_gets_a_zero_gradient(rng):
    x = rng.standard_normal(5)
    (g,) = hd.vjp(hd.func(lambda x: hd.stop_gradient(x) * 3.0), x)[1](np.ones(5))
    np.testing.assert_array_equal(g, np.zeros(5))


# A max or min pool of a clamp (a relu) is differentiated at the extremal point, where the clamp's
# test reads the pooled output (ad._at_extremum): the gradient never reads the clamp's input.

@hd.func
def blur_relu_pool(x):
    r, s = hd.rdom(3, 3)
    n, c, h, w = x.shape
    blurred = hd.compute((n, c, h - 2, w - 2), lambda a, b, i, j: hd.sum(x[a, b, i + r, j + s]) / 9,
                         name="blurred")
    return ops.max_pool2d(ops.relu(blurred), 2)


def _matches_torch(fn, torch_fn, x, rng, *static):
    """fn's output and gradient (for a random cotangent) against torch_fn's; the gradient."""
    torch = pytest.importorskip("torch")
    out, f_vjp = hd.vjp(fn, x, *static)
    ct = rng.standard_normal(out.shape).astype(x.dtype)
    xt = torch.tensor(x, requires_grad=True)
    ty = torch_fn(xt)
    (tx,) = torch.autograd.grad(ty, xt, torch.tensor(ct))
    tol = dict(rtol=1e-5, atol=1e-6) if x.dtype == np.float32 else dict(rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(out, ty.detach().numpy(), **tol)
    dx = f_vjp(ct)[0]
    np.testing.assert_allclose(dx, tx.numpy(), **tol)
    return dx


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_max_pool_of_a_relu_reads_the_pooled_output_not_the_relus_input(rng, dtype):
    F = pytest.importorskip("torch").nn.functional
    x = rng.standard_normal((2, 3, 8, 10)).astype(dtype)
    x[0, 0] = -1.0  # every window of this plane clamps to 0: its maximum is 0, its gradient 0
    x[0, 1, :5, :5] = 0.5  # ties: the window's first maximal element gets the gradient
    report = hd.explain(blur_relu_pool, x)
    source = report.backward_source
    assert re.search(r"\bmax_pool2d\[", source) and not re.search(r"\bblurred\[", source), source
    assert "[no adjoint: differentiated inside max_pool2d, whose output its test reads]" in str(report)
    reference = lambda t: F.max_pool2d(F.relu(F.avg_pool2d(t, 3, stride=1)), 2)  # noqa: E731
    dx = _matches_torch(blur_relu_pool, reference, x, rng)
    assert not dx[0, 0].any()
    if dtype == np.float64:
        hd.check_grad(blur_relu_pool, rng.standard_normal((1, 2, 6, 8)))


def test_a_min_pool_of_a_clamp_to_an_array_differentiates_both(rng):
    @hd.func
    def min_of_clamp(x, t):
        n, m = x.shape
        k = hd.rdom(m)
        clamped = hd.compute((n, m), lambda i, j: hd.where(t[i] < x[i, j], t[i], x[i, j]), name="clamped")
        return hd.compute((n,), lambda i: hd.min(clamped[i, k]), name="smallest")

    x, t = rng.standard_normal((5, 7)), rng.standard_normal(5)
    t[0] = x[0].min() - 1.0  # the clamp wins everywhere in row 0: only t[0] gets the gradient
    source = hd.explain(min_of_clamp, x, t).backward_source
    assert re.search(r"\bsmallest\[", source), source
    out, f_vjp = hd.vjp(min_of_clamp, x, t)
    np.testing.assert_allclose(out, np.minimum(x, t[:, None]).min(axis=1), rtol=1e-15)
    dx, dt = f_vjp(np.ones(5))
    assert not dx[0].any() and dt[0] == 1.0
    np.testing.assert_allclose(dx.sum(axis=1) + dt, np.ones(5), rtol=1e-15)
    hd.check_grad(min_of_clamp, x, t)


def test_a_relu_read_by_a_pool_and_by_another_func_keeps_its_own_gradient(rng):
    @hd.func
    def pooled_and_summed(x):
        h = ops.relu(x)
        return ops.sum(ops.max_pool2d(h, 2)) + ops.sum(h * h)

    x = rng.standard_normal((1, 2, 4, 6))
    x[0, 0, :2, :2] = -1.0  # a window of zeros after the relu: its first element gets nothing
    h = np.maximum(x, 0)
    first = h.reshape(1, 2, 2, 2, 3, 2).transpose(0, 1, 2, 4, 3, 5).reshape(1, 2, 2, 3, 4).argmax(axis=-1)
    want = 2 * h
    for idx in np.ndindex(first.shape):
        n, c, i, j = idx
        r, s = divmod(first[idx], 2)
        want[n, c, 2 * i + r, 2 * j + s] += x[n, c, 2 * i + r, 2 * j + s] > 0
    g = hd.grad(pooled_and_summed)(x)
    np.testing.assert_allclose(g, want, rtol=1e-15)
    hd.check_grad(pooled_and_summed, x)


def test_a_relu_read_at_data_dependent_points_keeps_its_own_adjoint(rng):
    @hd.func
    def largest_picked(x, picks):
        h = ops.relu(x)
        k = hd.rdom(picks.shape[0])
        return hd.compute((), lambda: hd.max(h[picks[k]]), name="largest")

    x, picks = rng.standard_normal(6), np.array([4, 1, 1, 5])
    report = hd.explain(largest_picked, x, picks)
    assert any("adj_relu" in c.formula for c in report.contributions), str(report)
    np.testing.assert_allclose(largest_picked(x, picks), np.maximum(x[picks], 0).max(), rtol=1e-15)
    hd.check_grad(largest_picked, x, picks)


@hd.func
def padded_pool_of_relu(x, kernel_size=2):
    scaled = hd.compute(x.shape, lambda n, c, i, j: x[n, c, i, j] * 2.0, name="scaled")
    return ops.max_pool2d(ops.relu(scaled), kernel_size, stride=2, padding=1)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_padded_max_pool_of_a_relu_reads_the_pooled_output(rng, dtype):
    """The window reads the relu through the padding's select (ad._on_spine)."""
    F = pytest.importorskip("torch").nn.functional
    x = rng.standard_normal((2, 3, 9, 8)).astype(dtype)
    x[1, 2] = -1.0  # every window clamps to 0
    source = hd.explain(padded_pool_of_relu, x).backward_source
    assert re.search(r"\bmax_pool2d\[", source) and not re.search(r"\bscaled\[", source), source
    reference = lambda t: F.max_pool2d(F.relu(t * 2.0), 2, stride=2, padding=1)  # noqa: E731
    dx = _matches_torch(padded_pool_of_relu, reference, x, rng)
    assert not dx[1, 2].any()
    if dtype == np.float64:
        hd.check_grad(padded_pool_of_relu, rng.standard_normal((1, 2, 7, 6)))


def test_overlapping_windows_keep_the_relus_own_test(rng):
    """A 3x3/2 pool covers a point with up to 4 windows: testing the pooled output in each would
    cost more than testing the relu's input once (ad._read_once)."""
    F = pytest.importorskip("torch").nn.functional
    x = rng.standard_normal((2, 3, 9, 8))
    report = hd.explain(padded_pool_of_relu, x, 3)
    assert any("adj_relu" in c.formula for c in report.contributions), str(report)
    reference = lambda t: F.max_pool2d(F.relu(t * 2.0), 3, stride=2, padding=1)  # noqa: E731
    _matches_torch(padded_pool_of_relu, reference, x, rng, 3)


def test_a_selects_two_branches_reading_one_point_are_one_contribution(rng):
    """leaky relu: `g if x > 0` and `0.2 g if not x > 0` become one gather of a select (ad._merge)."""
    @hd.func
    def leaky(x):
        return ops.leaky_relu(x, 0.2)

    x = rng.standard_normal((3, 5))
    x[0, :2] = 0.0, -0.0  # the test's boundary: the slope's branch
    report = hd.explain(leaky, x)
    assert report.forms("x") == ["gather"], str(report)
    (g,) = hd.vjp(leaky, x)[1](np.full_like(x, 3.0))
    np.testing.assert_array_equal(g, np.where(x > 0, 3.0, 3.0 * 0.2))
    hd.check_grad(leaky, rng.standard_normal((3, 5)))


@hd.func
def pool_of_leaky(x, slope):
    scaled = hd.compute(x.shape, lambda n, c, i, j: x[n, c, i, j] * 2.0, name="scaled")
    return ops.max_pool2d(ops.leaky_relu(scaled, slope), 2)


@pytest.mark.parametrize("slope", [0.1, -0.5])
def test_a_max_pool_of_a_leaky_relu_reads_the_pooled_output_for_a_positive_slope(rng, slope):
    """With slope >= 0 the sign of the leaky relu's value is its test's answer; with a negative
    slope a negative input gives a positive value, so the relu keeps its own test."""
    F = pytest.importorskip("torch").nn.functional
    x = rng.standard_normal((2, 3, 6, 8))
    x[1, 0] = -1.0  # every window negative: the gradient takes the slope's branch
    report = hd.explain(pool_of_leaky, x, slope)
    reads_input = re.search(r"\bscaled\[", report.backward_source) is not None
    assert reads_input == (slope < 0), str(report)
    assert slope < 0 or "branchless(" in report.backward_source  # the nested selects, as LLVM selects
    reference = lambda t: F.max_pool2d(F.leaky_relu(t * 2.0, slope), 2)  # noqa: E731
    dx = _matches_torch(pool_of_leaky, reference, x, rng, slope)
    assert dx[1, 0].any()
    hd.check_grad(pool_of_leaky, rng.standard_normal((1, 2, 4, 6)), slope)
