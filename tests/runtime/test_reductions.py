"""How forward reductions run: long float32 sums accumulate in float64, a reduction over an outer
axis runs a row at a time, a reduction over the last axis as partial sums. Each is checked for
its shape in the generated source and against numpy (float64 references), with extents that
leave partial rounds of the partial sums."""
import re

import numpy as np
import pytest

import halide_ad as hd
from halide_ad import ops, tiered
from halide_ad.runtime.lower import LONG_SUM
from halide_ad.runtime.schedule.accumulate import LANES


def _within_one_ulp(got, exact):
    """float32 `got` is `exact` (float64) rounded, give or take one float32 step."""
    exact = np.asarray(exact, np.float64)
    step = np.spacing(np.abs(exact).astype(np.float32)).astype(np.float64)
    assert np.all(np.abs(np.asarray(got, np.float64) - exact) <= step), (got, exact)


@hd.func
def sum_of_squares(x):
    return ops.sum(x * x)


def test_a_long_float32_sum_is_rounded_once(rng):
    # 300k terms near 1/3: a float32 running total drifts by far more than one step
    x = rng.random((600, 500), dtype=np.float32)
    squares = (x * x).astype(np.float64)
    _within_one_ulp(sum_of_squares(x), squares.sum())
    y = rng.random((600, 500), dtype=np.float32)  # a dot product, at any parallel threshold, on either tier
    dot = hd.func(lambda x, y: ops.sum(x * y))
    first = dot(x, y)
    tiered.settle()
    for got in (first, dot(x, y)):
        _within_one_ulp(got, (x.astype(np.float64) * y).sum())
    _within_one_ulp(hd.func(lambda x: ops.sum(x, axis=0))(x), x.astype(np.float64).sum(axis=0))
    _within_one_ulp(hd.func(lambda x: ops.sum(x, axis=1))(x), x.astype(np.float64).sum(axis=1))
    assert "acc = 0.0\n" in hd.explain(sum_of_squares, x).forward_source  # a float64 literal


def test_a_short_float32_sum_stays_float32(rng):
    x = rng.random((4, LONG_SUM - 1), dtype=np.float32)
    source = hd.explain(hd.func(lambda x: ops.sum(x, axis=1)), x).forward_source
    assert "acc = f32_" in source, source


@hd.func
def scaled_tanh(x, g):
    return hd.compute(x.shape, lambda n, c: hd.tanh(x[n, c] * g[c]))


def test_a_long_float32_gradient_window_accumulates_in_float64(rng):
    x = rng.random((200_000, 2), dtype=np.float32)
    g = rng.random(2, dtype=np.float32)
    ct = rng.random(x.shape, dtype=np.float32)
    _, f_vjp = hd.vjp(scaled_tanh, x, g)
    _, dg = f_vjp(ct)
    y = np.tanh(x * g).astype(np.float64)  # the forward's float32 values, summed exactly
    terms = (ct * (np.float32(1) - y.astype(np.float32) ** 2) * x).astype(np.float64)
    np.testing.assert_allclose(dg, terms.sum(axis=0), rtol=1e-6)
    # a row of float64 accumulators: the gathers walk x's rows, adding into every column's total
    assert "np.empty(2, np.float64)" in hd.explain(scaled_tanh, x, g).backward_source


def test_a_long_float32_gradient_across_a_row_accumulates_in_float64(rng):
    @hd.func
    def row_scaled_tanh(x, g):  # g's gradient sums each row: an element at a time
        return hd.compute(x.shape, lambda n, c: hd.tanh(x[n, c] * g[n]))

    x = rng.random((2, 200_000), dtype=np.float32)
    g = rng.random(2, dtype=np.float32)
    ct = rng.random(x.shape, dtype=np.float32)
    _, dg = hd.vjp(row_scaled_tanh, x, g)[1](ct)
    y = np.tanh(x * g[:, None]).astype(np.float32)
    terms = (ct * (np.float32(1) - y ** 2) * x).astype(np.float64)
    np.testing.assert_allclose(dg, terms.sum(axis=1), rtol=1e-6)
    assert "acc = np.float64(" in hd.explain(row_scaled_tanh, x, g).backward_source


def test_a_gradient_summed_over_outer_rows_runs_a_row_at_a_time(rng):
    x, g = rng.standard_normal((7, 9)), rng.standard_normal(9)
    source = hd.explain(scaled_tanh, x, g).backward_source
    # g's adjoint: the loop over x's rows encloses the loop over g's entries
    rows = (r"for n in range\(0, 7\):\n( +n_nn = nonneg\(n\)\n)? +for (\w+) in range\(0, 9\):\n +(\2_nn) = nonneg\(\2\)\n +"
            r"adj_g\[\3\] = adj_g\[\3\] \+")
    assert re.search(rows, source), source
    hd.check_grad(scaled_tanh, x, g)
    torch = pytest.importorskip("torch")
    tx, tg = torch.tensor(x, requires_grad=True), torch.tensor(g, requires_grad=True)
    ct = rng.standard_normal(x.shape)
    want = torch.autograd.grad(torch.tanh(tx * tg), (tx, tg), torch.tensor(ct))
    for got, w in zip(hd.vjp(scaled_tanh, x, g)[1](ct), want, strict=True):
        np.testing.assert_allclose(got, w.numpy(), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("axis, keepdims", [(1, False), ((0, 2), False), (1, True), (0, False)])
def test_a_sum_over_outer_axes_runs_a_row_at_a_time(rng, dtype, axis, keepdims):
    x = rng.standard_normal((3, 5, 7, 9)).astype(dtype)
    fn = hd.func(lambda x: ops.mean(x, axis=axis, keepdims=keepdims))
    got = fn(x)
    np.testing.assert_allclose(got, x.astype(np.float64).mean(axis=axis, keepdims=keepdims),
                               rtol=1e-6 if dtype == np.float32 else 1e-13, atol=1e-7)
    source = hd.explain(fn, x).forward_source
    # the reduction's loops enclose the row's: the output accumulates in place
    row_inside = (r"for (r\w*) in range\(0, \d+\):\n( +\1_nn = nonneg\(\1\)\n)? +for (\w+) in range\(0, 9\):\n"
                  r" +\3_nn = nonneg\(\3\)\n +mean\[(.*)\] = mean\[\4\] \+")
    assert re.search(row_inside, source), source
    if dtype == np.float64:
        hd.check_grad(fn, x.astype(np.float64))


def test_a_row_sum_in_float64_uses_a_row_of_its_own(rng):
    x = rng.random((2 * LONG_SUM, 3, 5), dtype=np.float32)
    fn = hd.func(lambda x: ops.sum(x, axis=0))
    _within_one_ulp(fn(x), x.astype(np.float64).sum(axis=0))
    assert "np.empty(5, np.float64)" in hd.explain(fn, x).forward_source


def test_a_masked_row_sum(rng):
    @hd.func
    def upper(x):
        n, m = x.shape
        r = hd.rdom(n, where=lambda r: r <= 2)
        return hd.compute((m,), lambda j: hd.sum(x[r, j] * 2.0))
    x = rng.standard_normal((6, 11))
    np.testing.assert_allclose(upper(x), 2 * x[:3].sum(axis=0), rtol=1e-13)
    hd.check_grad(upper, x)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("extent", [2 * LANES - 1, 2 * LANES, 2 * LANES + 3, 100])
def test_a_sum_over_the_last_axis_runs_as_partial_sums(rng, dtype, extent):
    x = (rng.random((4, 3, extent)) + 0.5).astype(dtype)
    fns = {"sum": hd.func(lambda x: ops.sum(x, axis=-1)),
           "prod": hd.func(lambda x: ops.prod(x, axis=(1, 2))),
           "all": hd.func(lambda x: ops.sum(x))}
    wants = {"sum": x.astype(np.float64).sum(axis=-1), "prod": x.astype(np.float64).prod(axis=(1, 2)),
             "all": x.astype(np.float64).sum()}
    tol = 1e-6 if dtype == np.float32 else 1e-13
    for name, fn in fns.items():
        np.testing.assert_allclose(fn(x), wants[name], rtol=tol, err_msg=name)
        source = hd.explain(fn, x).forward_source
        assert (f"acc_lane{LANES - 1}" in source) == (extent >= 2 * LANES), (name, source)
    if dtype == np.float64:
        hd.check_grad(fns["sum"], x)
        hd.check_grad(fns["prod"], x)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_few_long_sums_run_in_parallel(rng, dtype, monkeypatch):
    # three channels of 40 terms each: parallel from 64 points' work, not 64 points
    monkeypatch.setenv("HALIDE_AD_PARALLEL_MIN_POINTS", "64")
    x = rng.standard_normal((2, 3, 4, 5)).astype(dtype)
    fn = hd.func(lambda x: ops.batch_norm(x))
    explained = hd.explain(fn, x)
    over_channels = r"parallel_for\(\w+, 0, 3,"  # the mean's and variance's; their adjoints' row group
    assert len(re.findall(over_channels, explained.forward_source)) == 2, explained.forward_source
    assert len(re.findall(over_channels, explained.backward_source)) == 1, explained.backward_source
    torch = pytest.importorskip("torch")
    y, f_vjp = hd.vjp(fn, x)
    ct = rng.standard_normal(y.shape).astype(dtype)
    tx = torch.tensor(x, requires_grad=True)
    ty = torch.nn.functional.batch_norm(tx, None, None, training=True, eps=1e-5)
    (tdx,) = torch.autograd.grad(ty, tx, torch.tensor(ct))
    tol = 1e-4 if dtype == np.float32 else 1e-10
    np.testing.assert_allclose(y, ty.detach().numpy(), rtol=tol, atol=tol)
    (dx,) = f_vjp(ct)
    np.testing.assert_allclose(dx, tdx.numpy(), rtol=tol, atol=tol)
    if dtype == np.float64:
        hd.check_grad(fn, x)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape, parts", [((6, 20), 3), ((7, 22), 11), ((13, 17), None), ((1, 80), 16)])
def test_a_sum_to_one_point_runs_as_parallel_parts(rng, monkeypatch, dtype, shape, parts):
    # small shapes count as long once 64 terms do: the first extent that some number of parts
    # from 2 to MAX_PARTS divides is cut (7 and 13, 17 are prime: 22 is cut, then nothing)
    monkeypatch.setenv("HALIDE_AD_PARALLEL_MIN_POINTS", "64")
    x = (rng.random(shape) + 0.5).astype(dtype)

    @hd.func
    def programs(x):
        n, m = x.shape
        r, s = hd.rdom(n, m, where=lambda r, s: r + s != 3)
        masked = hd.compute((), lambda: hd.sum(x[r, s] * x[r, s]))
        return {"sum": ops.sum(x), "prod": ops.prod(x / 1.01),
                "keepdims": ops.mean(x, axis=(0, 1), keepdims=True), "masked": masked}

    want = {"sum": x.astype(np.float64).sum(), "prod": (x / dtype(1.01)).astype(np.float64).prod(),
            "keepdims": x.astype(np.float64).mean(keepdims=True)}
    mask = np.add.outer(np.arange(shape[0]), np.arange(shape[1])) != 3
    want["masked"] = (x.astype(np.float64) ** 2 * mask).sum()
    got = programs(x)
    tol = 1e-6 if dtype == np.float32 else 1e-13
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=tol, err_msg=name)
    source = hd.explain(programs, x).forward_source
    if parts is None:
        assert "_parts" not in source, source
    else:
        assert source.count("parallel_for(forward_p") >= 4 and f"_part in range(0, {parts})" in source, source
    if dtype == np.float64:
        hd.check_grad(programs, x)


def test_a_row_gradient_of_an_output_starts_from_its_cotangent(rng):
    @hd.func
    def scaled_and_scale(x, g0):
        g = hd.compute(g0.shape, lambda c: g0[c] * 2.0, name="g")  # an output that y also reads
        return hd.compute(x.shape, lambda n, c: hd.tanh(x[n, c] * g[c]), name="y"), g

    x, g0 = rng.standard_normal((6, 5)), rng.standard_normal(5)
    assert re.search(r"adj_g\[(\w+_nn)\] = ct_g\[\1\]", hd.explain(scaled_and_scale, x, g0).backward_source)
    (y, g), f_vjp = hd.vjp(scaled_and_scale, x, g0)
    ct_y, ct_g = rng.standard_normal(y.shape), rng.standard_normal(g.shape)
    dx, dg0 = f_vjp((ct_y, ct_g))
    sech2 = 1 - np.tanh(x * 2 * g0) ** 2
    np.testing.assert_allclose(dx, ct_y * sech2 * 2 * g0, rtol=1e-12)
    np.testing.assert_allclose(dg0, 2 * (ct_g + (ct_y * sech2 * x).sum(axis=0)), rtol=1e-12)


# ---- gradients that sum over a row or down the columns ---------------------------------------------

@hd.func
def _softmax(x):
    return ops.softmax(x)


@hd.func
def _layer_norm(x, g, b):
    return ops.layer_norm(x, g, b)


@pytest.mark.parametrize("columns", [2 * LANES, 8 * LANES + 3])
def test_a_gradient_summing_over_a_row_adds_lanes(rng, columns):
    """softmax's adjoint of its row sum is a window over the row: LANES partial sums over the
    columns (`split_accumulators`, folded in one vector, each term the product of the cotangent's
    and exp's rows computed by the fold: `lanes.sums_of`), then the rest, with extents that leave
    a partial round."""
    x = rng.standard_normal((300, columns)).astype(np.float32)
    assert ' = lanes.sums_of("(r0 * r1)", (adj_softmax[' in hd.explain(_softmax, x).backward_source
    y, vjp = hd.vjp(_softmax, x)
    ct = rng.standard_normal(x.shape).astype(np.float32)
    (gx,) = vjp(ct)
    s = np.exp(x - x.max(1, keepdims=True)).astype(np.float64)
    s /= s.sum(1, keepdims=True)
    want = s * (ct - (ct * s).sum(1, keepdims=True))
    np.testing.assert_allclose(gx, want, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("columns", [2 * LANES, 8 * LANES + 3, LONG_SUM + 5])
def test_a_sums_factor_fixed_along_the_row_multiplies_the_lanes_once(rng, columns):
    """layer norm's mean sums x * (1 / n), its gradient's row sums -(ct * g * (x - m)) * c * r and
    -(ct * g * r): the fold adds x, ct * g * (x - m) and ct * g, and the factors that do not
    change along the row multiply the lanes' sum once, in float32 and float64 lanes alike, with
    extents that leave a partial round."""
    x = (rng.standard_normal((40, columns)) * 3 + 1).astype(np.float32)
    g, b = rng.standard_normal((2, columns)).astype(np.float32)
    explained = hd.explain(_layer_norm, x, g, b)
    assert re.search(r"= lanes\.sums\(x\[", explained.forward_source)
    assert re.search(r'= lanes\.sums_of\("\(\(r0 \* r1\) \* \(r2 - s0\)\)", \(adj_layer_norm\[', explained.backward_source)
    assert re.search(r'= lanes\.sums_of\("\(r0 \* r1\)", \(adj_layer_norm\[', explained.backward_source)
    y, vjp = hd.vjp(_layer_norm, x, g, b)
    ct = rng.standard_normal(x.shape).astype(np.float32)
    gx, gg, gb = vjp(ct)
    x64, g64, ct64 = (a.astype(np.float64) for a in (x, g, ct))
    r = 1 / np.sqrt(x64.var(1, keepdims=True) + 1e-5)
    xhat = (x64 - x64.mean(1, keepdims=True)) * r
    np.testing.assert_allclose(y, xhat * g64 + b, rtol=1e-4, atol=1e-5)
    d = ct64 * g64
    want = r * (d - d.mean(1, keepdims=True) - xhat * (d * xhat).mean(1, keepdims=True))
    np.testing.assert_allclose(gx, want, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(gg, (ct64 * xhat).sum(0), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(gb, ct64.sum(0), rtol=1e-4, atol=1e-4)


def test_a_one_dimensional_gradient_summed_down_columns_runs_blocks_of_columns(rng, monkeypatch):
    """A gain's gradient sums down its columns: blocks of columns run in parallel, each column
    in the same order as on one thread, so the bits equal the serial kernel's."""
    from halide_ad.runtime.schedule import rows
    monkeypatch.setenv("HALIDE_AD_PARALLEL_MIN_POINTS", "1024")
    x = rng.standard_normal((64, 3 * rows.COLUMN_BLOCK + 5)).astype(np.float32)
    g, b = rng.standard_normal((2, x.shape[1])).astype(np.float32)
    ct = rng.standard_normal(x.shape).astype(np.float32)
    source = hd.explain(_layer_norm, x, g, b).backward_source
    assert re.search(r"\bcol\d+ = col\d+_block \* \d+\n", source), source
    blocked = hd.vjp(_layer_norm, x, g, b)[1](ct)[1]
    xhat = (x - x.mean(1, keepdims=True, dtype=np.float64)) / np.sqrt(x.var(1, keepdims=True, dtype=np.float64) + 1e-5)
    np.testing.assert_allclose(blocked, (ct * xhat).sum(0), rtol=1e-4, atol=1e-4)
    monkeypatch.setattr(rows, "column_blocks", lambda shape, terms: None)
    serial = hd.vjp(hd.func(lambda x, g, b: ops.layer_norm(x, g, b)), x, g, b)[1](ct)[1]
    np.testing.assert_array_equal(blocked, serial)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_maximum_no_gradient_reaches_keeps_no_argindex(rng, dtype):
    """softmax's row maximum is read only under stop_gradient: it runs as LANES partial maxima
    with no argindex, NaN winning as in numpy; a max pool, whose gradient needs the argindex,
    keeps it."""
    x = rng.standard_normal((6, 8 * LANES + 5)).astype(dtype)
    x[2, 7] = np.nan
    source = hd.explain(_softmax, x).forward_source
    assert "arg_softmax_max" not in source and " = lanes.maxima(x[" in source
    got = _softmax(x)
    assert np.isnan(got[2]).all() and not np.isnan(np.delete(got, 2, 0)).any()
    clean = np.delete(x, 2, 0).astype(np.float64)
    e = np.exp(clean - clean.max(1, keepdims=True))
    np.testing.assert_allclose(np.delete(got, 2, 0), e / e.sum(1, keepdims=True), rtol=1e-5)
    pooled = hd.func(lambda x: ops.max_pool2d(x, 2))
    assert "arg_max_pool2d" in hd.explain(pooled, rng.standard_normal((1, 1, 4, 4))).forward_source
    row_max = hd.func(lambda x: ops.max(x, axis=1))  # an output: its gradient may be asked for
    y = rng.standard_normal((3, 40))
    np.testing.assert_array_equal(row_max(y), y.max(1))
    np.testing.assert_array_equal(hd.grad(lambda v: hd.sum(row_max(v)))(y),
                                  (y == y.max(1, keepdims=True)).astype(float))
