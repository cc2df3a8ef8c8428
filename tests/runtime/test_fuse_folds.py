"""fuse_folds (runtime/schedule/fuse_folds.py) on loop-nest data, `lanes.sums_of_all` against one
`sums_of` per fold, and layer norm's gradient with and without the pass (HALIDE_AD_SKIP=fuse_folds)."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from numba import njit

import halide_ad as hd
from halide_ad import ops
from halide_ad.ir import INDEX_DTYPE, Bin, Const, Load, Op, Var
from halide_ad.runtime import lanes as lanes_module
from halide_ad.runtime.loops import (Allocate, Block, Comment, Fold, Folds, For, If, Kind, Lanes, LanesOf, Let, Local, Row, Store,
                                     Term, block)
from halide_ad.runtime.schedule.fuse_folds import fuse_folds

n, j1 = Var("n"), Var("j1")
lanes = Lanes((Local("acc_lane0", "float64"), Local("acc_lane1", "float64")))


def _row(buffer: str) -> Row:
    return Row(Load(buffer, (n, Const(0, INDEX_DTYPE)), "float32"))


def _sum(out: str, rows: tuple, terms, *, hi: int = 8, start=Const(0.0, "float64")) -> For:
    """A nest of one iteration around a row sum folded in place, as split_accumulators writes it
    (the lanes' initial values, the fold), stored to out[n, 0]."""
    return For(j1, 0, 1, Kind.SERIAL, block(
        If(Bin(Op.EQ, j1, Const(0, INDEX_DTYPE)), block(
            *(Let(v, start) for v in lanes.locals),
            Let(lanes, Fold("sum", rows, 0, hi, lanes, terms)))),
        Store(out, (n, j1), lanes.locals[0])))


def _product(a: int, b: int):
    return Bin(Op.MUL, Term(a, "float32"), Term(b, "float32"))


def test_the_second_fold_runs_in_the_first_ones_pass():
    first = _sum("adj_v", (_row("ct"), _row("g"), _row("x")), Bin(Op.MUL, _product(0, 1), Term(2, "float32")))
    second = _sum("adj_m", (_row("ct"), _row("g")), _product(0, 1))
    out = fuse_folds(block(first, Comment("adj_m"), second))
    moved = Lanes(tuple(Local(f"{q.name}_with2", "float64") for q in lanes.locals))
    rows = (_row("ct"), _row("g"), _row("x"))
    inner = first.body.body[0].then.body
    expected_first = replace(first, body=block(replace(first.body.body[0], then=block(
        *inner[:-1], Let(LanesOf((lanes, moved)), Folds((
            inner[-1].value, Fold("sum", rows, 0, 8, moved, _product(0, 1))))))), first.body.body[1]))
    expected_second = replace(second, body=block(replace(second.body.body[0], then=block(Let(lanes, moved))),
                                                 second.body.body[1]))
    assert out == block(*(Let(q, Const(0.0, "float64")) for q in moved.locals), expected_first, Comment("adj_m"),
                        expected_second)
    plane = Allocate("stage1", (1,), "float32", stack=True)  # a staged pair's plane, allocated between
    assert fuse_folds(block(first, plane, second)) == block(*out.body[:-2], plane, expected_second)


def test_a_new_row_joins_the_pass_and_the_terms_follow_it():
    first = _sum("adj_v", (_row("ct"),), None)
    second = _sum("adj_m", (_row("g"), _row("ct")), _product(0, 1))
    out = fuse_folds(block(first, second))
    (folds,) = [s.value for s in out.body[2].body.body[0].then.body if isinstance(s, Let) and isinstance(s.value, Folds)]
    assert folds.folds[0].rows == folds.folds[1].rows == (_row("ct"), _row("g"))
    assert folds.folds[0].terms == Term(0, "float32") and folds.folds[1].terms == _product(1, 0)


def test_folds_that_cannot_share_a_pass_stay_apart():
    first = _sum("adj_v", (_row("ct"), _row("g")), _product(0, 1))
    reads_first = _sum("adj_m", (_row("ct"), _row("adj_v")), _product(0, 1))  # what the first nest writes
    shorter = _sum("adj_m", (_row("ct"), _row("g")), _product(0, 1), hi=4)
    twice = replace(_sum("adj_m", (_row("ct"), _row("g")), _product(0, 1)), hi=2)  # the loop runs twice
    from_local = _sum("adj_m", (_row("ct"), _row("g")), _product(0, 1), start=Local("seed", "float64"))
    local_row = _sum("adj_m", (Local("acc_terms32", "float32"),), None)  # a row of terms written first
    for second in (reads_first, shorter, twice, from_local, local_row):
        pair = block(first, second)
        assert fuse_folds(pair) == pair
    assert isinstance(fuse_folds(Block()), Block)


@pytest.mark.parametrize("length", [8, 64, 1024, 2056, 4104])
def test_folds_in_one_pass_give_each_folds_bits(length):
    @njit
    def together(a, b, c, m, hi):
        zero = (0.0,) * 8
        return lanes_module.sums_of_all(("((r0 * r1) * (r2 - s0))", "(r0 * r1)"), (a, b, c), (m,), 0, hi,
                                        (zero, zero))

    @njit
    def apart(a, b, c, m, hi):
        zero = (0.0,) * 8
        return (lanes_module.sums_of("((r0 * r1) * (r2 - s0))", (a, b, c), (m,), 0, hi, zero),
                lanes_module.sums_of("(r0 * r1)", (a, b), (), 0, hi, zero))

    rng = np.random.default_rng(length)
    a, b, c = (rng.standard_normal(length).astype(np.float32) for _ in range(3))
    m = np.float32(0.3)
    compiled = together(a, b, c, m, length)
    plain = lanes_module.plain_python.sums_of_all(("((r0 * r1) * (r2 - s0))", "(r0 * r1)"), (a, b, c), (m,), 0,
                                                  length, ((0.0,) * 8, (0.0,) * 8))
    assert np.array(compiled).tobytes() == np.array(apart(a, b, c, m, length)).tobytes() == np.array(plain).tobytes()


def _layer_norm(x, g, b):
    return ops.layer_norm(x, g, b, axis=-1)


def test_layer_norm_gradient_folds_both_row_sums_in_one_pass(monkeypatch):
    monkeypatch.setenv("HALIDE_AD_TIERED", "0")
    monkeypatch.setenv("HALIDE_AD_PARALLEL_MIN_POINTS", "0")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((16, 264)).astype(np.float32)  # rows long enough to fold in lanes
    g, b = (rng.standard_normal(264).astype(np.float32) for _ in range(2))
    ct = rng.standard_normal((16, 264)).astype(np.float32)
    assert "lanes.sums_of_all(" in hd.explain(hd.func(_layer_norm), x, g, b).backward_source
    fused = hd.vjp(hd.func(_layer_norm), x, g, b)[1](ct)
    monkeypatch.setenv("HALIDE_AD_SKIP", "fuse_folds")
    assert "sums_of_all" not in hd.explain(hd.func(_layer_norm), x, g, b).backward_source
    for a, c in zip(fused, hd.vjp(hd.func(_layer_norm), x, g, b)[1](ct), strict=True):
        assert a.tobytes() == c.tobytes()  # the same bits
