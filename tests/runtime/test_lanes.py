"""runtime/lanes.py: the vector fold of a reduction's lanes gives the bits of its SPLIT vectors of scalar lanes."""
import numpy as np
import pytest
from numba import njit

from halide_ad.runtime import lanes
from halide_ad.runtime.lanes import LANES, SPLIT


@njit
def _fold_all(row, lo, hi, init):
    return (lanes.sums(row, lo, hi, init), lanes.products(row, lo, hi, init),
            lanes.maxima(row, lo, hi, init), lanes.minima(row, lo, hi, init))


def _scalar_lanes(row, lo, hi, init, op):
    """Lane q of vector s combining row[k + q] for the rounds k in range(lo, hi, LANES) whose
    number is s mod SPLIT (vector 0 those past the last whole group of SPLIT), one element at a
    time; then the vectors combined pairwise."""
    identity = {np.add: 0.0, np.multiply: 1.0, np.maximum: -np.inf, np.minimum: np.inf}[op]
    vecs = [list(init)] + [[init.dtype.type(identity)] * LANES for _ in range(SPLIT - 1)]
    whole = lo + (hi - lo) // (LANES * SPLIT) * (LANES * SPLIT)
    for k in range(lo, hi, LANES):
        s = (k - lo) // LANES % SPLIT if k < whole else 0
        for q in range(LANES):
            vecs[s][q] = op(vecs[s][q], init.dtype.type(row[k + q]))
    while len(vecs) > 1:
        vecs = [[op(a, b) for a, b in zip(u, v)] for u, v in zip(vecs[::2], vecs[1::2])]
    return np.array(vecs[0], init.dtype)


@pytest.mark.parametrize("row_dtype, lane_dtype", [(np.float32, np.float64), (np.float64, np.float64),
                                                   (np.float32, np.float32)])
def test_fold_matches_scalar_lanes_bit_for_bit(row_dtype, lane_dtype):
    rng = np.random.default_rng(0)
    row = (rng.standard_normal(16 * LANES + 5) * 1e3).astype(row_dtype)
    row[[3, 20]] = np.nan, -0.0  # a NaN wins a max and a min (numpy's rule); -0 against +0 keeps the first
    row[40:48] = 1.0  # keeps the products finite over a stretch
    init = np.array([0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, 2.5, 1e-30], lane_dtype)
    lo, hi = 8, 8 + 15 * LANES
    folded = _fold_all(row, lo, hi, tuple(init))
    ops = {"sum": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum}
    with np.errstate(all="ignore"):
        for got, (name, op) in zip(folded, ops.items(), strict=True):
            want = _scalar_lanes(row, lo, hi, init, op).view(np.uint8)
            assert np.array_equal(np.array(got, lane_dtype).view(np.uint8), want), name
            plain = getattr(lanes.plain_python, lanes.FOLD[name])(row.astype(lane_dtype), lo, hi, tuple(init))
            assert np.array_equal(np.array(plain, lane_dtype).view(np.uint8), want), name


@njit
def _through_scratch(x):
    row = lanes.scratch(32, np.float64)  # a literal, as generated code writes it (4 * LANES)
    for k in range(4 * LANES):
        row[k] = x[k] * 2.0
    return lanes.sums(row, 0, 4 * LANES, (0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0))


def test_scratch_holds_a_row_of_terms():
    x = np.arange(4 * LANES, dtype=np.float64)
    assert _through_scratch(x) == tuple(2.0 * x.reshape(4, LANES).sum(0))
    assert lanes.SCRATCH_MAX == 2048
    assert njit(lambda: lanes.scratch(2048, np.float64).size)() == 2048
    too_long = njit(lambda: lanes.scratch(2049, np.float64))
    with pytest.raises(Exception, match="scratch"):  # the stack is for short rows: longer ones use np.empty
        too_long()


@njit
def _scaled(row, lo, hi, init, c):
    return lanes.scaled_sums(row, lo, hi, init, c)


@pytest.mark.parametrize("row_dtype, lane_dtype", [(np.float32, np.float64), (np.float64, np.float64)])
def test_a_scaled_fold_is_the_fold_of_the_scaled_row(row_dtype, lane_dtype):
    rng = np.random.default_rng(1)
    row = (rng.standard_normal(16 * LANES + 5) * 1e3).astype(row_dtype)
    c = row_dtype(1 / 768)  # no power of two: each product rounds
    init = tuple(np.linspace(-1, 1, LANES, dtype=lane_dtype))
    lo, hi = 8, 8 + 15 * LANES
    want = np.array(_fold_all(row * c, lo, hi, init)[0], lane_dtype)  # the row of terms, as before
    assert np.array_equal(np.array(_scaled(row, lo, hi, init, c), lane_dtype).view(np.uint8), want.view(np.uint8))
    plain = lanes.plain_python.scaled_sums(row, lo, hi, init, c)
    assert np.array_equal(np.array(plain, lane_dtype).view(np.uint8), want.view(np.uint8))
