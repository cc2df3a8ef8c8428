"""The gradient's gather loop nests built as loop-nest data (runtime/gathers.py): the weighted
sums of a region's constant taps, as expressions that print flat; an adjoint run a row at a time;
a point's guarded reductions lifted before it."""
import pytest

from halide_ad.ir import Adjoint, Bin, Const, Load, Op, Range, Reduce, Scatter, Var
from halide_ad.runtime import emit
from halide_ad.runtime.emit import Emitter
from halide_ad.runtime.gathers import lift_reductions, row_gathers
from halide_ad.runtime.lower import product
from halide_ad.runtime.loops import (Accumulate, Allocate, Block, Chain, Element, For, If, Kind, Local, Store, loops, show,
                                     walk, weighted_sums)
from halide_ad.runtime.plans import AdjointPlan
from halide_ad.runtime.schedule.rows import COLUMN_BLOCK
from halide_ad.solver import Gather, GatherPiece
from halide_ad.traverse import walk as walk_expr

i = Var("i")


def _x(k: int) -> Load:
    return Load("x", (Const(k, "int64"),), "float32")


def test_weighted_sums_add_the_terms_of_each_weight_before_it_multiplies_them():
    terms = [(_x(0), 0.5), (product((_x(1), _x(2))), 1.0), (_x(3), 0.5), (None, 2.0)]
    sums = weighted_sums(terms, "float32")
    assert sums[0] == Const(2.0, "float32")  # a weight alone first
    assert sums[1] == Chain(Op.MUL, (Chain(Op.ADD, (_x(0), _x(3)), grouped=True), Const(0.5, "float32")))
    assert sums[2] == Chain(Op.MUL, (_x(1), _x(2)))  # weight 1: no product
    em = Emitter({"x": (4,)})
    assert [em.expr(s) for s in sums] == ["f32_0", "(x[0] + x[3]) * f32_1", "x[1] * x[2]"]
    assert product(()) is None and product((_x(0),)) == _x(0)


COLUMNS = 4 * COLUMN_BLOCK


def _window_gather(dtype: str = "float32") -> tuple[AdjointPlan, Gather]:
    """adj_g[j] += dy[r, j] * x[r, j] over r < 300: a gain's gradient, whose window walks rows."""
    j, r = Var("j"), Var("r")
    value = Bin(Op.MUL, Load("dy", (r, j), dtype), Load("x", (r, j), dtype))
    scatter = Scatter("g", (j,), value, (Range(r, 0, 300), Range(j, 0, COLUMNS)))
    gather = Gather(scatter, (j,), (GatherPiece((Range(r, 0, 300),), ((), ()), value, ()),))
    adjoint = Adjoint("g", (COLUMNS,), dtype, False, (scatter,))
    return AdjointPlan(adjoint, (j,), (gather,)), gather


def test_rows_of_a_long_window_accumulate_in_a_float64_row_in_parallel_blocks_of_columns(monkeypatch):
    monkeypatch.setenv("HALIDE_AD_PARALLEL_MIN_POINTS", "1024")
    plan, gather = _window_gather()
    names = iter(["row1", "col2"])
    nest = row_gathers(plan, [gather], "adj_g", lambda base: next(names))
    (blocks,) = [s for s in nest.body if isinstance(s, For)] if isinstance(nest, Block) else [nest]
    assert blocks.kind is Kind.PARALLEL and blocks.var == "col2_block" and blocks.hi == 4
    assert any(isinstance(s, Allocate) and s.dtype == "float64" for s in walk(blocks))  # one row per block
    window = [s for s in walk(blocks) if isinstance(s, For) and s.var == Var("r")]
    # the window's loop outside the row's: every read walks memory along j
    assert len(window) == 1 and loops(window[0])[1].var == Var("j")
    (add,) = [s for s in walk(window[0]) if isinstance(s, Accumulate)]
    assert isinstance(add.target, Element) and add.target.array == "row1"
    (store,) = [s for s in walk(blocks) if isinstance(s, Store)]
    assert store.buffer == "adj_g" and store.value == add.target
    source = "\n".join(emit.render(nest, Emitter({"dy": (300, COLUMNS), "x": (300, COLUMNS), "adj_g": (COLUMNS,)})))
    assert f"col2 = col2_block * {COLUMN_BLOCK}" in source
    assert f"for j in range(col2, min(col2 + {COLUMN_BLOCK}, {COLUMNS})):" in source
    assert "# gather-window: adj_g[j] += dy[r, j] * x[r, j]" in show(nest)  # (HALIDE_AD_DUMP's text)


def test_rows_of_a_short_window_accumulate_in_the_adjoint(monkeypatch):
    monkeypatch.setenv("HALIDE_AD_PARALLEL_MIN_POINTS", str(1 << 30))
    plan, gather = _window_gather("float64")
    nest = row_gathers(plan, [gather], "adj_g", lambda base: pytest.fail("no temporary"))
    assert not any(isinstance(s, Allocate) for s in walk(nest)) and all(
        s.kind is Kind.SERIAL for s in loops(nest))
    (add,) = [s for s in walk(nest) if isinstance(s, Accumulate)]
    assert add.target == Load("adj_g", (Var("j"),), "float64")


def test_a_guarded_pieces_reductions_are_lifted_before_the_point_in_print_order():
    """The loops of each reduction inside a point's guarded pieces come out as statements of their
    own, the pieces reading a local instead, outside the guard."""
    r, s = Var("r"), Var("s")
    total = Reduce("sum", Load("x", (r,), "float32"), (Range(r, 0, 3),))
    other = Reduce("max", Load("x", (s,), "float32"), (Range(s, 0, 2),))
    acc = Local("acc", "float32")
    piece = If(Bin(Op.GT, i, Const(0, "int64")),
               Block((Accumulate(acc, Bin(Op.ADD, total, other), augmented=True),)))
    names = iter(["red1", "red2"])
    lifted, rest = lift_reductions(piece, lambda base: next(names))
    assert not any(isinstance(n, Reduce) for s_ in walk(rest) for n in _expressions(s_))
    (add,) = [n for n in walk(rest) if isinstance(n, Accumulate)]
    assert add.value == Bin(Op.ADD, Local("red1", "float32"), Local("red2", "float32"))
    assert [loops(n)[0].var for n in lifted] == [r, s]  # the sum's loop first, as printed
    assert not any(isinstance(n, If) for n in lifted for n in walk(n))
    unchanged = Block((Accumulate(acc, _x(0), augmented=True),))
    assert lift_reductions(unchanged, lambda base: "unused") == ([], unchanged)


def _expressions(s):
    match s:
        case Accumulate(target, value):
            return [n for e in (target, value) for n in walk_expr(e)]
        case If(cond):
            return list(walk_expr(cond))
    return []
