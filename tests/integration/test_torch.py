"""halide_ad.torch: an @hd.func as a torch.autograd.Function."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
hd_torch = pytest.importorskip("halide_ad.torch")

from tests import programs as P
from tests.integration import programs as IP

conv2d = hd_torch.function(P.conv2d)
maxpool2 = hd_torch.function(P.maxpool2)
blur1d = hd_torch.function(P.blur1d)


def test_gradcheck_conv2d_float64():
    x = torch.randn(2, 3, 6, 7, dtype=torch.float64, requires_grad=True)
    w = torch.randn(4, 3, 3, 2, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(conv2d, (x, w))
    torch.testing.assert_close(conv2d(x, w), torch.nn.functional.conv2d(x, w))


def test_gradcheck_with_static_argument():
    x = torch.randn(6, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: blur1d(t, "mirror"), (x,))


def test_maxpool_matches_torch_forward_and_backward():
    x = torch.randn(2, 3, 6, 8, dtype=torch.float64, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_()
    ct = torch.randn(2, 3, 3, 4, dtype=torch.float64)
    maxpool2(x).backward(ct)
    torch.nn.functional.max_pool2d(x_ref, 2).backward(ct)
    torch.testing.assert_close(x.grad, x_ref.grad)


def test_forward_shares_memory_and_gradients_keep_dtype():
    x = torch.randn(1, 1, 4, 4)  # float32
    w = torch.randn(1, 1, 2, 2, requires_grad=True)
    y = conv2d(x, w)
    assert y.dtype == torch.float32 and y.requires_grad and x.grad is None
    y.sum().backward()
    assert w.grad.dtype == torch.float32 and w.grad.shape == w.shape
    assert np.shares_memory(x.detach().numpy(), x.numpy())  # the zero-copy path
    expected = torch.nn.functional.conv2d(x, w.detach().requires_grad_())
    torch.testing.assert_close(y, expected)


def test_integer_inputs_and_structured_outputs():
    x = torch.randn(5, dtype=torch.float64, requires_grad=True)
    idx = torch.tensor([4, 0, 0, 2])
    out = hd_torch.function(IP.take)(x, idx)
    out.backward(torch.ones(4, dtype=torch.float64))
    torch.testing.assert_close(x.grad, torch.tensor([2.0, 0, 1, 0, 1], dtype=torch.float64))

    a = torch.randn(5, dtype=torch.float64, requires_grad=True)
    x.grad = None
    res = hd_torch.function(IP.scale_shift)(x, a, 0.5)
    assert set(res) == {"y", "sq"}
    (res["y"].sum() + res["sq"]).backward()
    torch.testing.assert_close(a.grad, x.detach())
    torch.testing.assert_close(x.grad, a.detach() + 2 * x.detach())


def test_in_place_change_before_backward_is_caught():
    x = torch.randn(1, 1, 4, 4, dtype=torch.float64)
    w = torch.randn(1, 1, 2, 2, dtype=torch.float64, requires_grad=True)
    y = conv2d(x, w)
    x.add_(1.0)  # the gradient kernels would read the changed memory
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


class TinyCNN(torch.nn.Module):
    """conv (halide_ad) -> relu -> maxpool (halide_ad) -> linear."""

    def __init__(self, classes: int = 3):
        super().__init__()
        self.w = torch.nn.Parameter(0.3 * torch.randn(4, 1, 3, 3))
        self.b = torch.nn.Parameter(torch.zeros(4, 1, 1))
        self.fc = torch.nn.Linear(4 * 3 * 3, classes)

    def forward(self, x):
        h = torch.relu(conv2d(x, self.w) + self.b)
        return self.fc(maxpool2(h).flatten(1))


def test_module_with_wrapped_conv_and_pool_trains():
    torch.manual_seed(0)
    # three classes of 8x8 images: a horizontal bar, a vertical bar, noise only
    labels = torch.arange(24) % 3
    x = 0.3 * torch.randn(24, 1, 8, 8)
    x[labels == 0, 0, 3:5, :] += 1.0
    x[labels == 1, 0, :, 3:5] += 1.0
    model = TinyCNN()
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    losses = []
    for _ in range(15):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), labels)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0], losses
    assert model.w.grad is not None and torch.isfinite(model.w.grad).all()
