"""Operators compose inside one traced function, in float32, and run on their own with arrays."""
import numpy as np
import pytest

import halide_ad as hd
from halide_ad import ops


@hd.func
def cnn_loss(x, w1, b1, w2, b2, labels):
    """conv -> relu -> max pool -> flatten -> dense -> softmax cross-entropy."""
    h = ops.max_pool2d(ops.relu(ops.conv2d(x, w1, b1, padding=1)), 2)
    return ops.cross_entropy(ops.dense(ops.flatten(h, 1), w2, b2), labels)


def cnn_args(rng):
    f32 = lambda *s: rng.standard_normal(s).astype(np.float32)
    return f32(3, 1, 6, 6), f32(4, 1, 3, 3), f32(4), f32(5, 36), f32(5), rng.integers(0, 5, 3)


def test_small_cnn_float32_matches_torch(rng):
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    args = cnn_args(rng)
    loss, grads = hd.value_and_grad(cnn_loss, argnums=(1, 2, 3, 4))(*args)
    assert loss.dtype == np.float32 and all(g.dtype == np.float32 for g in grads)
    x, w1, b1, w2, b2 = (torch.tensor(a, requires_grad=True) for a in args[:5])
    h = F.max_pool2d(F.relu(F.conv2d(x, w1, b1, padding=1)), 2)
    ref = F.cross_entropy(F.linear(h.flatten(1), w2, b2), torch.tensor(args[5]))
    refs = torch.autograd.grad(ref, (w1, b1, w2, b2))
    np.testing.assert_allclose(loss, ref.item(), rtol=1e-5)
    for g, r in zip(grads, refs, strict=True):
        np.testing.assert_allclose(g, r.numpy(), rtol=1e-4, atol=1e-5)


def test_an_operator_called_with_arrays_compiles_and_runs(rng):
    x = rng.standard_normal((2, 3))
    np.testing.assert_array_equal(ops.relu(x), np.maximum(x, 0))
    g = hd.grad(lambda a: ops.sum(ops.relu(a)))(x)
    np.testing.assert_array_equal(g, (x > 0).astype(float))
