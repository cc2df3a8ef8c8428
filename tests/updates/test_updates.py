import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from halide_ad.runtime.reference import evaluate
from tests.updates import programs as P


def _reference(fn, *args):
    traced, arrays = fn.trace(args, {})
    return evaluate(traced.program, arrays)[traced.program.outputs[0]]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_histogram_matches_bincount(rng, dtype):
    idx = rng.integers(-3, 12, 300)  # out-of-range values clamp into the end bins
    w = rng.random(300).astype(dtype)
    out = P.histogram(idx, w, 10)
    expected = np.bincount(np.clip(idx, 0, 9), w.astype(np.float64), 10)
    assert out.dtype == dtype
    np.testing.assert_allclose(out, expected, rtol=1e-5 if dtype == "float32" else 1e-12)
    np.testing.assert_allclose(out, _reference(P.histogram, idx, w, 10), rtol=1e-5)


def test_histogram_empty_bins_and_size_one(rng):
    idx = np.array([2, 2, 5] * 20)
    w = rng.random(60)
    out = P.histogram(idx, w, 8)
    assert np.all(out[[0, 1, 3, 4, 6, 7]] == 0)
    np.testing.assert_allclose(out, np.bincount(idx, w, 8))
    np.testing.assert_allclose(P.histogram(np.array([7]), np.array([0.5]), 1), [0.5])


def test_integer_counts_exact(rng):
    idx = rng.integers(0, 6, 500)
    assert np.array_equal(P.counts(idx, 6), np.bincount(idx, minlength=6).astype(np.int32))


THREADS_SCRIPT = """
import hashlib, json, sys
import numba, numpy as np
import halide_ad as hd
from tests.updates import programs as P

rng = np.random.default_rng(0)
f32 = lambda *shape: rng.standard_normal(shape).astype(np.float32)
idx, w, x = rng.integers(-2, 18, 5000), f32(5000), f32(999)
rows, rw = rng.integers(0, 3, (8, 600)), f32(8, 600)
i, j, w2 = rng.integers(0, 4, 900), rng.integers(0, 5, 900), f32(900)
a, b, c = rng.random((8, 50)).astype(np.float32), f32(8, 50), f32(6)
cases = {  # each: a program and its arguments; its forward, and its gradient for a cotangent
    "histogram (partial bins)": (P.histogram, idx, w, 16), "counts": (P.counts, idx, 16),
    "per-row histogram": (P.row_hist, rows, rw), "2-D bins": (P.hist2d, i, j, w2),
    "gather scatter": (P.pairs, x), "disjoint scatter": (P.strided_scatter, x),
    "scan": (P.iir, a, b), "cumsum": (P.cumsum, x), "taped (Horner)": (P.horner, c, x),
    "taped max": (P.row_max, rw),
}

def run(fn, *args):
    out, vjp_fn = hd.vjp(fn, *args)
    if out.dtype.kind != "f":
        return hashlib.sha256(out.tobytes()).hexdigest()
    grads = vjp_fn(np.random.default_rng(1).standard_normal(out.shape).astype(out.dtype))
    pieces = [out] + [g for g in grads if isinstance(g, np.ndarray)]
    return hashlib.sha256(b"".join(p.tobytes() for p in pieces)).hexdigest()

counts = [int(t) for t in sys.argv[1:]]
digests = {}
for t in counts:
    numba.set_num_threads(t)
    for name, (fn, *args) in cases.items():
        digests.setdefault(name, []).append(run(fn, *args))
print(json.dumps(digests))
"""


def test_bits_do_not_depend_on_thread_count():
    """Every rung, and the gradients, on 1, 2, 3 and 8 threads: in a child process whose numba
    allows 8 (NUMBA_NUM_THREADS may exceed the cores), outputs and gradients hashed."""
    counts = ["1", "2", "3", "8"]
    root = pathlib.Path(__file__).parents[2]
    path = os.pathsep.join(filter(None, (str(root), os.environ.get("PYTHONPATH"))))  # (for tests.updates)
    done = subprocess.run([sys.executable, "-c", THREADS_SCRIPT, *counts], capture_output=True, text=True,
                          timeout=600, check=False, cwd=root,
                          env=os.environ | {"NUMBA_NUM_THREADS": "8", "PYTHONPATH": path})
    assert done.returncode == 0, done.stderr[-3000:]
    digests = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(digests) == 10
    differ = {name: d for name, d in digests.items() if len(set(d)) != 1}
    assert not differ, f"bits differ across {counts} threads: {differ}"


def test_iir_scan_matches_loop(rng):
    a, b = rng.random((3, 7)), rng.random((3, 7))
    y = b.copy()
    for n in range(1, 7):
        y[:, n] = a[:, n] * y[:, n - 1] + b[:, n]
    np.testing.assert_allclose(P.iir(a, b), y, rtol=1e-12)
    np.testing.assert_allclose(_reference(P.iir, a, b), y, rtol=1e-12)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_cumsum(rng, dtype):
    x = rng.random(9).astype(dtype)
    np.testing.assert_allclose(P.cumsum(x), np.cumsum(x), rtol=1e-5)


def test_affine_scatter_matches_add_at(rng):
    x = rng.random(5)
    expected = np.ones(10)
    np.add.at(expected, 2 * np.arange(5), x * x)
    np.testing.assert_allclose(P.strided_scatter(x), expected)


def test_updates_apply_in_order(rng):
    x = rng.random(10)
    t = np.zeros(4)
    np.add.at(t, np.arange(10) % 4, x)
    t[0] *= 2
    np.testing.assert_allclose(P.two_updates(x), t + t[::-1])


def test_non_contiguous_inputs(rng):
    idx = rng.integers(0, 5, (40, 2))[:, 0]
    w = rng.random((40, 2))[:, 1]
    np.testing.assert_allclose(P.histogram(idx, w, 5), np.bincount(idx, w, 5))


def test_two_dimensional_bins_and_per_row_histograms(rng):
    i, j, w = rng.integers(0, 4, 80), rng.integers(0, 5, 80), rng.random(80)
    expected = np.zeros((4, 5))
    np.add.at(expected, (i, j), w)
    np.testing.assert_allclose(P.hist2d(i, j, w), expected)
    for rows in ((4, 30), (3, 70)):  # rung 4 (rows in parallel), rung 3 (partitions of each row)
        idx, w2 = rng.integers(-1, 4, rows), rng.random(rows)
        expected = np.stack([np.bincount(np.clip(idx[k], 0, 2), w2[k], 3) for k in range(rows[0])])
        np.testing.assert_allclose(P.row_hist(idx, w2), expected, rtol=1e-12)
        np.testing.assert_allclose(_reference(P.row_hist, idx, w2), expected, rtol=1e-12)


def test_constant_indices_zero_d_tensors_and_predicates(rng):
    x = rng.random(40)
    np.testing.assert_allclose(P.ends(x), [x.sum(), 0, -np.sum(x * x)])
    np.testing.assert_allclose(P.sum_of_squares(x), np.sum(x * x))
    expected = np.zeros(5)
    np.add.at(expected, np.arange(40)[x > 0.5] % 5, x[x > 0.5])
    np.testing.assert_allclose(P.masked(x), expected)


@pytest.mark.parametrize("n", [1, 9, 200])
def test_affine_colliding_scatter_runs_as_a_gather(rng, n):
    x = rng.random(n)
    expected = np.full(n // 2 + 1, 0.5)
    np.add.at(expected, np.arange(n) // 2, x * x)
    np.testing.assert_allclose(P.pairs(x), expected, rtol=1e-12)
