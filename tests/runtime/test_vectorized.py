"""The interpreter tier's evaluator (runtime/vectorized.py) against the reference interpreter: the
same values on fuzzed programs and on the benchmark's kernels, its plans (which variables loop,
which split into phases, which indices read as views) and its cost model's decisions."""
import functools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import halide_ad as hd
from halide_ad import config
from halide_ad.ad import reverse_mode
from halide_ad.api import as_function
from halide_ad.runtime import (bitselect, reference, vectorized, vectorized_cost, vectorized_plans,
                              vectorized_separable)
from tests.runtime.test_fuzz_programs import _inputs, build, programs
from tests import programs as P


def _each_scatter(scatters, adj, buffers):
    for s in scatters:
        vectorized.scatter(s, adj, buffers)


INTERPRETERS = {"vectorized": (vectorized.func, _each_scatter),  # (a separable window's taps as written)
                "separable": (vectorized_separable.func, vectorized_separable.scatters)}  # (the tier's)


def _both(fn, args, ct_seed=0, interpreter="separable"):
    """(reference's, the interpreter's) forward buffers and gradients of fn at args."""
    traced, arrays = as_function(fn).trace(tuple(args), {})
    program, wrt = traced.program, traced.float_args
    adjoints = reverse_mode(program, wrt)
    out = []
    for func, scatters in ((None, None), INTERPRETERS[interpreter]):
        buffers = reference.evaluate(program, arrays, func=func)
        shape = np.shape(buffers[program.outputs[0]])
        ct = np.random.default_rng(ct_seed).standard_normal(shape).astype(buffers[program.outputs[0]].dtype)
        grads = reference.scatter_adjoints(program, adjoints, wrt, arrays | buffers, {program.outputs[0]: ct},
                                           scatters=scatters)
        out.append((buffers, grads))
    return out


def _assert_same(fn, args, rtol=1e-12):
    for interpreter in INTERPRETERS:
        _assert_one(fn, args, rtol, interpreter)


def _assert_one(fn, args, rtol, interpreter):
    (fwd, grads), (vfwd, vgrads) = _both(fn, args, interpreter=interpreter)
    for name, value in fwd.items():
        if value is None:  # (an untaped update's tape)
            continue
        assert vfwd[name].dtype == value.dtype and vfwd[name].shape == value.shape, name
        np.testing.assert_allclose(vfwd[name], value, rtol=rtol, atol=rtol, err_msg=name)
    for name, value in grads.items():
        assert vgrads[name].dtype == value.dtype, name
        np.testing.assert_allclose(vgrads[name], value, rtol=rtol, atol=rtol * max(1, np.abs(value).max()),
                                   err_msg=name)


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(case=programs(), seed=st.integers(0, 2**16))
def test_random_program_equals_reference(case, seed):
    in_shape, stages = case
    x, w, _ = _inputs(in_shape, seed)
    _assert_one(build(stages), (x, w), 1e-10, "separable")  # (which runs the rest as `vectorized` does)


KERNELS = {
    "blur2d_mirror": (P.blur2d, lambda rng: (rng.standard_normal((5, 6)), "mirror")),
    "blur2d_edge": (P.blur2d, lambda rng: (rng.standard_normal((7, 9)), "repeat_edge")),
    "conv2d": (P.conv2d, lambda rng: (rng.standard_normal((2, 2, 5, 6)), rng.standard_normal((3, 2, 2, 3)))),
    "maxpool_ties": (P.maxpool2, lambda rng: (rng.integers(0, 3, (1, 2, 4, 6)).astype(np.float64),)),
    "softmax": (P.softmax, lambda rng: (rng.standard_normal((3, 5)),)),
    "blur_pool": (P.blur_pool, lambda rng: (rng.standard_normal((6, 6)),)),
    "dense": (P.dense, lambda rng: (rng.standard_normal((4, 5)), rng.standard_normal((5, 3)), rng.standard_normal(3))),
}


@pytest.mark.parametrize("name", list(KERNELS))
def test_kernels_equal_reference(name, rng):
    fn, make = KERNELS[name]
    _assert_same(fn, make(rng))


@pytest.mark.parametrize("case", ["blur", "conv2d", "conv2d_s2", "maxpool", "avgpool", "upsample", "bilinear",
                                  "dense", "pipeline"])
def test_benchmark_cases_equal_reference_in_float32(case):
    from benchmarks.cases import CASES  # (the small shapes: odd sizes, every boundary)
    c = {c.name: c for c in CASES}[case]
    _assert_same(c.halide_ad, c.make_inputs(small=True), rtol=2e-6)


@pytest.mark.parametrize("case", ["blur", "conv2d_s2", "maxpool", "upsample", "bilinear", "pipeline"])
def test_pieces_equal_reference(monkeypatch, case):
    """Funcs and scatters cut into pieces of a few points, run on the threads."""
    from benchmarks.cases import CASES
    monkeypatch.setattr(vectorized_plans, "CHUNK", 7)
    c = {c.name: c for c in CASES}[case]
    _assert_same(c.halide_ad, [x.astype(np.float64) for x in c.make_inputs(small=True)])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape, layout", [
    ((1, 1, 1, 1), None),                        # one pixel: both taps of every row clamp to it
    ((1, 2, 2, 3), None),                        # (i - 1) // 2 clamps at 0, (i + 1) // 2 at the last row
    ((2, 1, 3, 5), lambda a: a.transpose(0, 1, 3, 2)),  # a transposed view
    ((1, 2, 4, 10), lambda a: a[..., 1::2]),     # a strided view
])
def test_bilinear_resize_at_the_edges(shape, layout, dtype):
    """The bilinear gradient's scatters: weights along i and j multiplied first, then the
    cotangent (`vectorized._product`), each clamped index summed into the edge rows."""
    from benchmarks.cases import resize_bilinear2x
    x = np.random.default_rng(3).standard_normal(shape).astype(dtype)
    _assert_same(resize_bilinear2x, ((layout or np.asarray)(x),), rtol=2e-6 if dtype == np.float32 else 1e-12)


def test_a_product_multiplies_its_small_factors_first():
    """x[c, i, j] * a[i] * b[j]: a[i] * b[j] is an outer product of n**2 points, then one pass
    over the c n**2 points of x, not two; the cost model counts the same."""
    @hd.func
    def weighted(x, a, b):
        return hd.compute(x.shape, lambda c, i, j: x[c, i, j] * a[i] * b[j])

    c, n = 16, 128
    assert _work(weighted, (c, n, n), (n,), (n,), grad=False) < 4 * c * n * n  # load, product, write: 3, not 4
    (fwd, _), (vfwd, _) = _both(weighted, [np.full((2, 3, 4), 1e10), np.full(3, 1e300), np.full(4, 1e-300)])
    out = next(iter(fwd))
    assert np.isinf(fwd[out]).all() and np.isfinite(vfwd[out]).all()  # reassociated: rounds apart


def test_nan_and_ties_in_a_looped_max():
    """A window max runs one tap at a time (its taps share an index with the output's variable):
    the first of equal maxima and the first NaN win, as in the reference."""
    x = np.array([[1.0, 3.0, 3.0, np.nan, 2.0, np.nan, -np.inf, -np.inf]])

    @hd.func
    def pool(x):
        r = hd.rdom(2)
        return hd.compute((1, 4), lambda i, j: hd.max(x[i, 2 * j + r]))

    (fwd, _), (vfwd, _) = _both(pool, (x,))
    for name in fwd:
        np.testing.assert_array_equal(vfwd[name], fwd[name])


@pytest.mark.parametrize("op", ["max", "min", "argmax", "argmin"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int16, np.int64])
@pytest.mark.parametrize("nan", [False, True], ids=["numbers", "a NaN"])
def test_a_looped_extremum_takes_the_points_the_strict_rule_takes(op, dtype, nan, monkeypatch):
    """A window's max, min, argmax and argmin, one tap at a time: np.maximum (np.minimum) and the
    positions' running maximum until a NaN turns up, the strict comparison's rule after. The
    same bits as the strict rule at every tap (ties of equal values and of 0.0 against -0.0 in
    one window, infinities, a NaN), and the reference's values (the sign of a zero maximum is
    the first zero's there, np.max's)."""
    rng = np.random.default_rng(7)
    x = rng.integers(-3, 4, (3, 5, 12)).astype(dtype)
    if np.dtype(dtype).kind == "f":
        x[0, 0, :4] = 0.0, -0.0, 0.0, -0.0
        x[0, 1, :4] = -0.0, 0.0, -0.0, 0.0
        x[1, 2, :4] = -np.inf, np.inf, np.inf, 1.0
        if nan:
            x[2, 3, 1] = np.nan
            x[2, 4, 2:4] = np.nan, 5.0
    elif nan:
        pytest.skip("no NaN in integers")
    reduce = {"max": hd.max, "min": hd.min, "argmax": hd.argmax, "argmin": hd.argmin}[op]

    @hd.func
    def pool(x):
        r = hd.rdom(4)
        return hd.compute((3, 5, 3), lambda n, i, j: reduce(x[n, i, 4 * j + r]))

    (fwd, _), (vfwd, _) = _both(pool, (x,))
    monkeypatch.setattr(vectorized, "_extremum_loop", functools.partial(vectorized._extremum_loop, exact=True))
    _, (strict, _) = _both(pool, (x,))
    for name in fwd:
        assert vfwd[name].dtype == fwd[name].dtype, name
        np.testing.assert_array_equal(vfwd[name], fwd[name], err_msg=name)
        assert vfwd[name].tobytes() == strict[name].tobytes(), name


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int8, np.int64, np.bool_])
def test_where_selects_the_bits_np_where_does(dtype):
    """`vectorized._where` (a select on bits) against np.where: broadcast and non-contiguous
    operands, a non-bool condition, NaN, -0.0 and inf, into a fresh array and into `out`."""
    rng = np.random.default_rng(4)
    true = rng.standard_normal((3, 1, 5)) * 50
    false = (rng.standard_normal((5, 4)) * 50).T[:, ::-1]  # a reversed transposed view
    if np.dtype(dtype).kind == "f":
        true.flat[:3] = np.nan, -0.0, np.inf
        false.flat[:3] = -0.0, np.nan, -np.inf
    true, false = true.astype(dtype), false.astype(dtype)
    cond = rng.integers(0, 3, (3, 4, 1))  # 2 holds, as in np.where
    expect = np.where(cond, true, false)
    for got in (bitselect.where(cond, true, false), bitselect.where(cond, true, false, out=np.empty_like(expect))):
        assert got.dtype == expect.dtype and got.shape == expect.shape
        assert got.tobytes() == expect.tobytes()
    one = np.asarray(-0.0).astype(dtype)
    assert bitselect.where(np.True_, one, np.ones(1, dtype)).tobytes() == one.reshape(1).tobytes()
    for zero in (np.asarray(0, dtype), np.zeros((1, 1, 1), dtype), np.asarray(-0.0).astype(dtype)):
        expect = np.where(cond, true, zero)  # a relu's select: where -0.0 is no zero bits
        for got in (bitselect.where(cond, true, zero), bitselect.where(cond, true, zero, out=np.empty_like(expect))):
            assert got.shape == expect.shape and got.tobytes() == expect.tobytes()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape, layout", [
    ((1, 1, 2, 2), None),                                   # one window; every blur tap clamps at both ends
    ((1, 2, 3, 2), None),                                   # an odd last row, which the pool drops
    ((2, 1, 5, 4), lambda a: a.transpose(0, 1, 3, 2)),      # a transposed view
    ((1, 2, 4, 12), lambda a: a[..., ::-2]),                # a reversed strided view
])
def test_pipeline_relu_and_pool_at_the_edges(shape, layout, dtype):
    """blur, relu (a Select written into its Func's buffer on bits), 2x2 max pool with NaN and
    ties: values and gradients as the reference's."""
    from benchmarks.cases import blur_relu_maxpool
    x = np.random.default_rng(5).standard_normal(shape)
    x.flat[::5] = 0.0  # ties at zero after the relu
    x.flat[3] = np.nan if x.size > 3 else x.flat[-1]
    x = (layout or np.asarray)(x.astype(dtype))
    tol = 2e-6 if dtype == np.float32 else 1e-12  # (sums of nine taps round apart: an absolute part too)
    for interpreter in INTERPRETERS:
        (fwd, grads), (vfwd, vgrads) = _both(blur_relu_maxpool, (x,), interpreter=interpreter)
        for mine, theirs in ((vfwd, fwd), (vgrads, grads)):
            for name, value in theirs.items():
                np.testing.assert_allclose(mine[name], value, rtol=tol, atol=tol, err_msg=name)


def test_funcs_fill_recycled_buffers_never_held_ones(monkeypatch):
    """A Func's buffer comes from the buffer pool: a later call's freed pages, never an array the
    caller still holds."""
    from halide_ad.runtime import buffers
    monkeypatch.setattr(buffers, "pool", buffers.BufferPool(1 << 30))
    relu = as_function(lambda x: hd.compute(x.shape, lambda i, j: hd.where(x[i, j] > 0, x[i, j], 0.0)))
    rng = np.random.default_rng(6)
    a, b = rng.standard_normal((2, 512, 512))  # 2 MiB: pooled
    traced, arrays = relu.trace((a,), {})
    program, name = traced.program, traced.program.outputs[0]
    run = lambda x: reference.evaluate(program, {next(iter(arrays)): x}, func=vectorized.func)[name]  # noqa: E731
    held = run(a)
    address = held.__array_interface__["data"][0]
    other = run(b)
    np.testing.assert_array_equal(held, np.maximum(a, 0))
    np.testing.assert_array_equal(other, np.maximum(b, 0))
    del held
    assert run(b).__array_interface__["data"][0] == address


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape, layout", [((1, 1), None), ((1, 9), None), ((9, 1), None),
                                           ((6, 5), lambda a: a.T), ((5, 14), lambda a: a[:, ::-2])])
@pytest.mark.parametrize("chunk", [3, vectorized_plans.CHUNK])
def test_clamped_reads_in_pieces(monkeypatch, shape, layout, dtype, chunk):
    """A 3x3 repeat_edge blur whose pieces are a few rows, each reading the edge-padded copy
    (clamped at both ends of a size-1 axis too)."""
    monkeypatch.setattr(vectorized_plans, "CHUNK", chunk)
    x = (layout or np.asarray)(np.random.default_rng(7).standard_normal(shape).astype(dtype))
    _assert_same(P.blur2d, (x, "repeat_edge"), rtol=2e-6 if dtype == np.float32 else 1e-12)


def test_plans():
    i, j, r, c = (hd.ir.Var(n) for n in "ijrc")
    load = hd.ir.Load("x", (c, hd.ir.Bin(hd.ir.Op.ADD, i, r)), "float64")
    counts = {i: 62, j: 62, r: 3, c: 32}
    # the window's variable loops, the channel is summed by einsum
    assert vectorized_plans.looped_vars(vectorized_plans.index_dims((load,)), counts, {r, c}) == {r}
    half = hd.ir.Bin(hd.ir.Op.FLOORDIV, hd.ir.Bin(hd.ir.Op.SUB, i, hd.ir.const(1)), hd.ir.const(2))
    assert vectorized_plans.phases((half,), {i, j}) == {i: 2}


@pytest.mark.parametrize("vector, runs", [
    ([3, 4, 5, 6], [(0, 4, 1)]),
    ([0, 0, 1, 2, 3, 3], [(0, 2, 0), (2, 5, 1), (5, 6, 1)]),
    ([1, 0, 1, 2, 3, 2], [(0, 2, -1), (2, 5, 1), (5, 6, 1)]),
    ([6, 4, 2], [(0, 3, -2)]),
    ([5], [(0, 1, 1)]),
])
def test_runs(vector, runs):
    vector = np.array(vector)
    assert vectorized._runs(vector) == runs
    rebuilt = np.concatenate([np.full(stop - first, vector[first]) if step == 0 else
                              np.arange(12)[vectorized._piece(vector, first, stop, step)]
                              for first, stop, step in runs])
    np.testing.assert_array_equal(rebuilt, vector)


def test_clamped_reads_use_an_edge_padded_copy():
    assert vectorized._clamped(np.clip(np.arange(-1, 9), 0, 7), 8) == -1
    assert vectorized._clamped(np.arange(0, 8), 8) is None  # a progression reads as a view already
    assert vectorized._clamped(np.array([0, 0, 5, 7]), 8) is None


def _passes(fn, *shapes, grad=True):
    traced, _ = as_function(fn).trace(tuple(np.zeros(s, np.float32) for s in shapes), {})
    adjoints = reverse_mode(traced.program, traced.float_args) if grad else []
    return vectorized_cost.passes(traced.program, adjoints)


def _work(fn, *shapes, grad=True):
    return sum(_passes(fn, *shapes, grad=grad))


def test_the_cost_model_counts_what_numpy_does():
    """Element operations, from the plan: a convolution's multiply-adds go to BLAS, a window's
    taps each cost a pass over the output, an update's steps each cost a Python step."""
    conv = _work(P.conv2d, (8, 32, 64, 64), (32, 32, 3, 3))
    macs = 2 * 8 * 32 * 62 * 62 * 32 * 9  # forward and the input's gradient, about
    assert conv < macs  # (BLAS's share counts a fraction)
    def blur(img):
        return P.blur2d(img, "repeat_edge")

    small = _work(blur, (512, 512), grad=False)
    assert 9 * 512 * 512 <= small <= 40 * 512 * 512
    assert _work(blur, (1024, 1024), grad=False) > 3 * small  # grows with the image

    @hd.func
    def scan(x):
        t = hd.zeros(x.shape, x.dtype)
        r = hd.rdom(x.shape[0] - 1)
        t[r + 1] = t[r] * 0.5 + x[r + 1]
        return t

    assert _work(scan, (10_000,)) >= 2 * 10_000 * vectorized_cost.PYTHON_STEP


# whether a first call (forward and gradient: one tier for both) runs on the interpreter at the
# default cap (per pass), at the benchmark's shapes: all of them (the bilinear resize's passes at
# 0.57 and 0.68 of it, as two passes of its separable window, 0.89 and 0.84 as its taps; its first vjp and backward took 3.2-3.3 s there against 3.5-5.1 s
# compiling first, load 4, docs/performance.md)
INTERPRETED = {"blur": True, "conv2d": True, "conv2d_s2": True, "maxpool": True, "avgpool": True,
               "upsample": True, "bilinear": True, "dense": True, "pipeline": True}


def test_which_benchmark_kernels_run_their_first_calls_on_the_interpreter():
    from benchmarks.cases import CASES
    for case in CASES:
        chosen = max(_passes(case.halide_ad, *case.input_shapes(small=False))) <= config.INTERPRET_MAX
        assert chosen == INTERPRETED[case.name], case.name
