"""A gather loop nest built whole as loop-nest data (runtime/gathers.py `split_loop_nest`), the
hoisting pass over an iteration's statements (runtime/schedule/hoist.py), the separable window's
pass (runtime/schedule/separable.py), the box and its regions' (schedule/regions.py), the edge
columns' (schedule/columns.py) and the phases' (schedule/strided.py), tested on the nodes."""
from __future__ import annotations

import numpy as np
import pytest

import halide_ad as hd
from halide_ad.ir import INDEX_DTYPE, Bin, Const, Func, Load, Op, Select, Var
from halide_ad.runtime import emit, schedule
from halide_ad.runtime.emit import Emitter
from halide_ad.runtime.gathers import expand_points, split_loop_nest
from halide_ad.runtime.loops import (Allocate, Block, Chain, Comment, Element, For, Hoisted, If, IfElse, Kind, Let, Local,
                                     Point, Row, Source, Spans, Store, block, loops, walk, weighted_sums)
from halide_ad.runtime.schedule import Separable, Split
from halide_ad.runtime.schedule.boundary import box_ranges
from halide_ad.runtime.schedule.columns import edge_columns
from halide_ad.runtime.schedule.regions import split_box
from halide_ad.runtime.schedule.hoist import hoist, reading, substituted
from halide_ad.runtime.schedule.phases import as_gather, pointwise_split
from halide_ad.runtime.schedule.separable import separable
from halide_ad.runtime.schedule.spans import outside_box
from halide_ad.runtime.schedule.strided import phases
from halide_ad.traverse import walk as walk_expr

i, j, n = Var("i"), Var("j"), Var("n")


def _plus(e, k: int):
    return Bin(Op.ADD, e, Const(k, INDEX_DTYPE))


def _x(*index):
    return Load("x", tuple(index), "float32")


def _store_sum(f: Func):
    """The `body` a pointwise split runs: f[at] = the sum of the gathers' pieces."""
    def body(gs, at=None, terms=(), terms_dtype=None):
        values = [p.value for g in gs for p in g.pieces]
        index = tuple((at or {}).get(v, v) for v in f.vars)
        total = values[0] if values else Const(0.0, f.dtype)
        for v in values[1:]:
            total = Bin(Op.ADD, total, v)
        return Store(f.name, index, total)
    return body


def _exprs(s):
    match s:
        case Store(_, index, value):
            return [*index, value]
        case Let(var, value):
            return [var, value]
    return []


def test_hoist_reads_each_load_once_and_the_shared_index_once():
    shared = _plus(j, 1)
    loads = [_x(i, shared), _x(shared, i)]
    lets, env = hoist([shared, _plus(shared, 2)], loads)
    ix, ix1, h0, h1 = (let.var for let in lets)
    assert [let.var.name for let in lets] == ["ix0", "ix1", "h0", "h1"] and lets[0].value == shared
    assert lets[1].value == _plus(ix, 2)  # an index reads the one before it
    assert lets[2].value == _x(i, ix) and lets[3].value == _x(ix, i)  # the loads read the shared index
    body = Store("out", (i, shared), Bin(Op.MUL, _x(i, shared), _x(shared, i)))
    out = reading(body, env)
    assert out == Store("out", (i, ix), Bin(Op.MUL, h0, h1))  # whole loads first, then indices
    assert reading(body, {}) is body
    # a lane fold's row keeps its first load, its indices read
    assert substituted(Row(_x(i, shared)), env) == Row(_x(i, ix))


def test_a_split_nest_is_one_tree_its_box_unguarded_its_regions_hoisted(monkeypatch):
    monkeypatch.setenv("HALIDE_AD_PARALLEL_MIN_POINTS", "0")
    # x[i, j] + (x[i, j - 1] where j >= 1): a box over j in 1..14 and the edge at j = 0
    left = Select(Bin(Op.GE, _plus(j, -1), Const(0, INDEX_DTYPE)), _x(i, _plus(j, -1)), Const(0.0, "float32"))
    f = Func("d", (i, j), (4, 16), Bin(Op.ADD, _x(i, j), left), "float32")
    split = pointwise_split(f)
    em = Emitter({"x": (4, 16), "d": (4, 16)})
    nest = split_loop_nest(em, f.vars, f.shape, split, _store_sum(f), [as_gather(f)], f.name)
    assert not any(isinstance(s, (If, Source)) for s in walk(nest))  # every test decided
    assert not any(isinstance(e, Select) for s in walk(nest) for x in _exprs(s) for e in walk_expr(x))
    stores = [s for s in walk(nest) if isinstance(s, Store)]
    assert len(stores) == len(split.outside) + 1  # one per region, one for the box
    (outer,) = [s for s in nest.body if isinstance(s, For)] if isinstance(nest, Block) else [nest]
    assert outer.var == "i" and outer.kind is Kind.PARALLEL
    # a region's loads are read once at the top of its iteration, the store reads the locals
    lets = [s for s in walk(nest) if isinstance(s, Let) and isinstance(s.var, Local)]
    assert lets and all(s.var.name.startswith(("h", "ix")) for s in lets)
    source = emit.function(em, "run", block(nest))
    x = np.arange(64, dtype=np.float32).reshape(4, 16)
    out = np.zeros((4, 16), np.float32)
    namespace = {"np": np, "kernel": lambda fn: fn, "nonneg": lambda k: k,
                 "parallel_for": lambda fn, lo, hi, *args, iteration: fn(lo, hi, *args)}
    exec(source, namespace)
    namespace["run"](*[{"x": x, "d": out}[b] for b in em.used], np.zeros(3, np.int64))
    expected = x.copy()
    expected[:, 1:] += x[:, :-1]
    np.testing.assert_array_equal(out, expected)


def test_a_phased_nest_hoists_the_loads_its_phases_share(monkeypatch):
    monkeypatch.setenv("HALIDE_AD_PARALLEL_MIN_POINTS", "0")
    # up[i, j] = x[i, j // 2] + x[i, (j + 1) // 2]: phases j = 2q + p
    half = Bin(Op.FLOORDIV, j, Const(2, INDEX_DTYPE))
    up = Func("up", (i, j), (4, 16), Bin(Op.ADD, Load("x", (i, half), "float32"),
                                         Load("x", (i, Bin(Op.FLOORDIV, _plus(j, 1), Const(2, INDEX_DTYPE))),
                                              "float32")), "float32")
    split = pointwise_split(up)
    em = Emitter({"x": (4, 9), "up": (4, 16)})
    nest = split_loop_nest(em, up.vars, up.shape, split, _store_sum(up), [as_gather(up)], up.name)
    (phase_loop,) = [loop for loop in loops(nest) if loop.var == em.name(split.phase_vars[0])]
    hoisted = [s for s in phase_loop.body.body if isinstance(s, Let)]
    assert hoisted and all(s.var.name.startswith(("h", "ix")) for s in hoisted)
    stores = [s for s in walk(phase_loop) if isinstance(s, Store)]
    assert len(stores) == 2  # one per phase, each reading only the hoisted locals
    assert all(isinstance(s.value.lhs, Hoisted) and isinstance(s.value.rhs, Hoisted) for s in stores)


def test_hoist_loads_is_a_pass_that_a_skip_leaves_out_and_a_dump_prints(monkeypatch, capsys):
    monkeypatch.setenv("HALIDE_AD_PARALLEL_MIN_POINTS", "0")
    left = Select(Bin(Op.GE, _plus(j, -1), Const(0, INDEX_DTYPE)), _x(i, _plus(j, -1)), Const(0.0, "float32"))
    f = Func("d", (i, j), (4, 16), Bin(Op.ADD, _x(i, j), left), "float32")
    split = pointwise_split(f)

    def built():
        em = Emitter({"x": (4, 16), "d": (4, 16)})
        return split_loop_nest(em, f.vars, f.shape, split, _store_sum(f), [as_gather(f)], f.name)

    monkeypatch.setenv("HALIDE_AD_DUMP", "hoist_loads")
    hoisted = built()
    assert "# after hoist_loads\n" in capsys.readouterr().out
    monkeypatch.setenv("HALIDE_AD_SKIP", "hoist_loads")
    plain = built()
    assert "# after hoist_loads (skipped)" in capsys.readouterr().out
    assert any(isinstance(s, Let) and isinstance(s.var, Local) for s in walk(hoisted))
    assert not any(isinstance(s, Let) and isinstance(s.var, Local) for s in walk(plain))
    assert reading(plain, {}) == plain and len(loops(plain)) == len(loops(hoisted))


def _blur(img):
    c = hd.repeat_edge(img)
    r, s = hd.rdom(3, 3)
    return hd.compute(img.shape, lambda y, x: hd.sum(c[y + r - 1, x + s - 1]) * 0.25, name="blur")


def _blur5(img):
    """A 5x5 box: 25 terms a point, 10 as a separable window's two passes."""
    c = hd.repeat_edge(img)
    r, s = hd.rdom(5, 5)
    return hd.compute(img.shape, lambda y, x: hd.sum(c[y + r - 2, x + s - 2]) * 0.04, name="blur5")


@pytest.mark.parametrize("skip, gone, fn", [("tabled_points", "for point in range", _blur),
                                             ("interior,hoist_loads", "h0 = ", _blur),
                                             ("split_box", "h0 = ", _blur),
                                             ("separable", "# separable window", _blur5)])
def test_a_skipped_split_decision_leaves_its_code_out_and_the_gradient_the_same(monkeypatch, skip, gone, fn):
    img = np.arange(6 * 7, dtype=np.float64).reshape(6, 7) % 5
    ct = np.cos(np.arange(6 * 7, dtype=np.float64)).reshape(6, 7)
    assert gone in hd.explain(hd.func(fn), img).backward_source
    expected = hd.vjp(hd.func(fn), img)[1](ct)
    monkeypatch.setenv("HALIDE_AD_SKIP", skip)
    assert gone not in hd.explain(hd.func(fn), img).backward_source
    np.testing.assert_allclose(hd.vjp(hd.func(fn), img)[1](ct), expected, rtol=1e-12)


def test_an_index_that_reads_a_hoisted_load_is_still_checked_at_run_time():
    """A data-dependent index reads data whether the load it reads is hoisted or not: the kernel
    checks it as it would the load."""
    idx = Load("idx", (i,), "int64")
    lets, env = hoist([], [idx])
    store = reading(Store("out", (i,), Load("x", (idx,), "float32")), env)
    assert store.value.index == (lets[0].var,)  # the load reads the local
    source = "\n".join(emit.render(block(*lets, store), Emitter({"idx": (4,), "x": (5,), "out": (4,)})))
    assert "x[nonneg(checked(h0, 5, status, 0))]" in source


def test_outside_box_runs_the_loop_over_the_boxs_last_dimension_around_it():
    body = block(Store("d", (i, j), _x(i, j)))
    plain = For("i", 0, 4, Kind.PARALLEL, block(For("j", 0, 16, Kind.SERIAL, body)))
    out = outside_box(plain, "j", (2, 13), (("i", 1, 2),))
    assert out == For("i", 0, 4, Kind.PARALLEL, block(Spans("j", (2, 14), 16, (("i", 1, 2),), body)))
    assert outside_box(plain, "k", (2, 13), ()) == plain  # no loop over it: nothing to do
    # the plain nest around a Point of the general gathers: each point built inside the spans
    points = For("i", 0, 4, Kind.PARALLEL, block(For("j", 0, 16, Kind.SERIAL, block(Point(("the gathers",))))))
    assert expand_points(outside_box(points, "j", (2, 13), (("i", 1, 2),)), lambda p: body) == out


def _every_other(img):
    """img[:, ::2]: its gradient's box (columns 1..2 of 4) decides the bound, not the parity, so
    the general gathers run on the spans around it."""
    return hd.compute((img.shape[0], 2), lambda y, k: img[y, 2 * k] * 0.5, name="every_other")


def test_a_box_without_regions_runs_its_edges_as_spans_and_skipped_the_same(monkeypatch):
    img = np.arange(3 * 4, dtype=np.float64).reshape(3, 4) % 7
    ct = np.cos(np.arange(3 * 2, dtype=np.float64)).reshape(3, 2)
    assert "for span in spans:" in hd.explain(hd.func(_every_other), img).backward_source
    expected = np.zeros_like(img)
    expected[:, ::2] = 0.5 * ct
    (grad,) = hd.vjp(hd.func(_every_other), img)[1](ct)
    np.testing.assert_allclose(grad, expected, rtol=1e-12)
    monkeypatch.setenv("HALIDE_AD_SKIP", "outside_box")
    assert "for span in spans:" not in hd.explain(hd.func(_every_other), img).backward_source
    (grad,) = hd.vjp(hd.func(_every_other), img)[1](ct)
    np.testing.assert_allclose(grad, expected, rtol=1e-12)


def _window_box(lo: int, hi: int):
    """A box over rows and columns lo..hi-1 whose points run the box's gathers, and the 3x3
    window [1 2 1]/4 x [1 2 1]/4 over x that those gathers are."""
    three = ((-1, 0.25), (0, 0.5), (1, 0.25))
    box = For(i, lo, hi, Kind.SERIAL, block(For(j, lo, hi, Kind.SERIAL, block(Point(("the box's gathers",))))))
    return box, Separable(Load("x", (i, j), "float64"), 1, 1, rows=three, cols=three)


def test_the_separable_pass_runs_a_box_as_two_passes_over_a_ring_of_rows():
    box, sep = _window_box(1, 7)
    out = separable(box, sep, "window")
    comment, allocate, rows = out.body
    assert allocate == Allocate("window", (4, 6), "float64")  # rows -1..1: a ring of 4
    assert rows.var == i and (rows.lo, rows.hi) == (1, 7)
    filtered, summed = rows.body.body
    assert isinstance(filtered.lo, IfElse)  # the first output row filters all three of its rows
    assert filtered.body.body[0].var == j and isinstance(filtered.body.body[0].body.body[0], Let)
    (point,) = summed.body.body
    assert point.gathers == () and point.terms_dtype == "float64" and [w for _, w in point.terms] == [0.25, 0.5, 0.25]
    assert all(isinstance(e, Element) and e.array == "window" for e, _ in point.terms)
    # its points, built, add the same terms as the window: run it
    def build(point):
        return Store("d", (i, j), Chain(Op.ADD, tuple(weighted_sums(list(point.terms), "float64"))))
    em = Emitter({"x": (8, 8), "d": (8, 8)})
    source = emit.function(em, "run", block(expand_points(out, build)))
    assert "for row in range(0 if i == 1 else (i + 1), (i + 2)):" in source
    x = np.cos(np.arange(64.0)).reshape(8, 8)
    d = np.zeros((8, 8))
    namespace = {"np": np, "kernel": lambda fn: fn, "nonneg": lambda k: k}
    exec(source, namespace)
    namespace["run"](*[{"x": x, "d": d}[b] for b in em.used], np.zeros(3, np.int64))
    w = np.array([0.25, 0.5, 0.25])
    expected = sum(w[a] * w[b] * x[a:a + 6, b:b + 6] for a in range(3) for b in range(3))
    np.testing.assert_allclose(d[1:7, 1:7], expected, rtol=1e-14)


def test_the_separable_pass_leaves_other_nests_alone_and_a_skip_leaves_it_out(monkeypatch, capsys):
    box, sep = _window_box(1, 7)
    inner = box.body.body[0]
    assert separable(inner, sep, "window") == inner  # one loop around the point: no window
    assert separable(For(n, 0, 2, Kind.SERIAL, block(box)), sep, "window").body.body[1].array == "window"
    monkeypatch.setenv("HALIDE_AD_DUMP", "separable")
    monkeypatch.setenv("HALIDE_AD_SKIP", "separable")
    assert schedule.run(separable, box, sep, "window") == box
    assert "# after separable (skipped)\nfor i in [1, 7):" in capsys.readouterr().out


def _column_box():
    """A box over i in 1..3, j in 2..7 of a 5 x 10 nest (its plain loops around a Point), and
    its regions: the row i = 0 and the columns j = 0..1 and j = 8..9 beside it (i in 1..3)."""
    box = For("i", 1, 4, Kind.PARALLEL, block(For("j", 2, 8, Kind.SERIAL, block(Point(("inside",))))))
    row = block(Let(i, Const(0, INDEX_DTYPE)), For("j", 0, 10, Kind.SERIAL, block(Point(("row",), region=(
        (i, (0, 0)), (j, (0, 9)))))))
    low, high = (For("i", 1, 4, Kind.PARALLEL, block(For("j", lo, hi + 1, Kind.PARALLEL, block(Point(
        (name,), region=((i, (1, 3)), (j, (lo, hi)))))))) for name, lo, hi in (("low", 0, 1), ("high", 8, 9)))
    return box, Block((row, low, high))


def test_edge_columns_run_the_columns_inside_the_boxs_row_loop_serially(monkeypatch, capsys):
    box, regions = _column_box()
    cut = ((i, (1, 3)), (j, (2, 7)))
    kept, moved = edge_columns(Block((regions, box)), cut, 1).body
    assert kept == Block((regions.body[0],))  # the row is not beside the box in j only
    low, inner, high = moved.body.body[0].body
    assert inner == box.body.body[0]
    assert [s.body.body[0].gathers for s in (low, high)] == [("low",), ("high",)]
    assert low.var == "j" and (low.lo, low.hi, low.kind, high.kind) == (0, 2, Kind.SERIAL, Kind.SERIAL)
    # a box cut in j only: the columns beside it at the top
    alone = edge_columns(Block((Block((low, high)), inner)), ((j, (2, 7)),), 0)
    assert alone == Block((Block(()), Block((low, inner, high))))
    # no columns: nothing moves; skipped, they stay regions of their own
    assert edge_columns(Block((Block(regions.body[:1]), box)), cut, 1) == Block((Block(regions.body[:1]), box))
    monkeypatch.setenv("HALIDE_AD_SKIP", "edge_columns")
    monkeypatch.setenv("HALIDE_AD_DUMP", "edge_columns")
    assert schedule.run(edge_columns, Block((regions, box)), cut, 1) == Block((regions, box))
    assert "# after edge_columns (skipped)" in capsys.readouterr().out


def _x_at(*index):
    return _x(*(Const(k, INDEX_DTYPE) if isinstance(k, int) else k for k in index))


def test_phases_run_each_phase_at_its_index_reading_the_loads_the_phases_share():
    """Both dimensions of an 8 x 8 box phased (i = 2*qi + pi, j = 2*qj + pj), the columns j = 0..1
    beside it: each phase's Point stores at (2*qi + pi, 2*qj + pj), its gathers that phase's, its
    loads those hoisted at the top of qj's iteration; the columns read i as i_<pi>."""
    qi, qj = Var("qi"), Var("qj")

    def gather(*loads):
        return as_gather(Func("d", (qi, qj), (4, 4), Bin(Op.ADD, *loads), "float32"))

    shared = _x_at(qi, qj)
    split = Split(box={i: (0, 7), j: (2, 7)}, inside=[gather(_x(i, j), _x(i, j))], phased=(i, j), strides=(2, 2),
                  phase_vars=(qi, qj), phases={(pi, pj): [gather(shared, _x_at(qi, _plus(qj, pj + pi)))]
                                               for pi in (0, 1) for pj in (0, 1)})
    column = For("j", 0, 2, Kind.SERIAL, block(Point(("column",), region=((i, (0, 7)), (j, (0, 1))))))
    box = For("i", 0, 8, Kind.SERIAL, Block((column, For("j", 2, 8, Kind.SERIAL, block(Point(tuple(split.inside)))))))
    names = {i: "i", j: "j", qi: "qi", qj: "qj"}
    out = phases(box, split, names, box_ranges((i, j), (8, 8), split), {"x": (8, 8), "d": (8, 8)}, "d")
    assert (out.var, out.lo, out.hi) == ("qi", 0, 4)
    comments = [s.text for s in out.body.body if isinstance(s, Comment)]
    assert comments == ["phase 0 of 2: i = 2 * qi + 0", "phase 1 of 2: i = 2 * qi + 1"]
    for pi in (0, 1):
        alias, col, row = out.body.body[4 * pi + 1:4 * pi + 4]
        assert alias == Let(Var(f"i_{pi}"), Bin(Op.ADD, Bin(Op.MUL, Const(2, INDEX_DTYPE), qi), Const(pi, INDEX_DTYPE)))
        assert col.body.body[0].reads == ((i, Var(f"i_{pi}")),)
        assert (row.var, row.lo, row.hi) == ("qj", 1, 4)
        hoisted = [s for s in row.body.body if isinstance(s, Let)]
        points = [s for s in row.body.body if isinstance(s, Point)]
        (local,) = [s.var for s in hoisted if s.value == shared]
        assert len(points) == 2 and dict(points[0].reads)[shared] == local  # and every phase reads it
        for pj, point in enumerate(points):
            assert point.gathers == tuple(split.phases[(pi, pj)])
            assert dict(point.at)[j] == Bin(Op.ADD, Bin(Op.MUL, Const(2, INDEX_DTYPE), qj), Const(pj, INDEX_DTYPE))
            assert dict(point.at)[i] == alias.value and point.reads == points[0].reads


def test_phases_hoist_no_load_that_a_loop_inside_them_changes():
    """j phased (j = 2*q + p) outside a loop over k: the iteration of q reads x[i, q] once, at its
    top, but not x[q, k], which changes with k inside it."""
    k, q = Var("k"), Var("q")
    at_k = as_gather(Func("d", (i, q, k), (8, 4, 4), Bin(Op.ADD, _x(i, q), _x(q, k)), "float32"))
    split = Split(box={i: (0, 7), j: (0, 7)}, inside=[at_k], phased=(j,), strides=(2,), phase_vars=(q,),
                  phases={(0,): [at_k], (1,): [at_k]})
    box = For("i", 0, 8, Kind.SERIAL, block(For("j", 0, 8, Kind.SERIAL, block(
        For("k", 0, 4, Kind.SERIAL, block(Point(tuple(split.inside))))))))
    ranges = box_ranges((i, j, k), (8, 8, 4), split)
    out = phases(box, split, {i: "i", j: "j", k: "k", q: "q"}, ranges, {"x": (8, 8), "d": (8, 8, 4)}, "d")
    (q_loop,) = out.body.body
    hoisted = [s.value for s in q_loop.body.body if isinstance(s, Let)]
    assert hoisted == [_x(i, q)]
    local = Hoisted("h0", "float32", _x(i, q))
    assert [p.reads for p in walk(q_loop) if isinstance(p, Point)] == [((_x(i, q), local),)] * 2


def _avgpool3s2(img):
    r, s = hd.rdom(3, 3)
    return hd.compute(((img.shape[0] - 3) // 2 + 1, (img.shape[1] - 3) // 2 + 1),
                      lambda y, x: hd.sum(img[2 * y + r, 2 * x + s]) / 9, name="pool")


def test_a_skipped_phases_pass_runs_the_box_at_every_index_and_the_gradient_the_same(monkeypatch):
    img = np.arange(9 * 13, dtype=np.float64).reshape(9, 13) % 11
    ct = np.cos(np.arange(4 * 6, dtype=np.float64)).reshape(4, 6)
    assert "# phase 1 of 2" in hd.explain(hd.func(_avgpool3s2), img).backward_source
    expected = hd.vjp(hd.func(_avgpool3s2), img)[1](ct)
    monkeypatch.setenv("HALIDE_AD_SKIP", "phases")
    assert "# phase" not in hd.explain(hd.func(_avgpool3s2), img).backward_source
    np.testing.assert_allclose(hd.vjp(hd.func(_avgpool3s2), img)[1](ct), expected, rtol=1e-12)


def test_split_box_splits_the_plain_nest_into_its_regions_and_its_box(monkeypatch):
    monkeypatch.setenv("HALIDE_AD_PARALLEL_MIN_POINTS", "8")
    plain = For("i", 0, 5, Kind.PARALLEL, block(For("j", 0, 10, Kind.SERIAL, block(Point(("general",))))))
    split = Split(box={i: (1, 3), j: (2, 7)}, inside=["inside"], outside=(
        ({i: (0, 0), j: (0, 9)}, ["row"]), ({i: (1, 3), j: (0, 1)}, ["low"]), ({i: (1, 4), j: (8, 9)}, ["high"])))
    regions, box = split_box(plain, split, (i, j), (5, 10)).body
    assert box == For("i", 1, 4, Kind.PARALLEL, block(For("j", 2, 8, Kind.SERIAL, block(Point(("inside",))))))
    row, low, high = regions.body
    assert row == block(Let(i, Const(0, INDEX_DTYPE)), For("j", 0, 10, Kind.SERIAL, block(Point(
        ("row",), region=((i, (0, 0)), (j, (0, 9)))))))
    assert low.kind is Kind.SERIAL and high.kind is Kind.PARALLEL  # 6 points, thin; 8 run in parallel
    assert (high.lo, high.hi, high.body.body[0].lo, high.body.body[0].hi) == (1, 5, 8, 10)
    assert high.body.body[0].body.body[0].gathers == ("high",)
