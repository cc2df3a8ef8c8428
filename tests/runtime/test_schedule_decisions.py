"""The schedule decisions that the gather loop nests follow (runtime/schedule/), on IR data: which
loads an iteration hoists, which corners run from tables, when an adjoint runs a row at a time or
in column blocks, when a separable window runs as two passes, how a long sum splits into parts,
when a pointwise definition runs in phases or around a box."""
from __future__ import annotations

from halide_ad.ir import INDEX_DTYPE, Bin, Const, Func, Load, Op, Range, Reduce, Select, Var
from halide_ad.runtime.loops import Block, Kind, Let, Local, Point, Table, block, nest as loop_nest
from halide_ad.runtime.schedule import Separable, Split
from halide_ad.runtime.schedule.corners import constant_taps, points_to_table, tabled_points
from halide_ad.runtime.schedule.hoist import loads_to_hoist
from halide_ad.runtime.schedule.boundary import box_ranges
from halide_ad.runtime.schedule.parallel import region_parallel
from halide_ad.runtime.schedule.phases import pointwise_split
from halide_ad.runtime.schedule.rfactor import MAX_PARTS, split_reduction
from halide_ad.runtime.schedule.rows import COLUMN_BLOCK, COLUMN_BLOCKS, column_blocks, gathers_by_rows, taps_by_rows
from halide_ad.runtime.schedule.separable import MAX_SEPARABLE_TEMP, ring_rows, separable_window
from halide_ad.solver import Gather, GatherPiece
from halide_ad.traverse import walk

i, j, n, r = Var("i"), Var("j"), Var("n"), Var("r")


def _plus(e, k: int):
    return Bin(Op.ADD, e, Const(k, INDEX_DTYPE))


def _times(*xs):
    out = xs[0]
    for x in xs[1:]:
        out = Bin(Op.MUL, out, x)
    return out


def _gather(*pieces: GatherPiece, new_vars=(j,)) -> Gather:
    return Gather(None, new_vars, pieces)


def _piece(value, loops=(), guards=None) -> GatherPiece:
    return GatherPiece(tuple(loops), guards if guards is not None else ((),) * (len(loops) + 1), value, ())


def _x(*index, buffer="x"):
    return Load(buffer, tuple(index), "float32")


def test_loads_to_hoist_takes_the_loads_in_range_of_every_iteration_and_their_shared_indices():
    shapes = {"x": (10,), "y": (10,), "adj_x": (10,)}
    window = _piece(_times(_x(r), _x(j)), loops=[Range(r, 0, 3)])
    plain = _piece(_times(_x(_plus(j, 1)), _x(_plus(j, 1), buffer="y"), _x(j, buffer="adj_x")))
    shared, loads = loads_to_hoist([_gather(window, plain)], {j: (0, 8)}, shapes, "adj_x")
    # x[r] moves with the window, adj_x is the buffer written; j + 1 is read twice
    assert sorted(map(repr, loads)) == sorted(map(repr, [_x(j), _x(_plus(j, 1)), _x(_plus(j, 1), buffer="y")]))
    assert shared == [_plus(j, 1)]
    # at j = 9, x[j + 1] would read past the end: only x[j] is safe to read unguarded
    shared, loads = loads_to_hoist([_gather(window, plain)], {j: (0, 9)}, shapes, "adj_x")
    assert loads == [_x(j)] and shared == []


def _corner(c: int, scales=(2.0, 0.5)) -> Gather:
    taps = [_times(Const(s, "float32"), _x(n, Const(c, INDEX_DTYPE), Const(k, INDEX_DTYPE)))
            for k, s in enumerate(scales)]
    return _gather(*map(_piece, taps), new_vars=(n, i, j))


def test_corners_whose_gathers_are_constant_taps_run_from_tables():
    regions = [({i: (0, 0), j: (0, 0)}, [_corner(0)]), ({i: (0, 0), j: (9, 9)}, [_corner(1, (1.0, 1.0, 3.0))]),
               ({i: (1, 8), j: (0, 0)}, [_corner(2)])]  # an edge, not a point
    points = points_to_table(regions, (i, j), staged={})
    assert [region for region, _ in points] == [regions[0][0], regions[1][0]]
    assert [[scale for _, _, scale in taps] for _, taps in points] == [[2.0, 0.5], [1.0, 1.0, 3.0]]
    assert all(lead == 1 for _, taps in points for _, lead, _ in taps)  # x[n, <constants>]
    assert points_to_table(regions[:1], (i, j), staged={}) == []  # one point is not worth a table
    assert points_to_table(regions, (i, j), staged={"x": (1, "stage0")}) == []  # x read a plane at a time
    # the pass: the points' nests leave the regions, one loop over tables runs them after the rest
    def nest(region, gs):
        """A region's nest: a loop over an edge, a variable set at a point, around its Point."""
        loops = [(v, lo, hi + 1, Kind.SERIAL) for v, (lo, hi) in region.items() if lo != hi]
        lets = [Let(v, Const(lo, INDEX_DTYPE)) for v, (lo, hi) in region.items() if lo == hi]
        return loop_nest(loops, block(*lets, Point(tuple(gs), region=tuple(region.items()))))

    nests = Block(tuple(nest(*r) for r in regions))
    out = tabled_points(nests, (i, j), staged={})
    assert out.body[0] == nests.body[2] and len(out.body) == 2
    loop = out.body[1]
    assert (loop.var, loop.lo, loop.hi) == ("point", 0, 2)
    assert loop.body.body[-1] == Point((), ((Local("taps", "float32"), 1.0),), "float32")  # the sum of its taps
    assert tabled_points(nests, (i, j), staged={"x": (1, "stage0")}) == nests
    assert tabled_points(Block(nests.body[:1] + nests.body[2:]), (i, j), staged={}).body == nests.body[:1] + nests.body[2:]
    let_i, let_j, start, taps = loop.body.body[:4]
    assert let_i.var == i and let_i.value.array == Table("[[0, 0], [0, 9]]", "int64")  # each point's position
    assert start == Let(Local("taps", "float32"), Const(0, "float32"))
    assert taps.hi.array == Table("[2, 3]", "int64")  # each point runs its own count of taps
    (add,) = taps.body.body
    read, weight = add.value.args
    assert weight.array == Table("[[2.0, 0.5, 0.0], [1.0, 1.0, 3.0]]", "float32")  # padded to the longest
    assert read.buffer and read.array == "x" and read.index[0] == n
    assert read.index[1].array == Table("[[[0, 0], [0, 1], [0, 0]], [[1, 0], [1, 1], [1, 2]]]", "int64")


def test_a_load_read_by_two_gathers_is_one_tap_and_a_guarded_piece_is_none():
    load = _x(n, Const(0, INDEX_DTYPE))
    twice = [_gather(_piece(_times(Const(2.0, "float32"), load))), _gather(_piece(load))]
    assert constant_taps(twice) == [(load, 1, 3.0)]
    guarded = _piece(load, guards=((Bin(Op.LT, n, Const(3, INDEX_DTYPE)),),))
    assert constant_taps([_gather(guarded)]) is None
    assert constant_taps([_gather(_piece(_x(n, j)))]) is None  # no constant index: not a corner's tap


def test_gathers_run_by_rows_when_their_windows_walk_the_last_dimension():
    down_columns = _gather(_piece(_times(_x(r, j, buffer="dy"), _x(r, j)), loops=[Range(r, 0, 64)]))
    assert gathers_by_rows((j,), (256,), [down_columns])
    along_rows = _gather(_piece(_x(j, r), loops=[Range(r, 0, 64)]))
    assert not gathers_by_rows((j,), (256,), [along_rows])  # each read moves with the window
    assert not gathers_by_rows((j,), (1,), [down_columns])  # one column
    no_window = _gather(_piece(_x(j)))
    assert not gathers_by_rows((j,), (256,), [no_window])
    bounded_by_j = _gather(_piece(_x(r, j), loops=[Range(r, 0, j)]))
    assert not gathers_by_rows((j,), (256,), [bounded_by_j])


def test_taps_run_by_rows_when_a_window_walks_the_last_dimension(monkeypatch):
    """The decision of the `tap_rows` pass: a window's reads step with j (even as they move with
    the window); no guard, no bound that moves with j, no reduction inside, no read of the
    adjoint written."""
    shifted = _gather(_piece(_times(_x(Bin(Op.SUB, j, r)), _x(r, buffer="w")), loops=[Range(r, 0, 3)]))
    assert taps_by_rows(j, [shifted], "adj_x")
    assert not taps_by_rows(j, [_gather(_piece(_x(j)))], "adj_x")  # no window
    assert not taps_by_rows(j, [_gather(_piece(_x(j, r), loops=[Range(r, 0, 3)]))], "adj_x")  # reads across j
    guarded = _piece(_x(Bin(Op.SUB, j, r)), loops=[Range(r, 0, 3)],
                     guards=((), (Bin(Op.LT, r, Const(2, INDEX_DTYPE)),)))
    assert not taps_by_rows(j, [_gather(guarded)], "adj_x")
    assert not taps_by_rows(j, [_gather(_piece(_x(Bin(Op.SUB, j, r)), loops=[Range(r, 0, j)]))], "adj_x")
    assert not taps_by_rows(j, [_gather(_piece(_x(Bin(Op.SUB, j, r), buffer="adj_x"), loops=[Range(r, 0, 3)]))],
                            "adj_x")
    summed = Reduce("sum", _x(r, buffer="w"), (Range(r, 0, 3),), None)
    assert not taps_by_rows(j, [_gather(_piece(_times(_x(Bin(Op.SUB, j, r)), summed), loops=[Range(r, 0, 3)]))],
                            "adj_x")
    monkeypatch.setenv("HALIDE_AD_SKIP", "taps_by_rows")
    assert not taps_by_rows(j, [shifted], "adj_x")


def test_column_blocks_split_only_a_long_one_dimensional_adjoint(monkeypatch):
    monkeypatch.setenv("HALIDE_AD_PARALLEL_MIN_POINTS", "1024")
    assert column_blocks((4 * COLUMN_BLOCK,), 4 * COLUMN_BLOCK * 64) == 4
    assert column_blocks((1024,), 1024 * 64) is None  # a layer norm's gain: whole rows on one thread
    assert column_blocks((1 << 20,), 1 << 26) == COLUMN_BLOCKS
    assert column_blocks((2 * COLUMN_BLOCK - 1,), 1 << 26) is None  # too short for two blocks
    assert column_blocks((64, 1024), 1 << 26) is None  # rows run in parallel instead
    assert column_blocks((1024,), 100) is None  # too little work for threads


def test_a_separable_window_runs_as_two_passes_outside_the_parallel_plane():
    src = _x(n, i, j)
    three = ((-1, 0.25), (0, 0.5), (1, 0.25))
    split = Split(box={i: (1, 62), j: (1, 62)}, inside=[],
                  separable=Separable(src, 1, 1, rows=three, cols=three))
    assert ring_rows(split.separable) == 4  # rows -1 .. 1: the next power of two
    assert separable_window(split, (8, 64, 64), first=1, par=0)
    assert not separable_window(split, (8, 64, 64), first=1, par=1)  # a ring per thread
    assert not separable_window(split, (8, 64, MAX_SEPARABLE_TEMP), first=1, par=0)  # the ring would not fit
    assert not separable_window(Split(box={}, inside=[]), (8, 64, 64), first=1, par=0)


def test_the_optional_split_decisions_each_have_a_skip(monkeypatch):
    """HALIDE_AD_SKIP names each optional decision of a split gather nest: no box, no separable
    window (the nests stay correct, only slower; the tabled corners are a pass, skipped by
    schedule.run)."""
    three = ((-1, 0.25), (0, 0.5), (1, 0.25))
    separable = Split(box={i: (1, 62), j: (1, 62)}, inside=[], separable=Separable(_x(n, i, j), 1, 1, three, three))
    half = Bin(Op.FLOORDIV, j, Const(2, INDEX_DTYPE))
    up = Func("up", (i, j), (4, 16), Load("x", (i, half), "float32"), "float32")
    assert separable_window(separable, (8, 64, 64), first=1, par=0)
    assert pointwise_split(up) is not None
    monkeypatch.setenv("HALIDE_AD_SKIP", "separable_window,interior")
    assert not separable_window(separable, (8, 64, 64), first=1, par=0)
    assert pointwise_split(up) is None


def test_split_reduction_sums_a_long_loss_in_parts(monkeypatch):
    monkeypatch.setenv("HALIDE_AD_PARALLEL_MIN_POINTS", "1024")
    loss = Func("loss", (), (), Reduce("sum", _x(r), (Range(r, 0, 4096),)), "float32")
    partial, combined = split_reduction(loss, set())
    assert partial.shape == (MAX_PARTS,) and partial.dtype == "float64"  # float32 partials are float64
    assert partial.body.rvars[0].hi - partial.body.rvars[0].lo == 4096 // MAX_PARTS
    assert combined.body == Reduce("sum", Load(partial.name, (partial.vars[0],), "float64"),
                                   (Range(partial.vars[0], 0, MAX_PARTS),), None)
    prime = Func("loss", (), (), Reduce("sum", _x(r), (Range(r, 0, 4099),)), "float32")
    assert split_reduction(prime, set()) is None  # no chunking divides 4099
    short = Func("loss", (), (), Reduce("sum", _x(r), (Range(r, 0, 512),)), "float32")
    assert split_reduction(short, set()) is None  # below the parallel threshold


def test_an_upsampling_runs_in_phases_and_a_plain_pointwise_definition_does_not():
    half = Bin(Op.FLOORDIV, j, Const(2, INDEX_DTYPE))
    up = Func("up", (i, j), (4, 16), Load("x", (i, half), "float32"), "float32")
    split = pointwise_split(up)
    assert split is not None and split.phased == (j,) and split.strides == (2,)
    # j = 2q + p: in both phases j // 2 is q, a unit-stride read
    assert sorted(split.phases) == [(0,), (1,)]
    for gathers in split.phases.values():
        (load,) = [n for n in walk(gathers[0].pieces[0].value) if isinstance(n, Load)]
        assert load.index == (i, split.phase_vars[0])
    assert pointwise_split(Func("same", (i, j), (4, 16), _x(i, j), "float32")) is None


def test_a_sum_of_selects_on_its_variables_runs_around_a_box_with_each_test_decided():
    # what a gradient taken while tracing writes back (retrace.py): x[i, j] + x[i, j - 1] where j >= 1
    left = Select(Bin(Op.GE, _plus(j, -1), Const(0, INDEX_DTYPE)), _x(i, _plus(j, -1)), Const(0.0, "float32"))
    f = Func("d", (i, j), (4, 16), Bin(Op.ADD, _x(i, j), left), "float32")
    split = pointwise_split(f)
    assert split is not None and split.box[j] == (1, 14) and not split.phased  # (margins grow on both sides)
    (inside,) = split.inside
    minus_one = Bin(Op.SUB, j, Const(1, INDEX_DTYPE))
    assert [p.value for p in inside.pieces] == [_x(i, j), _x(i, minus_one)]  # in order, no guard left
    assert not any(p.guards[0] for p in inside.pieces)
    (edge,) = [gs for region, gs in split.outside if region[j] == (0, 0)]
    assert [p.value for g in edge for p in g.pieces] == [_x(i, Const(0, INDEX_DTYPE))]  # the select fails at j = 0
    data = Select(Bin(Op.GT, _x(i, j), Const(0.0, "float32")), _x(i, j), Const(0.0, "float32"))
    assert pointwise_split(Func("relu", (i, j), (4, 16), Bin(Op.ADD, _x(i, j), data), "float32")) is None


def test_thin_regions_run_serially_and_the_box_ranges_name_the_phase_variables(monkeypatch):
    monkeypatch.setenv("HALIDE_AD_PARALLEL_MIN_POINTS", "64")
    assert region_parallel({n: (0, 7), i: (0, 0), j: (1, 8)})  # 8 images' edge rows: 64 points
    assert not region_parallel({n: (0, 0), i: (0, 0), j: (1, 8)})  # one image's: 8
    q = Var("q")
    split = Split(box={i: (1, 14), j: (2, 13)}, inside=[], phased=(j,), strides=(2,), phase_vars=(q,))
    assert box_ranges((n, i, j), (4, 16, 16), split) == {n: (0, 3), i: (1, 14), j: (2, 13), q: (1, 6)}


def test_a_dump_prints_what_each_decision_decided_a_line_per_call(monkeypatch, capsys):
    """HALIDE_AD_DUMP names decisions as it names passes (`schedule.decision`)."""
    monkeypatch.setenv("HALIDE_AD_DUMP", "interior,pointwise_split,taps_by_rows,loads_to_hoist,column_blocks")
    half = Bin(Op.FLOORDIV, j, Const(2, INDEX_DTYPE))
    pointwise_split(Func("up", (i, j), (4, 16), Load("x", (i, half), "float32"), "float32"))
    shifted = _gather(_piece(_times(_x(Bin(Op.SUB, j, r)), _x(r, buffer="w")), loops=[Range(r, 0, 3)]))
    taps_by_rows(j, [shifted], "adj_x")
    taps_by_rows(j, [_gather(_piece(_x(j)))], "adj_x")
    loads_to_hoist([_gather(_piece(_times(_x(_plus(j, 1)), _x(_plus(j, 1), buffer="y"))))], {j: (0, 8)},
                   {"x": (10,), "y": (10,)}, "adj_x")
    separable_window(Split(box={}, inside=[]), (8, 64, 64), first=1, par=0)  # not named: not printed
    assert capsys.readouterr().out.splitlines() == [
        "# interior: box i 0..3, j 0..15; 0 region(s) around it; (j) in phases of (2)",
        "# pointwise_split: box i 0..3, j 0..15; 0 region(s) around it; (j) in phases of (2)",
        "# taps_by_rows: yes", "# taps_by_rows: no",
        "# loads_to_hoist: loads (y[j + 1], x[j + 1]), indices (j + 1)"]
