"""hd.jvp and hd.jacfwd against torch.func.jvp, torch's Jacobian and central differences."""
import numpy as np
import pytest

import halide_ad as hd
from halide_ad import ops
from tests.transforms.helpers import check_jvp

torch = pytest.importorskip("torch")
F = torch.nn.functional

VIEWS = {"repeat_edge": "replicate", "constant_exterior": "constant", "mirror": "reflect"}


@hd.func
def stencil(u, view):
    c = getattr(hd, view)(u)
    return hd.compute(u.shape, lambda y, x: c[y, x - 1] * c[y - 1, x] + hd.sin(c[y, x + 1]) - c[y + 1, x] ** 2 / 4)


def torch_stencil(u, mode):
    c = F.pad(u[None, None], (1, 1, 1, 1), mode=mode)[0, 0]
    H, W = u.shape
    at = lambda dy, dx: c[1 + dy:1 + dy + H, 1 + dx:1 + dx + W]  # noqa: E731
    return at(0, -1) * at(-1, 0) + torch.sin(at(0, 1)) - at(1, 0) ** 2 / 4


@pytest.mark.parametrize("view", list(VIEWS))
def test_stencil_under_every_boundary_view(view, rng):
    u = rng.standard_normal((5, 6))
    check_jvp(stencil, u, view, torch_fn=lambda t: torch_stencil(t, VIEWS[view]))


def test_stencil_size_one_and_float32(rng):
    check_jvp(stencil, rng.standard_normal((1, 4)), "repeat_edge", torch_fn=lambda t: torch_stencil(t, "replicate"))
    check_jvp(stencil, rng.standard_normal((1, 4)), "mirror")  # (torch cannot reflect a size-1 dimension)
    u = rng.standard_normal((4, 5)).astype(np.float32)
    check_jvp(stencil, u, "repeat_edge", fd=False, rtol=1e-5, atol=1e-5,
              torch_fn=lambda t: torch_stencil(t, "replicate"))


def test_non_contiguous_primal_and_tangent(rng):
    u = rng.standard_normal((5, 12))[:, ::2]
    t = rng.standard_normal((5, 12))[:, 1::2]
    _, tangent = hd.jvp(stencil, (u, "repeat_edge"), (t, None))
    _, reference = torch.func.jvp(lambda a: torch_stencil(a, "replicate"), (torch.tensor(u),), (torch.tensor(t),))
    np.testing.assert_allclose(tangent, reference.numpy(), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("stride, padding", [(1, 0), (2, 1)])
def test_conv2d_with_strides_and_padding(stride, padding, rng):
    x, w, b = rng.standard_normal((2, 3, 7, 6)), rng.standard_normal((4, 3, 3, 3)), rng.standard_normal(4)
    check_jvp(lambda x, w, b: ops.conv2d(x, w, b, stride=stride, padding=padding), x, w, b,
              torch_fn=lambda x, w, b: F.conv2d(x, w, b, stride=stride, padding=padding))


def test_max_pool_with_ties_carries_the_first_maximum(rng):
    x = rng.integers(0, 3, (2, 2, 6, 6)).astype(np.float64)  # many ties in each window
    # differentiable only away from ties: torch picks the first maximum, as halide_ad does
    check_jvp(lambda x: ops.max_pool2d(x, 2), x, fd=False, torch_fn=lambda x: F.max_pool2d(x, 2))
    check_jvp(lambda x: ops.max_pool2d(x, 3, stride=2, padding=1), rng.standard_normal((1, 2, 7, 7)),
              torch_fn=lambda x: F.max_pool2d(x, 3, stride=2, padding=1))


def test_first_extremum_by_hand():
    @hd.func
    def window_max(x):
        r = hd.rdom(3)
        return hd.compute((2,), lambda i: hd.max(x[i + r]))

    x = np.array([1.0, 2.0, 2.0, 0.0])  # window 0: tie at 1 and 2; window 1: tie at 1 and 2
    _, t = hd.jvp(window_max, (x,), (np.array([10.0, 20.0, 30.0, 40.0]),))
    assert t.tolist() == [20.0, 20.0]


def test_softmax_and_log_softmax(rng):
    x = rng.standard_normal((3, 5))
    check_jvp(lambda x: ops.softmax(x, axis=-1), x, torch_fn=lambda x: torch.softmax(x, -1))
    check_jvp(lambda x: ops.log_softmax(x, axis=0), x, torch_fn=lambda x: torch.log_softmax(x, 0))


@pytest.mark.parametrize("align_corners", [False, True])
def test_bilinear_resize(align_corners, rng):
    x = rng.standard_normal((1, 2, 4, 5))
    check_jvp(lambda x: ops.resize(x, (7, 3), align_corners=align_corners), x,
              torch_fn=lambda x: F.interpolate(x, size=(7, 3), mode="bilinear", align_corners=align_corners))


def test_several_ops(rng):
    x, g, b = rng.standard_normal((2, 3, 4)), rng.standard_normal(4), rng.standard_normal(4)
    check_jvp(lambda x, g, b: ops.layer_norm(x, g, b), x, g, b,
              torch_fn=lambda x, g, b: F.layer_norm(x, (4,), g, b, eps=1e-5))
    y = rng.standard_normal((1, 2, 6, 6))
    check_jvp(lambda y: ops.avg_pool2d(ops.tanh(y), 2), y, torch_fn=lambda y: F.avg_pool2d(torch.tanh(y), 2))
    check_jvp(lambda x: ops.prod(ops.sigmoid(x), axis=1), x, torch_fn=lambda x: torch.prod(torch.sigmoid(x), 1))
    a, c = rng.standard_normal((3, 4)), rng.standard_normal((4, 2))
    check_jvp(lambda a, c: ops.matmul(ops.leaky_relu(a, 0.1), c) ** 2, a, c,
              torch_fn=lambda a, c: (F.leaky_relu(a, 0.1) @ c) ** 2)


def test_kinks_at_zero_follow_reverse_mode():
    """relu and abs have derivative 0 at 0; hd.maximum splits a tie evenly (as torch)."""
    @hd.func
    def kinks(x, y):
        return hd.relu(x) + hd.abs(x) + hd.maximum(x, y) + hd.min(x)

    x = np.array([0.0, 1.0, -2.0, 0.5])
    y = np.array([0.0, 0.0, 0.0, 0.5])
    check_jvp(kinks, x, y, fd=False, torch_fn=lambda x, y: torch.relu(x) + torch.abs(x) + torch.maximum(x, y)
              + torch.min(x))
    _, t = hd.jvp(kinks, (x, y), (np.ones(4), np.full(4, 3.0)))
    # relu + abs + maximum (a tie gives the mean of the tangents) + the minimum, x[2], whose tangent is 1
    np.testing.assert_array_equal(t, [0 + 0 + 2 + 1, 1 + 1 + 1 + 1, 0 - 1 + 3 + 1, 1 + 1 + 2 + 1])


@hd.func
def two_outputs(x, w, k):
    y = hd.compute(x.shape, lambda i: x[i] * w[i] + hd.cast(k[i], "float64"))
    return {"energy": hd.sum(y * y), "y": y}


def test_several_outputs_integer_argument_and_scalar_output(rng):
    x, w, k = rng.standard_normal(5), rng.standard_normal(5), np.arange(5)
    out, t = check_jvp(two_outputs, x, w, k)
    assert set(t) == {"energy", "y"} and t["energy"].shape == ()


def test_jvp_of_an_identity_and_of_a_constant(rng):
    x = rng.standard_normal(3)
    t = rng.standard_normal(3)
    assert np.array_equal(hd.jvp(lambda u: u, (x,), (t,))[1], t)
    out, tangent = hd.jvp(lambda u, v: v * 2.0, (x, x), (t, None))
    assert np.array_equal(tangent, np.zeros(3)) and np.array_equal(out, 2 * x)


def test_jvp_while_tracing_and_second_order(rng):
    """hd.jvp on Tensors inside a trace: its result is part of the program, so a jvp of a jvp is
    a second derivative."""
    def energy(u):
        return hd.sum(hd.sin(u) * u ** 2)

    u, v, w = rng.standard_normal(4), rng.standard_normal(4), rng.standard_normal(4)

    @hd.func
    def directional(u, v):
        return hd.jvp(energy, (u,), (v,))[1]

    _, second = hd.jvp(lambda u: directional(u, v), (u,), (w,))

    def torch_energy(a):
        return (torch.sin(a) * a ** 2).sum()
    hessian = torch.autograd.functional.hessian(torch_energy, torch.tensor(u)).numpy()
    np.testing.assert_allclose(second, w @ hessian @ v, rtol=1e-10)
    np.testing.assert_allclose(directional(u, v), torch.func.jvp(torch_energy, (torch.tensor(u),),
                                                                  (torch.tensor(v),))[1].numpy(), rtol=1e-12)


def test_jacfwd_against_torch(rng):
    x, w = rng.standard_normal((2, 3)), rng.standard_normal(3)

    def fn(x, w):
        return hd.tanh(x * w) + hd.sum(x, axis=0)

    jx, jw = hd.jacfwd(fn, argnums=(0, 1))(x, w)
    tx, tw = torch.autograd.functional.jacobian(lambda x, w: torch.tanh(x * w) + x.sum(0),
                                                (torch.tensor(x), torch.tensor(w)))
    assert jx.shape == (2, 3, 2, 3) and jw.shape == (2, 3, 3)
    np.testing.assert_allclose(jx, tx.numpy(), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(jw, tw.numpy(), rtol=1e-12, atol=1e-14)
    assert hd.jacfwd(lambda x: hd.sum(x * x))(w).shape == (3,)


def test_check_grad_modes_and_second_order(rng):
    u = rng.standard_normal((4, 5))
    for modes in (("fwd",), ("rev",), ("rev", "fwd")):
        assert hd.check_grad(stencil, u, "mirror", modes=modes) < 1e-5
    assert hd.check_grad(stencil, u, "mirror", order=2) < 1e-5  # forward over forward, reverse over forward
    with pytest.raises(AssertionError, match="derivative x -> jvp"):  # a wrong second derivative is caught
        hd.check_grad(wrong_second_derivative, u[0], modes=("fwd",), order=2)


@hd.custom_jvp
def wrong_second_derivative(x):
    return hd.compute(x.shape, lambda i: hd.sin(x[i]))


@wrong_second_derivative.defjvp
def _wrong_rule(primals, tangents):  # the right first derivative, with a derivative of 0 itself
    (x,), (t,) = primals, tangents
    return wrong_second_derivative(x), hd.compute(x.shape, lambda i: hd.cos(hd.stop_gradient(x[i])) * t[i])


def test_bad_jvp_arguments(rng):
    x = rng.standard_normal(3)
    with pytest.raises(hd.TraceError, match=r"takes tuples, one entry per positional argument"):
        hd.jvp(stencil, x, x)
    with pytest.raises(hd.ShapeError, match=r"got 2 primal\(s\) but 1 tangent\(s\)"):
        hd.jvp(stencil, (x, "mirror"), (x,))
    with pytest.raises(hd.ShapeError, match=r"tangent 0 has shape \(4,\), but primal 0 has shape \(3,\)"):
        hd.jvp(lambda u: u * 2.0, (x,), (np.ones(4),))

    @hd.func
    def mismatched(u):
        return hd.jvp(lambda a: a * 2.0, (u,), (hd.cast(u, "float32"),))[1]
    with pytest.raises(hd.DTypeError, match="tangent 0 is float32 but primal 0 is float64"):
        mismatched(x)


def test_indexing_a_captured_array_names_the_fix():
    table = np.arange(4.0)
    with pytest.raises(hd.TraceError, match=r"read it through a boundary view, hd.repeat_edge\(a\)\[i, j\]"):
        hd.func(lambda u: hd.compute(u.shape, lambda i: u[i] * table[i]))(np.ones(4))
    np.testing.assert_array_equal(
        hd.func(lambda u: hd.compute(u.shape, lambda i: u[i] * hd.repeat_edge(table)[i]))(np.ones(4)), table)


def test_zero_dimensional_primal_and_jacobian(rng):
    x, s = rng.standard_normal(3), np.array(1.5)
    out, tangent = hd.jvp(lambda x, s: x * s, (x, s), (np.zeros(3), np.array(2.0)))
    np.testing.assert_allclose(tangent, 2.0 * x)
    np.testing.assert_allclose(hd.jacfwd(lambda x, s: x * s, argnums=1)(x, s), x)
