"""runtime/lanes.py: the vector fold of a reduction's lanes gives the bits of its SPLIT vectors of scalar lanes."""
import numpy as np
import pytest
from numba import njit

from halide_ad.runtime import lanes
from halide_ad.runtime.lanes import BLOCK, LANES, SPLIT


@njit
def _fold_all(row, lo, hi, init):
    return (lanes.sums(row, lo, hi, init), lanes.products(row, lo, hi, init),
            lanes.maxima(row, lo, hi, init), lanes.minima(row, lo, hi, init))


def _scalar_lanes(row, lo, hi, init, op):
    """Lane q of vector s combining row[k + q] for the rounds k in range(lo, hi, LANES) whose
    number is s mod SPLIT (vector 0 those past the last whole group of SPLIT), one element at a
    time; then the vectors combined pairwise. A float32 sum in float64 lanes sums each BLOCK of
    rounds so in float32 from zeros, then the rounds past the whole groups, and adds each such
    part to the lanes in float64."""
    identity = {np.add: 0.0, np.multiply: 1.0, np.maximum: -np.inf, np.minimum: np.inf}[op]
    whole = lo + (hi - lo) // (LANES * SPLIT) * (LANES * SPLIT)
    if op is np.add and row.dtype.itemsize < init.dtype.itemsize:
        total = init.copy()
        for b in [*range(lo, whole, BLOCK), whole]:
            part = _scalar_lanes(row, b, min(b + BLOCK, whole) if b < whole else hi, np.zeros(LANES, row.dtype), op)
            total = total + part.astype(init.dtype)
        return total
    vecs = [list(init)] + [[init.dtype.type(identity)] * LANES for _ in range(SPLIT - 1)]
    for k in range(lo, hi, LANES):
        s = (k - lo) // LANES % SPLIT if k < whole else 0
        for q in range(LANES):
            vecs[s][q] = op(vecs[s][q], init.dtype.type(row[k + q]))
    while len(vecs) > 1:
        vecs = [[op(a, b) for a, b in zip(u, v)] for u, v in zip(vecs[::2], vecs[1::2])]
    return np.array(vecs[0], init.dtype)


@pytest.mark.parametrize("row_dtype, lane_dtype", [(np.float32, np.float64), (np.float64, np.float64),
                                                   (np.float32, np.float32)])
@pytest.mark.parametrize("rounds", [15, 2 * BLOCK // LANES + 2 * SPLIT + 3])  # under a block; two and a bit
def test_fold_matches_scalar_lanes_bit_for_bit(row_dtype, lane_dtype, rounds):
    rng = np.random.default_rng(0)
    row = (rng.standard_normal((rounds + 1) * LANES + 5) * 1e3).astype(row_dtype)
    row[[3, 20]] = np.nan, -0.0  # a NaN wins a max and a min (numpy's rule); -0 against +0 keeps the first
    row[40:48] = 1.0  # keeps the products finite over a stretch
    init = np.array([0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, 2.5, 1e-30], lane_dtype)
    lo, hi = 8, 8 + rounds * LANES
    folded = _fold_all(row, lo, hi, tuple(init))
    ops = {"sum": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum}
    with np.errstate(all="ignore"):
        for got, (name, op) in zip(folded, ops.items(), strict=True):
            want = _scalar_lanes(row, lo, hi, init, op).view(np.uint8)
            assert np.array_equal(np.array(got, lane_dtype).view(np.uint8), want), name
            plain = getattr(lanes.plain_python, lanes.FOLD[name])(row, lo, hi, tuple(init))
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


# (fold, terms, rows, scalars) of each fold of _terms_in_place: rows of (x, y), scalars of (a, b)
_TERMS = (("sums", "(r0 * s0)", 1, 1), ("sums", "(((r0 - s0) * (r0 - s0)) * s1)", 1, 2),
          ("maxima", "(-((r0 * r1) / s1))", 2, 2), ("minima", "((r0 / r1) + (-r1))", 2, 0))


@njit
def _terms_in_place(x, y, a, b, lo, hi, init):
    """Each of _TERMS folded by the fold from the rows (literals, as generated code writes them)."""
    return (lanes.sums_of("(r0 * s0)", (x,), (a,), lo, hi, init),
            lanes.sums_of("(((r0 - s0) * (r0 - s0)) * s1)", (x,), (a, b), lo, hi, init),
            lanes.maxima_of("(-((r0 * r1) / s1))", (x, y), (a, b), lo, hi, init),
            lanes.minima_of("((r0 / r1) + (-r1))", (x, y), (), lo, hi, init))


@njit(error_model="numpy")  # as kernels divide: x / 0 is inf or nan
def _terms_in_a_row(x, y, a, b, lo, hi, init):
    """The same terms, written to a row by scalar code first, as a fold's terms were before."""
    rows = np.empty((4, x.size), x.dtype)
    for k in range(lo, hi):
        rows[0, k] = x[k] * a
        rows[1, k] = ((x[k] - a) * (x[k] - a)) * b
        rows[2, k] = -((x[k] * y[k]) / b)
        rows[3, k] = (x[k] / y[k]) + (-y[k])
    return (lanes.sums(rows[0], lo, hi, init), lanes.sums(rows[1], lo, hi, init),
            lanes.maxima(rows[2], lo, hi, init), lanes.minima(rows[3], lo, hi, init))


@pytest.mark.parametrize("row_dtype, lane_dtype", [(np.float32, np.float64), (np.float64, np.float64),
                                                   (np.float32, np.float32)])
def test_terms_computed_in_the_fold_give_the_bits_of_a_row_of_terms(row_dtype, lane_dtype):
    rng = np.random.default_rng(1)
    x, y = (rng.standard_normal(16 * LANES + 5) * 1e3).astype(row_dtype), rng.standard_normal(16 * LANES + 5).astype(row_dtype)
    x[[9, 30, 31]] = np.nan, np.inf, -0.0
    y[[12, 40]] = 0.0, -np.inf
    a, b = row_dtype(0.37), row_dtype(1 / 768)  # no power of two: each product rounds
    init = tuple(np.linspace(-1, 1, LANES, dtype=lane_dtype))
    lo, hi = 8, 8 + 15 * LANES
    with np.errstate(all="ignore"):
        want = [np.array(v, lane_dtype).view(np.uint8) for v in _terms_in_a_row(x, y, a, b, lo, hi, init)]
        got = _terms_in_place(x, y, a, b, lo, hi, init)
        for k, (fold, terms, rows, scalars) in enumerate(_TERMS):
            assert np.array_equal(np.array(got[k], lane_dtype).view(np.uint8), want[k]), terms
            plain = getattr(lanes.plain_python, f"{fold}_of")(terms, (x, y)[:rows], (a, b)[:scalars], lo, hi,
                                                              tuple(map(lane_dtype, init)))
            plain = np.array(plain, lane_dtype)
            # the same bits, but for a NaN's sign: numpy's negation flips it, numba's keeps it
            assert np.array_equal(plain, want[k].view(lane_dtype), equal_nan=True), terms
            assert np.array_equal(plain[~np.isnan(plain)].view(np.uint8),
                                  want[k].view(lane_dtype)[~np.isnan(plain)].view(np.uint8)), terms


def _sums_of(terms: str):
    """njit of x -> the sums of `terms` over x's row and the scalar 1, `terms` a literal in its text."""
    namespace = {"lanes": lanes, "np": np}
    exec(f"def f(x):\n    return lanes.sums_of({terms!r}, (x,), (np.float32(1),), 0, x.size, (0.0,) * {LANES})",
         namespace)
    return njit(namespace["f"])


def test_a_fold_refuses_terms_it_cannot_compute():
    """Anything but + - * / and negation of the rows and scalars it is given is a typing error,
    never a guess (the schedule writes a row of terms for those)."""
    from numba.core.errors import TypingError
    x = np.arange(4 * LANES, dtype=np.float32)
    assert sum(_sums_of("(-(r0 * s0))")(x)) == -x.sum()
    for terms in ("r0 ** s0", "exp(r0)", "r2", "s1 * r0", "r0 <"):
        with pytest.raises(TypingError):
            _sums_of(terms)(x)
