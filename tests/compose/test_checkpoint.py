"""hd.checkpoint: the same gradients, with the blocks' intermediates recomputed, not stored."""
import numpy as np
import pytest

import halide_ad as hd
from halide_ad.segments import SEGMENTS, _compiled


def block(u):
    c = hd.repeat_edge(u)
    a = hd.compute(u.shape, lambda i, j: hd.tanh(c[i - 1, j] + c[i + 1, j] - c[i, j - 1]), name="a")
    b = hd.compute(u.shape, lambda i, j: a[i, j] * a[i, j] + 0.5 * u[i, j], name="b")
    return b


checkpointed = hd.checkpoint(block)


def deep(u, w, checkpoint):
    for _ in range(3):
        u = (checkpointed if checkpoint else block)(u) * w[0]
    m = hd.rdom(2)
    pooled = hd.compute((u.shape[0], u.shape[1] // 2), lambda i, j: hd.max(u[i, 2 * j + m]))
    return hd.sum(pooled * pooled)


@pytest.fixture(scope="module")
def uw():
    rng = np.random.default_rng(11)
    return rng.standard_normal((4, 6)), rng.standard_normal(1)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_checkpointed_gradients_equal_plain_ones(uw, dtype):
    u, w = (a.astype(dtype) for a in uw)
    plain = hd.value_and_grad(deep, argnums=(0, 1))(u, w, False)
    ckpt = hd.value_and_grad(deep, argnums=(0, 1))(u, w, True)
    tol = 1e-12 if dtype == np.float64 else 1e-5
    np.testing.assert_allclose(ckpt[0], plain[0], rtol=tol)
    for a, b in zip(ckpt[1], plain[1], strict=True):
        assert a.dtype == dtype
        np.testing.assert_allclose(a, b, rtol=tol, atol=tol)


def test_checkpointed_gradient_against_finite_differences(uw):
    u, w = uw
    g = hd.grad(deep)(u, w, True)
    t = np.random.default_rng(1).standard_normal(u.shape)
    eps = 1e-6
    f = hd.func(deep)
    fd = (f(u + eps * t, w, True) - f(u - eps * t, w, True)) / (2 * eps)
    assert np.isclose(np.vdot(g, t), fd, rtol=1e-6)


def test_block_intermediates_are_not_kept_for_the_backward_pass(uw):
    u, w = uw
    traced, arrays = hd.func(deep).trace((u, w, True), {})
    assert len(traced.checkpoints) == 3
    buffers = traced.run(arrays)
    intermediates = {n for funcs in traced.checkpoints for n in funcs[:-1]}  # the last: the output
    assert intermediates and not intermediates & buffers.keys()
    assert any(s is None for s in buffers[SEGMENTS])  # the checkpointed segments saved nothing
    plain, plain_arrays = hd.func(deep).trace((u, w, False), {})
    assert {f.name for f in plain.program.funcs if f.name.startswith("a")} <= plain.run(plain_arrays).keys()


def test_identical_blocks_share_their_kernels(uw):
    u, w = uw
    hd.grad(deep)(u, w, True)
    segments = hd.func(deep).trace((u, w, True), {})[0]._segmented.segments
    blocks = [s.program for s in segments if s.recompute]
    assert len(blocks) == 3 and blocks[0] == blocks[1] == blocks[2]
    assert blocks[0] in _compiled


def test_checkpoint_on_arrays_is_the_function(uw):
    u, _ = uw
    np.testing.assert_array_equal(checkpointed(u), hd.func(block)(u))
