"""fuse_row_sums (runtime/schedule/row_sums.py) on loop-nest data, and a gradient that sums two rows
of terms with and without it (HALIDE_AD_SKIP=fuse_row_sums)."""
from __future__ import annotations

from dataclasses import replace

import numpy as np

import halide_ad as hd
from halide_ad.ops._fuse import reduce_axes
from halide_ad.ir import INDEX_DTYPE, Bin, Const, Load, Op, Var
from halide_ad.runtime.loops import (Allocate, Block, Comment, Element, Fold, For, If, Kind, Lanes, Let, Local, Store,
                                     block)
from halide_ad.runtime.schedule.row_sums import fuse_row_sums

n, j, j1 = Var("n"), Var("j"), Var("j1")
lanes = Lanes((Local("acc_lane0", "float64"), Local("acc_lane1", "float64")))


def _sum(out: str, value, *, var=j) -> For:
    """A nest of one iteration around a row sum of `value` over var, as split_accumulators writes
    it (the lanes' initial values, the row, its loop, its fold), stored to out[n, 0]."""
    row = Element("acc_terms32", (var,), "float32")
    return For(j1, 0, 1, Kind.SERIAL, block(
        If(Bin(Op.EQ, j1, Const(0, INDEX_DTYPE)), block(
            *(Let(v, Const(0.0, "float64")) for v in lanes.locals),
            Allocate("acc_terms32", (8,), "float32", stack=True),
            For(var, 0, 8, Kind.SERIAL, block(Let(row, value))),
            Let(lanes, Fold("sum", (Local("acc_terms32", "float32"),), 0, 8, lanes)))),
        Store(out, (n, j1), lanes.locals[0])))


def _y(var=j):
    return Load("y", (n, var), "float32")


def test_the_second_sums_terms_join_the_first_ones_loop():
    first = _sum("adj_v", Bin(Op.MUL, _y(), Load("x", (n, j), "float32")))
    k = Var("k")
    second = _sum("adj_m", Bin(Op.MUL, _y(k), Load("g", (k,), "float32")), var=k)
    stage = Allocate("stage1", (1,), "float32", stack=True)  # a staged pair's plane, allocated between
    out = fuse_row_sums(block(first, Comment("adj_m"), stage, second))
    moved = Let(Element("acc_terms32_2", (j,), "float32"), Bin(Op.MUL, _y(), Load("g", (j,), "float32")))
    inner = first.body.body[0].then.body
    expected_first = replace(first, body=block(replace(first.body.body[0], then=block(
        *inner[:-2], Allocate("acc_terms32_2", (8,), "float32", stack=True),
        replace(inner[-2], body=block(*inner[-2].body.body, moved)), inner[-1])), first.body.body[1]))
    second_inner = second.body.body[0].then.body
    expected_second = replace(second, body=block(replace(second.body.body[0], then=block(
        *second_inner[:-3],
        Let(lanes, Fold("sum", (Local("acc_terms32_2", "float32"),), 0, 8, lanes)))), second.body.body[1]))
    assert out == block(expected_first, Comment("adj_m"), stage, expected_second)


def test_terms_that_read_what_comes_before_them_stay_in_their_loop():
    first = _sum("adj_v", _y())
    reads_first = _sum("adj_m", Bin(Op.MUL, _y(), Load("adj_v", (n, Const(0, INDEX_DTYPE)), "float32")))
    reads_lane = _sum("adj_m", Bin(Op.MUL, _y(), lanes.locals[1]))  # its own nest's lanes, set before
    shorter = _sum("adj_m", _y())
    shorter = replace(shorter, body=block(replace(shorter.body.body[0], then=block(*(
        replace(s, hi=4) if isinstance(s, For) else s for s in shorter.body.body[0].then.body))), shorter.body.body[1]))
    twice = replace(_sum("adj_m", _y()), hi=2)  # the enclosing loop runs twice
    for second in (reads_first, reads_lane, shorter, twice):
        pair = block(first, second)
        assert fuse_row_sums(pair) == pair
    reads_stage = _sum("adj_m", Bin(Op.MUL, _y(), Element("stage1", (Const(0, INDEX_DTYPE),), "float32")))
    pair = block(first, Allocate("stage1", (1,), "float32", stack=True), reads_stage)
    assert fuse_row_sums(pair) == pair
    assert isinstance(fuse_row_sums(Block()), Block)


def _tanh_weighted(a):
    """(a - mean) * tanh(a) * sum(a * a) over the rows: the gradient sums two rows of terms that
    read tanh, which a fold cannot compute in place (layer norm's are arithmetic: folded in place)."""
    m = reduce_axes("sum", lambda i: a[i], a.shape, (1,), scale=1 / a.shape[1], name="m")
    s = reduce_axes("sum", lambda i: a[i] * a[i], a.shape, (1,), name="s")
    return hd.compute(a.shape, lambda i, j: (a[i, j] - m[i, 0]) * hd.tanh(a[i, j]) * s[i, 0], name="y")


def test_a_gradient_sums_both_rows_of_terms_in_one_loop(monkeypatch):
    monkeypatch.setenv("HALIDE_AD_PARALLEL_MIN_POINTS", "0")  # the rows in parallel: one row group
    x = np.cos(np.arange(32 * 64, dtype=np.float32)).reshape(32, 64)
    ct = np.sin(np.arange(32 * 64, dtype=np.float32)).reshape(32, 64)
    assert "acc_terms32_2[" in hd.explain(hd.func(_tanh_weighted), x).backward_source
    fused = hd.vjp(hd.func(_tanh_weighted), x)[1](ct)
    monkeypatch.setenv("HALIDE_AD_SKIP", "fuse_row_sums")
    assert "acc_terms32_2" not in hd.explain(hd.func(_tanh_weighted), x).backward_source
    for a, c in zip(fused, hd.vjp(hd.func(_tanh_weighted), x)[1](ct), strict=True):
        assert np.array_equal(a, c)  # the same bits
