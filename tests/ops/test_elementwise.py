"""Elementwise operators and activations: finite differences, PyTorch, ties, argument checks."""
import numpy as np
import pytest

import halide_ad as hd
from halide_ad import ops
from tests.ops.helpers import all_gathers, matches_torch


@hd.func
def unary(x, pos):
    """Every unary operator at once (one compile); `pos` feeds those that need x > 0."""
    return {
        "log": ops.log(pos), "sqrt": ops.sqrt(pos), "exp": ops.exp(x), "sigmoid": ops.sigmoid(x),
        "tanh": ops.tanh(x), "relu": ops.relu(x), "leaky_relu": ops.leaky_relu(x, 0.2),
        "abs": ops.abs(x), "negative": ops.negative(x), "clip": ops.clip(x, -0.5, 0.7),
        "clip_lo": ops.clip(x, a_min=0.1), "power": ops.power(pos, 2.5),
        "add_scalar": ops.add(2.0, x), "divide_scalar": ops.divide(x, 4.0),
    }


def torch_unary(x, pos):
    import torch
    import torch.nn.functional as F
    return {
        "log": torch.log(pos), "sqrt": torch.sqrt(pos), "exp": torch.exp(x), "sigmoid": torch.sigmoid(x),
        "tanh": torch.tanh(x), "relu": F.relu(x), "leaky_relu": F.leaky_relu(x, 0.2),
        "abs": torch.abs(x), "negative": -x, "clip": torch.clamp(x, -0.5, 0.7),
        "clip_lo": torch.clamp(x, min=0.1), "power": pos ** 2.5, "add_scalar": 2.0 + x,
        "divide_scalar": x / 4.0,
    }


@hd.func
def binary(a, b, pos, cond, x4, alpha, lo, hi, p):
    """Broadcasting binary operators, tensor bounds and exponents, prelu (per channel and shared)."""
    return {
        "maximum": ops.maximum(a, b), "minimum": ops.minimum(b, a), "add": ops.add(a, b),
        "subtract": ops.subtract(a, b), "multiply": ops.multiply(a, b), "divide": ops.divide(a, pos),
        "where": ops.where(cond, a, b), "where_scalar": ops.where(cond, 0.5, a),
        "prelu": ops.prelu(x4, alpha), "prelu_shared": ops.prelu(x4, ops.sum(alpha, axis=0, keepdims=True)),
        "clip": ops.clip(a, lo, hi), "power": ops.power(pos, p),
    }


def torch_binary(a, b, pos, cond, x4, alpha, lo, hi, p):
    import torch
    import torch.nn.functional as F
    return {
        "maximum": torch.maximum(a, b), "minimum": torch.minimum(b, a), "add": a + b, "subtract": a - b,
        "multiply": a * b, "divide": a / pos, "where": torch.where(cond, a, b),
        "where_scalar": torch.where(cond, torch.tensor(0.5, dtype=a.dtype), a),
        "prelu": F.prelu(x4, alpha), "prelu_shared": F.prelu(x4, alpha.sum(0, keepdim=True)),
        "clip": torch.clamp(a, lo, hi), "power": pos ** p,
    }


def unary_args(rng):
    return rng.standard_normal((2, 3, 5)), rng.random((2, 3, 5)) + 0.5


def binary_args(rng):
    a = rng.standard_normal((2, 3, 4))
    return (a, rng.standard_normal((3, 1)), rng.random(4) + 0.5, rng.random((2, 3, 4)) > 0.5,
            rng.standard_normal((2, 3, 2, 2)), rng.random(3), -rng.random(4) - 0.1, rng.random((3, 1)) + 0.1,
            rng.standard_normal((3, 4)))


def test_unary_gradients(rng):
    hd.check_grad(unary, *unary_args(rng))


def test_unary_match_torch(rng):
    matches_torch(unary, torch_unary, *unary_args(rng))


def test_binary_gradients(rng):
    hd.check_grad(binary, *binary_args(rng))


def test_binary_match_torch(rng):
    matches_torch(binary, torch_binary, *binary_args(rng))


def test_every_elementwise_adjoint_is_a_gather(rng):
    assert all_gathers(unary, *unary_args(rng))
    assert all_gathers(binary, *binary_args(rng))


def test_ties_and_kinks_follow_torch(rng):
    """maximum/minimum split ties evenly; relu and abs have gradient 0 at 0; clip passes the
    gradient at its bounds."""
    args = list(binary_args(rng))
    args[0][:] = 0.25
    args[1][:] = 0.25
    matches_torch(binary, torch_binary, *args)
    x, pos = unary_args(rng)
    x[0, 0, :4] = [0.0, -0.5, 0.7, 0.1]
    matches_torch(unary, torch_unary, x, pos)


def test_argument_checks():
    with pytest.raises(hd.TraceError, match="ops.relu: x must be an hd.Tensor"):
        hd.func(lambda x: ops.relu([1.0, 2.0]))(np.ones(2))
    with pytest.raises(hd.TraceError, match="ops.where: condition must be a bool tensor"):
        hd.func(lambda x: ops.where(x, x, x))(np.ones(2))
    with pytest.raises(hd.ShapeError, match="do not broadcast"):
        hd.func(lambda a, b: ops.add(a, b))(np.ones(3), np.ones(4))
    with pytest.raises(hd.ShapeError, match="alpha has 2 entries"):
        hd.func(lambda x, a: ops.prelu(x, a))(np.ones((1, 3, 2)), np.ones(2))
    with pytest.raises(hd.TraceError, match="a_min=1.0 is larger than a_max=0.0"):
        ops.clip(np.ones(2), 1.0, 0.0)
    with pytest.raises(hd.TraceError, match="give a_min, a_max or both"):
        hd.func(lambda x: ops.clip(x))(np.ones(2))
    with pytest.raises(hd.TraceError, match="at least one operand must be an hd.Tensor"):
        hd.func(lambda x: ops.add(1.0, 2.0))(np.ones(2))
    with pytest.raises(hd.TraceError, match="must be a float32 or float64 tensor"):
        hd.func(lambda x: ops.exp(x))(np.arange(3))
