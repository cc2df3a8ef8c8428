"""Scans and scatters (halide_ad/ops/scatter.py) against PyTorch, forward and gradient."""
import numpy as np
import pytest

from halide_ad import ops
from tests.ops.helpers import matches_torch


def test_cumsum_and_cumprod(rng):
    x = rng.standard_normal((3, 5))
    matches_torch(ops.cumsum, lambda x, axis: x.cumsum(axis), x, 1)
    matches_torch(ops.cumsum, lambda x, axis: x.cumsum(axis), x, 0)
    x[1, 2] = 0.0  # a zero: the gradient divides by nothing
    matches_torch(ops.cumprod, lambda x, axis: x.cumprod(axis), x, -1)


def test_index_add_and_scatter_add(rng):
    x, src = rng.standard_normal((4, 3)), rng.standard_normal((6, 3))
    index = np.array([0, 2, 2, 3, 0, 1])
    matches_torch(ops.index_add, lambda x, a, i, s: x.index_add(a, i, s), x, 0, index, src)
    index2 = rng.integers(0, 4, (6, 3))
    matches_torch(ops.scatter_add, lambda x, a, i, s: x.scatter_add(a, i, s), x, 0, index2, src)


def test_segment_sum_and_bincount(rng):
    torch = pytest.importorskip("torch")
    data, ids = rng.standard_normal((7, 2)), np.array([1, 0, 1, 3, 3, 3, 0])
    matches_torch(ops.segment_sum, lambda d, i, n: torch.zeros(n, 2, dtype=d.dtype).index_add(0, i, d),
                  data, ids, 5)
    w = rng.random(7)
    np.testing.assert_allclose(ops.bincount(ids, w, 4), torch.bincount(torch.tensor(ids), torch.tensor(w), 4))
    # torch's bincount has no gradient: its index_add form has
    matches_torch(ops.bincount, lambda i, w, n: torch.zeros(n, dtype=w.dtype).index_add(0, i, w), ids, w, 4)
    np.testing.assert_array_equal(ops.bincount(ids, None, 4), np.bincount(ids, minlength=4))


def test_histogram_matches_histc(rng):
    torch = pytest.importorskip("torch")
    x = np.concatenate([rng.uniform(-1.5, 1.5, 200), [1.0, -1.0]])  # the ends land in the end bins
    expected = torch.histc(torch.tensor(x), 8, -1.0, 1.0).numpy()
    np.testing.assert_allclose(ops.histogram(x, 8, -1.0, 1.0), expected)
    w = rng.random(x.shape[0])
    inside = (x >= -1) & (x <= 1)
    k = np.clip(np.floor((x[inside] + 1) * 4).astype(int), 0, 7)
    np.testing.assert_allclose(ops.histogram(x, 8, -1.0, 1.0, w), np.bincount(k, w[inside], 8))


@pytest.mark.parametrize("mode", ["sum", "mean"])
def test_embedding_bag(rng, mode):
    torch = pytest.importorskip("torch")
    weight = rng.standard_normal((6, 3))
    indices, offsets = np.array([4, 0, 2, 2, 5, 1]), np.array([0, 2, 2, 5])  # bag 1 is empty
    matches_torch(ops.embedding_bag,
                  lambda w, i, o, m: torch.nn.functional.embedding_bag(i, w, o, mode=m), weight, indices, offsets,
                  mode)
