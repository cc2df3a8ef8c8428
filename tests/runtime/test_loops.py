"""The loop-nest IR (runtime/loops.py) and the emitter that prints it
(runtime/emit.py): parallel loops outlined from nests, every loop kind, and a kernel namespace that
no user name can break."""
import numpy as np
import pytest

import halide_ad as hd
from halide_ad.ir import INDEX_DTYPE, Bin, Const, Load, Op, Var
from halide_ad.runtime import emit, lower
from halide_ad.runtime.emit import Emitter
from halide_ad.runtime.loops import (Accumulate, Allocate, Block, Chain, Combine, Element, Fold, For, If, IfElse, Kind, Let, Local,
                                     Store, Term, Text, block, Row, loops, nest, walk)
from halide_ad.runtime.loops import show as loops_show
from halide_ad.runtime.parallel import parallel_for
from halide_ad.runtime.schedule.accumulate import LANES, pairwise, split_accumulators
from halide_ad.runtime.schedule.parallel import choose_parallel
from halide_ad.runtime.schedule.rows import interchange_rows

i, j = Var("i"), Var("j")


def _run(source: str, entry: str, *args):
    """`entry` from `source`, run as plain Python (`kernel` and `parallel_for` as the runtime has them)."""
    namespace = {"np": np, "kernel": lambda f: f, "parallel_for": parallel_for, "nonneg": lambda k: k}
    exec(source, namespace)
    return namespace[entry](*args)


def test_walk_and_nest_see_every_statement():
    store = Store("out", (i, j), Load("x", (i, j), "float64"))
    body = nest([(i, 0, 3, Kind.PARALLEL), (j, 0, 4, Kind.SERIAL)], store)
    assert [n.var for n in loops(body)] == [i, j]
    assert store in list(walk(body)) and loops(body)[0].kind is Kind.PARALLEL
    guarded = If(Bin(Op.LT, i, Const(2, "int64")), block(store), block(Let(j, Const(0, "int64"))))
    assert sum(isinstance(n, (Store, Let)) for n in walk(guarded)) == 2
    assert block(Block((store,)), store).body == (store, store)


def test_a_parallel_loop_is_outlined_from_the_nest():
    """The parallel loop's body becomes `entry_b*`, its range `entry_p*`, handed to parallel_for;
    the serial statement before it a function of its own; the serial loop around it stays."""
    em = Emitter({"x": (2, 3, 4), "out": (2, 3, 4)})
    k = Var("k")
    body = block(Store("out", (Const(0, "int64"), Const(0, "int64"), Const(0, "int64")), Const(7.0, "float64")),
                 nest([(k, 0, 2, Kind.SERIAL), (i, 0, 3, Kind.PARALLEL), (j, 0, 4, Kind.SERIAL)],
                      Store("out", (k, i, j), Bin(Op.MUL, Load("x", (k, i, j), "float64"), Const(2.0, "float64")))))
    source = emit.function(em, "run", body)
    assert "prange" not in source
    assert "parallel_for(run_p2, 0, 3, k, out, x, iteration=run_b1)" in source  # (buffers in order of use)
    assert "def run_b1(i, k, out, x):" in source and "def run_s0(out):" in source
    x, out = np.arange(24.0).reshape(2, 3, 4), np.zeros((2, 3, 4))
    _run(source, "run", out, x, np.zeros(3, np.int64))
    np.testing.assert_array_equal(out, x * 2)  # (out[0, 0, 0] = 7 came first, then the loop)


def test_reversed_and_unrolled_loops_run_their_iterations_in_order():
    em = Emitter({"out": (5,)})
    step = Store("out", (i,), Bin(Op.ADD, Load("out", (Bin(Op.ADD, i, Const(1, "int64")),), "float64"),
                                  Const(1.0, "float64")))
    backward = For(i, 0, 4, Kind.REVERSED, block(step))  # out[i] = out[i + 1] + 1, i = 3, 2, 1, 0
    source = emit.function(em, "run", block(backward))
    assert "range(3, -1, -1)" in source
    out = np.zeros(5)
    _run(source, "run", out, np.zeros(3, np.int64))
    np.testing.assert_array_equal(out, [4, 3, 2, 1, 0])

    em = Emitter({"out": (5,)})
    source = emit.function(em, "run", block(For(i, 1, 4, Kind.UNROLLED, block(Store("out", (i,), Const(1.0, "float64"))))))
    assert "for " not in source and "i = 3" in source
    out = np.zeros(5)
    _run(source, "run", out, np.zeros(3, np.int64))
    np.testing.assert_array_equal(out, [0, 1, 1, 1, 0])


def test_a_bound_that_differs_on_the_first_iteration_is_an_expression_printed_without_parentheses():
    """Loop bounds are expressions, never text: the emitter prints them, and a resolved loop
    holds the printed text (`Text`)."""
    first = IfElse(Chain(Op.EQ, (i, Const(1, "int64"))), Const(0, "int64"), Bin(Op.ADD, i, Const(1, "int64")))
    inner = For(j, first, Bin(Op.ADD, i, Const(2, "int64")), Kind.SERIAL,
                block(Accumulate(Load("out", (i,), "float64"), Load("x", (j,), "float64"), augmented=True)))
    em = Emitter({"out": (4,), "x": (5,)})
    resolved = emit.resolve(inner, em)
    assert resolved.lo == Text("0 if i == 1 else (i + 1)") and emit.resolve(resolved, em) == resolved
    assert loops_show(inner).startswith("for j in [0 if i == 1 else i + 1, i + 2):")
    source = emit.function(em, "run", block(For(i, 1, 4, Kind.SERIAL, block(inner))))
    out, x = np.zeros(4), np.arange(5.0)
    _run(source, "run", *[{"out": out, "x": x}[b] for b in em.used], np.zeros(3, np.int64))
    np.testing.assert_array_equal(out, [0, x[0:3].sum(), x[3], x[4]])  # i = 1 sums from j = 0


def test_literals_are_numbered_in_the_order_the_kernel_prints_them():
    """A literal met first where it is resolved but printed later gets the later number: the
    numbering follows the text, whatever order the statements were resolved in."""
    em = Emitter({"out": (2,)})
    one = Const(1.0, "float32")
    assert em.expr(one) == "f32_0"  # resolved first, printed second below
    body = block(Store("out", (Const(0, "int64"),), Const(0.5, "float32")), Store("out", (Const(1, "int64"),), one))
    source = emit.function(em, "run", body)
    assert source.startswith("f32_0 = np.float32(0.5)\nf32_1 = np.float32(1.0)\n")
    assert "out[0] = f32_0" in source and "out[1] = f32_1" in source
    out = np.zeros(2, np.float32)
    _run(source, "run", out, np.zeros(3, np.int64))
    np.testing.assert_array_equal(out, [0.5, 1.0])


# Parameters named like the names generated code uses for itself: the emitter renames them.
@hd.func
def _clashes_a(status, acc, vmath, nonneg):
    r = hd.rdom(3)
    return hd.compute((status.shape[0] - 2,), lambda t: hd.exp(hd.sum(status[t + r] * acc[r])) * vmath[t]
                      + nonneg[t + 1] * 2.0, name="clash_a")


@hd.func
def _clashes_b(np, math, checked, kernel, f32_0, h0, range):
    return hd.compute(np.shape, lambda t: hd.tanh(np[t] * math[t]) + checked[t] * kernel[t] + f32_0[t] * 0.5
                      + h0[t] / (range[t] * range[t] + 1.0), name="clash_b")


def _reference_a(s, a, v, n):
    return np.exp(np.convolve(s, a[::-1], "valid")) * v[:-2] + n[1:-1] * 2


def _reference_b(a, b, c, d, e, f, g):
    return np.tanh(a * b) + c * d + e * 0.5 + f / (g * g + 1)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_parameters_named_like_generated_names_compute_and_differentiate(dtype, rng):
    a = [rng.standard_normal(9).astype(dtype), rng.standard_normal(3).astype(dtype),
         rng.standard_normal(9).astype(dtype), rng.standard_normal(9).astype(dtype)]
    tol = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(_clashes_a(*a), _reference_a(*a), rtol=tol, atol=tol)
    b = [rng.standard_normal(7).astype(dtype) for _ in range(7)]
    np.testing.assert_allclose(_clashes_b(*b), _reference_b(*b), rtol=tol, atol=tol)
    if dtype == np.float64:
        hd.check_grad(_clashes_a, *a)
        hd.check_grad(_clashes_b, *b)


def test_clashing_parameters_under_parallel_loops(rng, monkeypatch):
    """Every loop nest parallel: the outlined functions take the renamed parameters too."""
    monkeypatch.setenv("HALIDE_AD_PARALLEL_MIN_POINTS", "0")
    b = [rng.standard_normal(7) for _ in range(7)]
    clashes = hd.func(_clashes_b.fn)  # a trace of its own, compiled under the setting
    np.testing.assert_allclose(clashes(*b), _reference_b(*b), rtol=1e-12)
    hd.check_grad(clashes, *b)


def _pointwise(shape):
    from halide_ad.ir import Func
    vars_ = tuple(Var(f"v{d}") for d in range(len(shape)))
    return Func("out", vars_, shape, Bin(Op.ADD, Load("x", vars_, "float32"), Const(1.0, "float32")), "float32")


def test_lower_pointwise_is_one_serial_loop_per_dimension():
    f = _pointwise((2, 3))
    s = lower.pointwise(f)
    assert [(n.var, n.lo, n.hi, n.kind) for n in loops(s)] == [(f.vars[0], 0, 2, Kind.SERIAL), (f.vars[1], 0, 3, Kind.SERIAL)]
    assert [n for n in walk(s) if isinstance(n, Store)] == [Store("out", f.vars, f.body)]


def test_choose_parallel_marks_the_first_dimension_longer_than_one(monkeypatch):
    monkeypatch.setenv("HALIDE_AD_PARALLEL_MIN_POINTS", "0")
    kinds = [n.kind for n in loops(choose_parallel(lower.pointwise(_pointwise((1, 4, 5)))))]
    assert kinds == [Kind.SERIAL, Kind.PARALLEL, Kind.SERIAL]
    assert choose_parallel(lower.pointwise(_pointwise(()))) == lower.pointwise(_pointwise(()))


def test_choose_parallel_leaves_small_nests_serial_unless_their_terms_add_up(monkeypatch):
    monkeypatch.setenv("HALIDE_AD_PARALLEL_MIN_POINTS", "1000")
    small = lower.pointwise(_pointwise((10, 10)))
    assert all(n.kind is Kind.SERIAL for n in loops(choose_parallel(small)))
    assert [n.kind for n in loops(choose_parallel(small, terms=10))] == [Kind.PARALLEL, Kind.SERIAL]


def _row_sum(n: int, where=None):
    """acc = sum over r < n of x[i, r] (in float32), stored in out[i]."""
    from halide_ad.ir import Func, Range, Reduce
    r = Var("r")
    return Func("out", (i,), (3,), Reduce("sum", Load("x", (i, r), "float32"), (Range(r, 0, n),), where), "float32")


def test_lower_reduction_accumulates_in_reduction_order_then_stores():
    f = _row_sum(20)
    s = lower.reduction(f, lower.accumulator(f.body, "acc"))
    acc = Local("acc", "float32")
    assert [n.var for n in loops(s)] == [i, Var("r")]
    assert [n for n in walk(s) if isinstance(n, Accumulate)] == [Accumulate(acc, f.body.body, "sum")]
    assert Let(acc, Const(0.0, "float32")) in walk(s) and Store("out", (i,), acc) in walk(s)
    long = _row_sum(lower.LONG_SUM)
    assert lower.accumulator(long.body, "acc").dtype == "float64"  # float32 partial sums round too often


def _fold_of(s) -> Let:
    (let,) = [n for n in walk(s) if isinstance(n, Let) and isinstance(n.value, Fold)]
    assert let.var == let.value.lanes  # the lanes, assigned their folded values
    return let


def test_split_accumulators_folds_a_long_contiguous_sum_in_lanes():
    """A term the fold cannot compute (a call, here) goes to a row of terms (float32 terms in
    float32), then the fold."""
    from halide_ad.ir import Call, Func, Range, Reduce
    r = Var("r")
    square = Call("exp", (Load("x", (i, r), "float32"),))
    f = Func("out", (i,), (3,), Reduce("sum", square, (Range(r, 0, 2 * LANES + 3),)), "float32")
    s = split_accumulators(lower.reduction(f, lower.accumulator(f.body, "acc")))
    terms, rest = [n for n in loops(s) if n.var == r]
    assert (terms.lo, terms.hi, terms.step) == (0, 2 * LANES, 1) and (rest.lo, rest.hi) == (2 * LANES, 2 * LANES + 3)
    assert terms.body.body == (Let(Element("acc_terms32", (r,), "float32"), f.body.body),)
    fold = _fold_of(s).value
    assert [v.name for v in fold.lanes.locals] == ["acc"] + [f"acc_lane{q}" for q in range(1, LANES)]
    assert (fold.op, fold.rows, fold.lo, fold.hi, fold.terms) == ("sum", (Local("acc_terms32", "float32"),), 0, 2 * LANES,
                                                            None)
    assert [n.target.name for n in walk(rest) if isinstance(n, Accumulate)] == ["acc"]
    lets = [n for n in walk(s) if isinstance(n, Let) and isinstance(n.var, Local)]
    assert [n.value for n in lets[:-1]] == [lower.identity("sum", "float32")] * LANES  # each at the identity
    assert lets[-1] == Let(Local("acc", "float32"), pairwise(fold.lanes.locals, "sum"))  # then combined


def test_split_accumulators_folds_a_row_of_loads_in_place():
    """x[i, r] summed over r: the fold reads x's row itself, no row of terms."""
    f = _row_sum(2 * LANES + 3)
    s = split_accumulators(lower.reduction(f, lower.accumulator(f.body, "acc")))
    (rest,) = [n for n in loops(s) if n.var == Var("r")]
    assert (rest.lo, rest.hi) == (2 * LANES, 2 * LANES + 3)
    fold = _fold_of(s).value
    (row,) = fold.rows
    assert isinstance(row, Row) and row.first.buffer == "x" and row.first.index[0] == i
    assert (fold.lo, fold.hi) == (0, 2 * LANES) and not any(isinstance(n, Let) and isinstance(n.var, Element) for n in walk(s))
    assert fold.terms is None


def test_split_accumulators_computes_arithmetic_terms_in_the_fold():
    """Terms that are + - * / of rows and of values fixed along the sum are computed by the fold
    from the rows in place: a variance's centred squares, a dot product's x[i, r] * y[i, r + 1]
    (both rows at offset 1: the fold starts there). A sum's factors and signs fixed along it
    leave the terms and multiply the lanes' sum once: a mean's x[i, r] * 0.5 folds x's row, the
    negated dot product the products."""
    from halide_ad.ir import Call, Func, Range, Reduce
    r, half, m = Var("r"), Const(0.5, "float32"), Load("m", (i,), "float32")

    def folded(term):
        f = Func("out", (i,), (3,), Reduce("sum", term, (Range(r, 0, 2 * LANES + 3),)), "float32")
        s = split_accumulators(lower.reduction(f, lower.accumulator(f.body, "acc")))
        assert not any(isinstance(n, Let) and isinstance(n.var, Element) for n in walk(s))
        return _fold_of(s).value, [n.value for n in walk(s) if isinstance(n, Let) and n.var == Local("acc", "float32")]

    def x(buffer="x", at=r):
        return Load(buffer, (i, at), "float32")
    lanes = [Local("acc", "float32")] + [Local(f"acc_lane{q}", "float32") for q in range(1, LANES)]
    mean, sets = folded(Bin(Op.MUL, x(), half))
    assert [row.first.buffer for row in mean.rows] == ["x"] and mean.terms is None
    assert sets[-1] == Combine("prod", pairwise(lanes, "sum"), half)  # the lanes' sum, times 0.5
    centred = Bin(Op.SUB, x(), Call("stop_gradient", (m,)))
    var, sets = folded(Bin(Op.MUL, centred, centred))
    d = Bin(Op.SUB, Term(0, "float32"), Call("stop_gradient", (m,)))
    assert len(var.rows) == 1 and var.terms == Bin(Op.MUL, d, d) and sets[-1] == pairwise(lanes, "sum")
    r1 = Bin(Op.ADD, r, Const(1, INDEX_DTYPE))
    dot, sets = folded(Call("neg", (Bin(Op.MUL, x("x", r1), x("y", r1)),)))
    assert [row.first.buffer for row in dot.rows] == ["x", "y"] and (dot.lo, dot.hi) == (1, 2 * LANES + 1)
    assert dot.terms == Bin(Op.MUL, Term(0, "float32"), Term(1, "float32"))
    assert sets[-1] == Combine("prod", pairwise(lanes, "sum"), Call("neg", (Const(1, "float32"),)))
    # rows at different offsets, or a row of another type than the term's, take the row of terms
    for term in (Bin(Op.MUL, x(), x("y", r1)), Bin(Op.MUL, x(), Const(0.5, "float64"))):
        f = Func("out", (i,), (3,), Reduce("sum", term, (Range(r, 0, 2 * LANES + 3),)), "float32")
        s = split_accumulators(lower.reduction(f, lower.accumulator(f.body, "acc")))
        assert any(isinstance(n, Let) and isinstance(n.var, Element) for n in walk(s))


def test_split_accumulators_keeps_short_masked_and_strided_sums_whole():
    short = _row_sum(2 * LANES - 1)
    masked = _row_sum(4 * LANES, where=Bin(Op.LT, Var("r"), i))
    for f in (short, masked):
        s = lower.reduction(f, lower.accumulator(f.body, "acc"))
        assert split_accumulators(s) == s
    from halide_ad.ir import Func, Range, Reduce
    r = Var("r")  # reads x[r, i]: a column, no cache line for the lanes to share
    column = Func("out", (i,), (3,), Reduce("sum", Load("x", (r, i), "float32"), (Range(r, 0, 64),)), "float32")
    s = lower.reduction(column, lower.accumulator(column.body, "acc"))
    assert split_accumulators(s) == s


def test_lower_extremum_keeps_the_position_of_the_first_extremum():
    from halide_ad.ir import Func, Range, Reduce
    r = Var("r")
    f = Func("out", (i,), (3,), Reduce("argmax", Load("x", (i, r), "float32"), (Range(r, 0, 5),)), "int64")
    s = lower.extremum_func(f, None, r)
    arg = Local("arg", "int64")
    assert [n.var for n in loops(s)] == [i, r]
    assert Store("out", (i,), arg) in walk(s) and Let(arg, r) in walk(s)
    assert Let(Local("acc", "float32"), Const(-np.inf, "float32")) in walk(s)
    kept = Func("m", (i,), (3,), Reduce("min", Load("x", (i, r), "int32"), (Range(r, 0, 5),)), "int32")
    s = lower.extremum_func(kept, "m_argindex", r)
    assert [n for n in walk(s) if isinstance(n, Store)] == [Store("m", (i,), Local("acc", "int32")),
                                                            Store("m_argindex", (i,), arg)]
    assert Let(Local("acc", "int32"), Const(np.iinfo(np.int32).max, "int32")) in walk(s)


def test_lower_scatter_runs_the_solvers_parallel_variable_outermost():
    from halide_ad.ir import Range, Scatter
    from halide_ad.solver import Fallback
    k = Var("k")
    index = (Bin(Op.MOD, j, Const(4, "int64")), k)
    s = Scatter("x", index, Load("adj_y", (j, k), "float64"), (Range(j, 0, 9), Range(k, 0, 5)),
                Bin(Op.LT, k, Const(4, "int64")))
    nest_ = lower.scatter(Fallback(s, "not injective in j", k), "adj_x", "float64")
    assert [(n.var, n.kind) for n in loops(nest_)] == [(k, Kind.PARALLEL), (j, Kind.SERIAL)]
    guard = [n for n in walk(nest_) if isinstance(n, If)]
    assert len(guard) == 1 and guard[0].then.body == (Accumulate(Load("adj_x", index, "float64"), s.value, augmented=True),)
    serial = lower.scatter(Fallback(s, "z3 timed out", None), "adj_x", "float64")
    assert all(n.kind is Kind.SERIAL for n in loops(serial))


def _column_mean(rows: int, dtype: str = "float32"):
    """out[j] = the sum over r of x[r, j]: every read walks memory with j."""
    from halide_ad.ir import Func, Range, Reduce
    r = Var("r")
    return Func("out", (j,), (16,), Reduce("sum", Load("x", (r, j), dtype), (Range(r, 0, rows),)), dtype)


def _rows(f, names=None):
    names = names if names is not None else []
    nest_ = choose_parallel(lower.reduction(f, lower.accumulator(f.body, "acc")), lower.terms(f.body))
    return interchange_rows(nest_, f.dtype, lambda base: names.append(base) or f"{base}{len(names)}")


def test_interchange_rows_puts_the_row_loop_inside_the_reduction():
    f = _column_mean(10)
    s = _rows(f)
    assert [n.var for n in loops(s)] == [j, Var("r"), j]  # the first j: each element starts at 0
    (add,) = [n for n in walk(s) if isinstance(n, Accumulate)]
    assert add.target == Load("out", (j,), "float32")  # in place: the accumulator is float32 too
    assert not any(isinstance(n, (Let, Allocate)) for n in walk(s))


def test_interchange_rows_accumulates_a_long_float32_sum_in_a_float64_row():
    names = []
    s = _rows(_column_mean(lower.LONG_SUM), names)
    assert names == ["row"]
    (allocate,) = [n for n in walk(s) if isinstance(n, Allocate)]
    assert allocate == Allocate("row1", (16,), "float64")
    (add,) = [n for n in walk(s) if isinstance(n, Accumulate)]
    assert add.target == Element("row1", (j,), "float64")
    assert Store("out", (j,), Element("row1", (j,), "float64")) in walk(s)


def test_interchange_rows_leaves_row_sums_and_parallel_rows_alone(monkeypatch):
    f = _row_sum(20)  # reads x[i, r]: the reduction walks the row already
    s = choose_parallel(lower.reduction(f, lower.accumulator(f.body, "acc")))
    assert interchange_rows(s, f.dtype, lambda base: base) == s
    monkeypatch.setenv("HALIDE_AD_PARALLEL_MIN_POINTS", "0")
    g = _column_mean(10)  # j is the only dimension: it runs in parallel, so it stays outside
    s = choose_parallel(lower.reduction(g, lower.accumulator(g.body, "acc")), lower.terms(g.body))
    assert loops(s)[0].kind is Kind.PARALLEL and interchange_rows(s, g.dtype, lambda base: base) == s


def _window(lo: int, hi: int, guards=((), ()), single=None):
    """acc += y[j, r] over lo <= r < hi: one piece of a gather."""
    from halide_ad.ir import Range
    from halide_ad.solver import GatherPiece
    r = Var("r")
    return GatherPiece((Range(r, Const(lo, "int64"), Const(hi, "int64")),), guards,
                       Load("y", (j, r), "float64"), (), single or ())


def test_lower_gather_piece_puts_each_level_of_guards_inside_its_loop():
    outer, inner = Bin(Op.GE, j, Const(1, "int64")), Bin(Op.LT, Var("r"), j)
    s = lower.gather_piece(_window(0, 4, ((outer,), (inner,))), Local("acc", "float64"))
    assert isinstance(s, If) and s.cond == (outer,)
    (loop,) = loops(s)
    assert loop.kind is Kind.SERIAL and isinstance(loop.body.body[0], If) and loop.body.body[0].cond == (inner,)
    once = lower.gather_piece(_window(0, 4, single=(True,)), Local("acc", "float64"))
    assert once.kind is Kind.AT_MOST_ONCE


def test_split_accumulators_runs_a_long_window_in_lanes_added_to_acc():
    acc = Local("acc", "float64")
    s = split_accumulators(block(lower.gather_piece(_window(1, 2 * LANES + 2), acc)))
    (rest,) = loops(s)
    assert (rest.lo, rest.hi) == (2 * LANES + 1, 2 * LANES + 2)
    fold = _fold_of(s).value  # y[j, r] for r from 1: y's row j, from element 1
    assert [v.name for v in fold.lanes.locals] == [f"acc_lane{q}" for q in range(LANES)]
    assert isinstance(fold.rows[0], Row) and (fold.lo, fold.hi) == (1, 2 * LANES + 1)
    lanes = [Local(f"acc_lane{q}", "float64") for q in range(LANES)]
    combined = next(n for n in walk(s) if isinstance(n, Accumulate) and n.target == acc)  # after the rounds
    assert combined.augmented and combined.value == pairwise(lanes, "sum")
    assert combined.value.lhs.lhs == Combine("sum", lanes[0], lanes[1])  # a fixed tree: ((0 + 1) + (2 + 3)) + ...
    guarded = block(lower.gather_piece(_window(0, 4 * LANES, ((), (Bin(Op.LT, Var("r"), j),))), acc))
    assert split_accumulators(guarded) == guarded  # a guard inside the window keeps one total
    once = block(lower.gather_piece(_window(0, 4 * LANES, single=(True,)), acc))
    assert split_accumulators(once) == once


@hd.func
def _stages_named_like_locals(x):
    """Funcs named like the loads a gradient's boundary regions hoist (h0) and like a float32
    literal (f32_0): the hoisted `h0 = h0[1]` overwrote the buffer."""
    c = hd.repeat_edge(x)
    h = hd.compute(x.shape, lambda t: c[t - 1] * 0.25 + c[t] * 0.5 + c[t + 1] * 0.25, name="h0")
    e = hd.repeat_edge(h)
    return hd.compute(x.shape, lambda t: e[t - 1] * e[t] + e[t + 1] * e[t + 1], name="f32_0")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_funcs_named_like_generated_locals(dtype):
    x = np.linspace(-1, 1, 37).astype(dtype)
    xp = np.pad(x.astype(np.float64), 1, mode="edge")
    h = 0.25 * xp[:-2] + 0.5 * xp[1:-1] + 0.25 * xp[2:]
    hp = np.pad(h, 1, mode="edge")
    np.testing.assert_allclose(_stages_named_like_locals(x), hp[:-2] * hp[1:-1] + hp[2:] ** 2,
                               rtol=1e-5 if dtype == np.float32 else 1e-12)
    if dtype == np.float64:
        hd.check_grad(_stages_named_like_locals, x)



def test_an_index_variable_is_made_unsigned_once_after_each_assignment():
    lines = ["for i in range(0, n):", "    x[nonneg(i), nonneg(k)] = y[nonneg(i)] + y[nonneg((i + 1))]", "    t = 2",
             "    x[nonneg(t)] = 0", "    a, b = 1, 2", "    x[nonneg(a)] = 0"]
    assert emit._bind_indices(["k", "n"], lines) == [
        "k_nn = nonneg(k)", "for i in range(0, n):", "    i_nn = nonneg(i)",
        "    x[i_nn, k_nn] = y[i_nn] + y[nonneg((i + 1))]", "    t = 2", "    t_nn = nonneg(t)", "    x[t_nn] = 0",
        "    a, b = 1, 2", "    x[nonneg(a)] = 0"]  # (a tuple's names keep their calls)


@hd.func
def _indices_named_like_their_bindings(x):
    return hd.compute((4, 5), lambda i, i_nn: x[i, i_nn] * 2.0 + x[3 - i, i_nn])


def test_an_index_named_like_another_ones_binding():
    x = np.arange(20.0).reshape(4, 5)
    np.testing.assert_array_equal(_indices_named_like_their_bindings(x), x * 2 + x[::-1])


@hd.func
def _edge_and_clamped_window(x):
    r = hd.rdom(3)
    return hd.compute(x.shape, lambda j: hd.where(j == 0, x[0], 0.0) + hd.sum(x[hd.clamp(j + r - 1, 0, 6)] * r))


def test_a_load_in_a_reduction_of_a_boundary_region_is_not_hoisted_out_of_it():
    """The region j = 0 hoists its loads; the window's load reads a clamped, so in-range, index
    of the reduction's variable, which is not defined outside the reduction's loop."""
    x = np.arange(7.0) ** 2
    xp = np.pad(x, 1, mode="edge")
    np.testing.assert_allclose(_edge_and_clamped_window(x),
                               np.where(np.arange(7) == 0, x[0], 0) + xp[1:-1] + 2 * xp[2:], rtol=1e-14)

def _long_row_sums(x):
    return hd.compute((x.shape[0],), lambda t: hd.sum(x[t, hd.rdom(x.shape[1])]), name="row_sums")


def test_a_skipped_pass_leaves_the_nest_as_it_was_and_a_dumped_one_is_printed(monkeypatch, capsys, rng):
    """HALIDE_AD_SKIP turns split_accumulators off: one running total, the same sums. The dump
    prints whatever the disk cache holds."""
    x = rng.standard_normal((3, 4 * LANES + 3))
    laned = hd.explain(hd.func(_long_row_sums), x).forward_source
    assert "acc_lane1" in laned
    monkeypatch.setenv("HALIDE_AD_SKIP", "split_accumulators")
    monkeypatch.setenv("HALIDE_AD_DUMP", "split_accumulators")
    f = hd.func(_long_row_sums)
    assert "acc_lane1" not in hd.explain(f, x).forward_source
    assert "# after split_accumulators (skipped)" in capsys.readouterr().out
    np.testing.assert_allclose(f(x), x.sum(1), rtol=1e-12)
    # the disk cache holds this kernel now (and did already in a second run): a dump emits it afresh
    assert "acc_lane1" not in hd.explain(hd.func(_long_row_sums), x).forward_source
    assert "# after split_accumulators (skipped)" in capsys.readouterr().out


def test_show_writes_a_nest_with_its_loop_kinds():
    f = _row_sum(20)
    text = loops_show(choose_parallel(lower.reduction(f, lower.accumulator(f.body, "acc")), 1 << 20))
    assert text.splitlines()[0] == "for i in [0, 3):  # parallel"
    assert "acc sum= x[i, r]" in text and "out[i] = acc" in text
