"""Gradients used while tracing are Funcs of the program, so they differentiate again: Hessian-vector
products reverse over reverse, against PyTorch, finite differences of the gradient in float64, and
their symmetry; Halide's own second-order tests; what is refused."""
import re

import numpy as np
import pytest

import halide_ad as hd


def energy(u, target):
    """A clamped-stencil energy: a data term through a repeat_edge blur, plus a smoothed total
    variation (forward differences, clamped at the far edges)."""
    H, W = u.shape
    c = hd.repeat_edge(u)
    blur = hd.compute((H, W), lambda y, x: (c[y - 1, x] + c[y + 1, x] + c[y, x - 1] + c[y, x + 1]
                                            + 4 * c[y, x]) / 8, name="blur")
    tv = hd.compute((H, W), lambda y, x: hd.sqrt((c[y, x + 1] - c[y, x]) ** 2 + (c[y + 1, x] - c[y, x]) ** 2
                                                 + 0.01), name="tv")
    return 0.5 * hd.sum((blur - target) ** 2) + 0.1 * hd.sum(tv)


grad_energy = hd.grad(energy)


@hd.func
def hvp(u, target, v):
    """Reverse over reverse: the gradient of <grad E(u), v> with respect to u."""
    return hd.grad(lambda u: hd.sum(grad_energy(u, target) * v))(u)


def torch_energy(u, target):
    torch = pytest.importorskip("torch")
    c = torch.nn.functional.pad(u[None, None], (1, 1, 1, 1), mode="replicate")[0, 0]
    blur = (c[:-2, 1:-1] + c[2:, 1:-1] + c[1:-1, :-2] + c[1:-1, 2:] + 4 * c[1:-1, 1:-1]) / 8
    tv = torch.sqrt((c[1:-1, 2:] - c[1:-1, 1:-1]) ** 2 + (c[2:, 1:-1] - c[1:-1, 1:-1]) ** 2 + 0.01)
    return 0.5 * ((blur - target) ** 2).sum() + 0.1 * tv.sum()


@pytest.fixture(scope="module")
def problem():
    rng = np.random.default_rng(7)
    u, target = rng.standard_normal((5, 6)), rng.standard_normal((5, 6))
    return u, target, rng.standard_normal((5, 6)), rng.standard_normal((5, 6))


def test_hvp_matches_torch_and_finite_differences_of_the_gradient(problem):
    torch = pytest.importorskip("torch")
    u, target, v, _ = problem
    hv = hvp(u, target, v)
    tt = torch.tensor(target)
    _, expected = torch.autograd.functional.hvp(lambda x: torch_energy(x, tt), torch.tensor(u),
                                                torch.tensor(v))
    np.testing.assert_allclose(hv, expected.numpy(), rtol=1e-10, atol=1e-12)
    eps = 1e-6
    fd = (grad_energy(u + eps * v, target) - grad_energy(u - eps * v, target)) / (2 * eps)
    np.testing.assert_allclose(hv, fd, rtol=1e-5, atol=1e-7)
    assert np.abs(hv).max() > 0.1  # (boundary pixels included: the whole array is compared)


def test_hvp_of_a_single_row_and_of_non_contiguous_arrays(problem):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(2)
    u, target, v = (rng.standard_normal((1, 4)) for _ in range(3))
    tt = torch.tensor(target)
    _, expected = torch.autograd.functional.hvp(lambda x: torch_energy(x, tt), torch.tensor(u),
                                                torch.tensor(v))
    np.testing.assert_allclose(hvp(u, target, v), expected.numpy(), rtol=1e-10, atol=1e-12)
    u, target, v, _ = problem
    strided = [np.repeat(a, 2, axis=1)[:, ::2] for a in (u, target, v)]
    assert not strided[0].flags.c_contiguous
    np.testing.assert_array_equal(hvp(*strided), hvp(u, target, v))


def test_hvp_is_symmetric(problem):
    u, target, v, w = problem
    assert np.isclose(np.vdot(w, hvp(u, target, v)), np.vdot(v, hvp(u, target, w)), rtol=1e-12)


def test_hvp_in_float32(problem):
    u, target, v, _ = problem
    f32 = hvp(*(a.astype(np.float32) for a in (u, target, v)))
    assert f32.dtype == np.float32
    np.testing.assert_allclose(f32, hvp(u, target, v), rtol=1e-4, atol=1e-4)


def test_every_adjoint_of_the_hvp_is_a_gather(problem):
    u, target, v, _ = problem
    report = str(hd.explain(hvp, u, target, v))
    forms = re.findall(r"^\s*\[([\w-]+)\] adj_", report, re.M)
    assert len(forms) > 20  # the gradient of the gradient: every Func of both passes
    assert set(forms) <= {"gather", "gather-window"}, sorted(set(forms))
    assert "d_blur" in report and "d_u" in report  # the first gradient is part of the program


# ---- Halide's second-order tests (test/correctness/autodiff.cpp) ------------------------------

def polynomial(x):
    return x * x + 3.0 * x + 4.0


def test_halide_second_order_polynomial():
    """d/dx (x^2 + 3x + 4) = 2x + 3 = 5 at x = 1, and the second derivative is 2."""
    x = np.array(1.0, np.float32)
    assert hd.grad(polynomial)(x) == 5.0
    second = hd.grad(hd.grad(polynomial))(x)
    assert second == 2.0 and second.dtype == np.float32


def halide_conv_loss(inp, kernel, target):
    """conv(x) = sum over rc of repeat_edge(input)(x + rc - 1) * kernel(rc), for x < 9;
    loss0 = sum over x < 9 of (conv(x) - target(x))^2."""
    c = hd.repeat_edge(inp)
    rc = hd.rdom(3)
    conv = hd.compute((9,), lambda x: hd.sum(c[x + rc - 1] * kernel[rc]), name="conv")
    head = target[:9]
    rl = hd.rdom(9)
    return hd.compute((), lambda: hd.sum((conv[rl] - head[rl]) ** 2), name="loss0")


@hd.func
def halide_conv_second_order(inp, kernel, target):
    """loss1 = sum over x < 9 of d_input(x); its gradient with respect to input and kernel."""
    def loss1(inp, kernel):
        d_input = hd.grad(halide_conv_loss)(inp, kernel, target)
        rl = hd.rdom(9)
        return hd.compute((), lambda: hd.sum(d_input[rl]))
    return hd.grad(loss1, argnums=(0, 1))(inp, kernel)


def test_halide_second_order_conv_against_torch_and_finite_differences():
    torch = pytest.importorskip("torch")
    inp = np.arange(10) / 10.0
    target = (np.arange(10) + 1) / 10.0
    kernel = np.ones(3)
    d2_input, d2_kernel = halide_conv_second_order(inp, kernel, target)

    ti, tk = torch.tensor(inp, requires_grad=True), torch.tensor(kernel, requires_grad=True)
    padded = torch.cat([ti[:1], ti, ti[-1:]])
    conv = torch.stack([(padded[x:x + 3] * tk).sum() for x in range(9)])
    loss0 = ((conv - torch.tensor(target[:9])) ** 2).sum()
    (d_input,) = torch.autograd.grad(loss0, ti, create_graph=True)
    expected = torch.autograd.grad(d_input[:9].sum(), (ti, tk))
    np.testing.assert_allclose(d2_input, expected[0].numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(d2_kernel, expected[1].numpy(), rtol=1e-12, atol=1e-12)

    def loss1(i, k):
        return hd.grad(halide_conv_loss)(i, k, target)[:9].sum()
    eps, e = 1e-6, np.eye(3)[1]
    fd = (loss1(inp, kernel + eps * e) - loss1(inp, kernel - eps * e)) / (2 * eps)
    assert np.isclose(d2_kernel[1], fd, rtol=1e-6)


# ---- convolution with weights, unrolled steps, transformations while tracing ------------------

def conv_loss(x, w):
    N, C, H, W = x.shape
    K, _, R, S = w.shape
    c, r, s = hd.rdom(C, R, S)
    y = hd.compute((N, K, H - R + 1, W - S + 1),
                   lambda n, k, i, j: hd.sum(x[n, c, i + r, j + s] * w[k, c, r, s]))
    return hd.sum(hd.tanh(y) ** 2)


@hd.func
def conv_hvp(x, w, vx, vw):
    def directional(x, w):
        gx, gw = hd.grad(conv_loss, argnums=(0, 1))(x, w)
        return hd.sum(gx * vx) + hd.sum(gw * vw)
    return hd.grad(directional, argnums=(0, 1))(x, w)


def test_conv2d_hvp_matches_torch(rng):
    torch = pytest.importorskip("torch")
    x, w = rng.standard_normal((1, 2, 5, 6)), rng.standard_normal((3, 2, 3, 2))
    vx, vw = rng.standard_normal(x.shape), rng.standard_normal(w.shape)
    hx, hw = conv_hvp(x, w, vx, vw)

    def f(x, w):
        return (torch.tanh(torch.nn.functional.conv2d(x, w)) ** 2).sum()
    _, (ex, ew) = torch.autograd.functional.hvp(f, (torch.tensor(x), torch.tensor(w)),
                                                (torch.tensor(vx), torch.tensor(vw)))
    np.testing.assert_allclose(hx, ex.numpy(), rtol=1e-9, atol=1e-10)
    np.testing.assert_allclose(hw, ew.numpy(), rtol=1e-9, atol=1e-10)


def test_unrolled_gradient_step_inside_a_loss(problem):
    """Learning to optimize: the loss after one gradient step, differentiated by the step size."""
    u, target, _, _ = problem

    def after_step(lr, u, target):
        return energy(u - lr * grad_energy(u, target), target)

    lr = np.array(0.3)
    g = hd.grad(after_step)(lr, u, target)
    eps = 1e-6
    f = hd.func(after_step)
    fd = (f(lr + eps, u, target) - f(lr - eps, u, target)) / (2 * eps)
    assert np.isclose(g, fd, rtol=1e-6)


def test_value_and_grad_and_vjp_while_tracing(rng):
    x = rng.standard_normal(6)

    def f(x):
        return hd.sum(hd.sin(x) * x)

    @hd.func
    def both(x):
        value, g = hd.value_and_grad(f)(x)
        out, f_vjp = hd.vjp(lambda x: hd.sin(x) * x, x)
        (pulled,) = f_vjp(out)  # a traced cotangent
        return value, g, pulled

    value, g, pulled = both(x)
    assert np.isclose(value, np.sum(np.sin(x) * x))
    np.testing.assert_allclose(g, np.cos(x) * x + np.sin(x), rtol=1e-12)
    np.testing.assert_allclose(pulled, np.sin(x) * x * (np.cos(x) * x + np.sin(x)), rtol=1e-12)


def test_numpy_arguments_of_a_transformation_while_tracing_are_differentiated(rng):
    """A numpy array passed to hd.grad's argnums or to hd.vjp while tracing (here `w`, from a
    closure) is differentiated, as JAX does, not refused for not being a traced array."""
    x, w = rng.standard_normal(6), rng.standard_normal(6)

    def f(x, w):
        return hd.sum(hd.sin(x) * w * x)

    def total_of_w_gradient(x):
        return hd.sum(hd.grad(f, argnums=1)(x, w))  # d f / d w = sin(x) x

    np.testing.assert_allclose(hd.grad(total_of_w_gradient)(x), np.cos(x) * x + np.sin(x), rtol=1e-12)
    eps, total = 1e-6, lambda v: np.sum(np.sin(v) * v)
    fd = np.array([total(x + eps * e) - total(x - eps * e) for e in np.eye(6)]) / (2 * eps)
    np.testing.assert_allclose(hd.grad(total_of_w_gradient)(x), fd, rtol=1e-6)

    @hd.func
    def pulled(x):
        _, f_vjp = hd.vjp(lambda x, w: hd.sin(x) * w, x, w)
        return f_vjp(x)[1]  # the cotangent x pulled back to w: x sin(x)

    np.testing.assert_allclose(pulled(x), x * np.sin(x), rtol=1e-12)


def test_max_pool_and_product_reductions_differentiate_twice(rng):
    """A 2x2/2 max pool (its gradient reads where the maximum was: an argmax Func of the program)
    and a product (its gradient holds the product of the other elements: a reduction of its own)."""
    def pool_prod(x):
        N, C, H, W = x.shape
        r, s = hd.rdom(2, 2)
        m = hd.compute((N, C, H // 2, W // 2), lambda n, c, i, j: hd.max(x[n, c, 2 * i + r, 2 * j + s]))
        p = hd.compute((N, C, H // 2, W // 2), lambda n, c, i, j: hd.prod(x[n, c, 2 * i + r, 2 * j + s]))
        return hd.sum(m * m * m) + hd.sum(p * p)

    x, v = rng.standard_normal((1, 2, 4, 6)), rng.standard_normal((1, 2, 4, 6))
    hv = hd.grad(lambda x, v: hd.sum(hd.grad(pool_prod)(x) * v))(x, v)
    eps = 1e-6
    fd = (hd.grad(pool_prod)(x + eps * v) - hd.grad(pool_prod)(x - eps * v)) / (2 * eps)
    np.testing.assert_allclose(hv, fd, rtol=1e-6, atol=1e-8)


def test_data_dependent_scatter_while_tracing_is_an_update(rng):
    """adj_x[idx[i]] += ... has no gather form: while tracing it is an update of the adjoint, and
    the gradient of the gradient reads it back by gathers (tests/compose/test_data_dependent_orders.py
    checks more against JAX)."""
    def gathered(x, idx):
        return hd.sum(hd.compute(idx.shape, lambda i: x[idx[i]]) ** 2)

    x, idx = rng.standard_normal(5), np.array([0, 2, 2, 4])
    expected = [2 * x[0], 0, 4 * x[2], 0, 2 * x[4]]
    np.testing.assert_allclose(hd.grad(gathered)(x, idx), expected)  # at the top level: a scatter
    np.testing.assert_allclose(hd.func(lambda x, idx: hd.grad(gathered)(x, idx))(x, idx), expected)
    np.testing.assert_allclose(hd.grad(lambda x, idx: hd.sum(hd.grad(gathered)(x, idx)))(x, idx), [2, 0, 4, 0, 2])


def test_bad_arguments_while_tracing(rng):
    x = rng.standard_normal(3)
    with pytest.raises(hd.NotDifferentiableError, match="one scalar"):
        hd.func(lambda x: hd.grad(lambda x: x * 2)(x))(x)
    with pytest.raises(hd.NotDifferentiableError, match="int64"):
        hd.func(lambda x, i: hd.grad(lambda x, i: hd.sum(x) * 1.0, argnums=1)(x, i))(x, np.arange(3))

    def pulled(x, ct):
        _, f_vjp = hd.vjp(lambda x: x * x, x)
        return f_vjp(ct)[0]

    with pytest.raises(hd.ShapeError, match=r"shape \(2,\); it must be \(3,\)"):
        hd.func(pulled)(x, np.ones(2))
    with pytest.raises(hd.TraceError, match="cotangent"):
        hd.func(lambda x: pulled(x, np.ones(3)))(x)


def test_check_grad_order_two(rng):
    """The second-order check runs the first-order check on (x, c) -> vjp(c), traced as a program,
    here with two float arguments. (repeat_edge: a mirror's kernels of the same order compile twice
    as long, and tests/transforms/test_jvp.py checks a mirror stencil to order two in both modes.)"""
    def stencil(x, w):
        c = hd.repeat_edge(x)
        return hd.compute(x.shape, lambda i: hd.sin(c[i - 1] * w[0] + c[i + 1] * w[1]) * c[i])

    assert hd.check_grad(stencil, rng.standard_normal(5), rng.standard_normal(2), order=2) < 1e-5
    with pytest.raises(hd.NotDifferentiableError, match="order"):
        hd.check_grad(stencil, rng.standard_normal(5), rng.standard_normal(2), order=0)


def test_a_boundary_view_argument_keeps_its_view(rng):
    x = rng.standard_normal(4)

    def edge_sum(v):
        return hd.compute((), lambda: v[-1] + v[4] * 2.0)  # reads beyond both ends

    @hd.func
    def inside(x):
        return hd.grad(edge_sum)(hd.repeat_edge(x))

    np.testing.assert_allclose(inside(x), [1.0, 0.0, 0.0, 2.0])
