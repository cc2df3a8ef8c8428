"""halide_ad.torch beyond one backward: only the gradients torch asks for, and double backward
(create_graph=True, torch.autograd.functional.hvp) against torch's own second derivatives."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
hd_torch = pytest.importorskip("halide_ad.torch")

import halide_ad as hd
from tests import programs as P
from tests.integration import programs as IP

conv2d = hd_torch.function(P.conv2d)
energy = hd_torch.function(IP.stencil_energy)


def torch_energy(u, target):
    c = torch.nn.functional.pad(u[None, None], (1, 1, 1, 1), mode="replicate")[0, 0]
    blur = (c[:-2, 1:-1] + c[2:, 1:-1] + c[1:-1, :-2] + c[1:-1, 2:] + 4 * c[1:-1, 1:-1]) / 8
    tv = torch.sqrt((c[1:-1, 2:] - c[1:-1, 1:-1]) ** 2 + (c[2:, 1:-1] - c[1:-1, 1:-1]) ** 2 + 0.01)
    return 0.5 * ((blur - target) ** 2).sum() + 0.1 * tv.sum()


def test_only_the_gradients_torch_asks_for_are_computed():
    fresh = hd.func(P.conv2d.fn)  # (its own caches: the gradients compiled are this test's)
    x = torch.randn(1, 2, 5, 6, dtype=torch.float64)
    w = torch.randn(3, 2, 2, 2, dtype=torch.float64, requires_grad=True)
    hd_torch.function(fresh)(x, w).sum().backward()
    assert x.grad is None
    torch.testing.assert_close(w.grad, torch.autograd.grad(torch.nn.functional.conv2d(x, w).sum(), w)[0])
    traced, _ = fresh.trace((x.numpy(), w.detach().numpy()), {})
    assert set(traced._grads) == {(traced.arg_names[1],)}  # the kernel's gradient alone


@pytest.mark.parametrize("shape", [(5, 6), (1, 4)])
def test_hvp_matches_torch(shape):
    rng = np.random.default_rng(3)
    u, target, v = (torch.tensor(rng.standard_normal(shape)) for _ in range(3))
    _, ours = torch.autograd.functional.hvp(lambda x: energy(x, target), u, v)
    _, expected = torch.autograd.functional.hvp(lambda x: torch_energy(x, target), u, v)
    torch.testing.assert_close(ours, expected, rtol=1e-10, atol=1e-12)
    assert ours.abs().max() > 0.01


def test_double_backward_with_create_graph_float32_and_a_mixed_second_derivative():
    rng = np.random.default_rng(4)
    u = torch.tensor(rng.standard_normal((4, 5)), dtype=torch.float32, requires_grad=True)
    target = torch.tensor(rng.standard_normal((4, 5)), dtype=torch.float32, requires_grad=True)
    v = torch.tensor(rng.standard_normal((4, 5)), dtype=torch.float32)
    results = []
    for fn in (energy, torch_energy):
        (g,) = torch.autograd.grad(fn(u, target), u, create_graph=True)
        hv_u, hv_target = torch.autograd.grad((g * v).sum(), (u, target))  # d/du and d/dtarget of <g, v>
        results.append((g, hv_u, hv_target))
    for ours, expected in zip(*results):
        assert ours.dtype == torch.float32
        torch.testing.assert_close(ours, expected, rtol=1e-4, atol=1e-5)


def test_second_derivatives_pass_gradgradcheck():
    x = torch.randn(1, 2, 4, 5, dtype=torch.float64, requires_grad=True)
    w = torch.randn(2, 2, 2, 2, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradgradcheck(conv2d, (x, w))
    u = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    target = torch.randn(3, 4, dtype=torch.float64)
    assert torch.autograd.gradgradcheck(lambda x: energy(x, target), (u,))


def test_third_order_through_two_wrapped_gradients():
    x = torch.randn(5, dtype=torch.float64, requires_grad=True)
    cube = hd_torch.function(lambda x: hd.sum(x * x * x))
    (g,) = torch.autograd.grad(cube(x), x, create_graph=True)  # 3 x^2
    (h,) = torch.autograd.grad(g.sum(), x, create_graph=True)  # 6 x
    (t,) = torch.autograd.grad(h.sum(), x)                     # 6
    torch.testing.assert_close(t, torch.full_like(x, 6.0))


def test_double_backward_through_a_data_dependent_index_matches_torch():
    """The gradient program's scatter to x[idx[i]] is an update definition, differentiated again."""
    take = hd_torch.function(IP.take)
    x = torch.arange(5.0, dtype=torch.float64, requires_grad=True)
    idx = torch.tensor([0, 2, 2, 4])
    (g,) = torch.autograd.grad((take(x, idx) ** 3).sum(), x, create_graph=True)
    (h,) = torch.autograd.grad((g * g).sum(), x)
    (g_t,) = torch.autograd.grad((x[idx] ** 3).sum(), x, create_graph=True)
    (h_t,) = torch.autograd.grad((g_t * g_t).sum(), x)
    torch.testing.assert_close(g, g_t)
    torch.testing.assert_close(h, h_t)
