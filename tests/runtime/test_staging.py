"""The staging passes (runtime/schedule/staging.py, `stage_plane`, `fuse_plane`) on loop-nest data,
and a staged gradient against the same one with the pass's decision turned off."""
from __future__ import annotations

from dataclasses import replace

import numpy as np

import halide_ad as hd
from halide_ad import ops
from halide_ad.ir import INDEX_DTYPE, Bin, Cast, Const, Load, Op, Select, Var
from halide_ad.runtime.emit import Emitter
from halide_ad.runtime.loops import (Accumulate, Element, Fold, For, Hoisted, Kind, Lanes, Let, Local, Row, Store,
                                     block)
from halide_ad.runtime.schedule.staging import fuse_plane, plane_read, stage_plane

n, i, j = Var("n"), Var("i"), Var("j")


def _p(*index):
    return Load("adj_p", tuple(index), "float32")


def _plus(e, k: int):
    return Bin(Op.ADD, e, Const(k, INDEX_DTYPE))


def test_the_planes_stores_and_reads_become_the_locals_elements():
    producer = For(j, 0, 4, Kind.SERIAL, block(Store("adj_p", (n, j), Load("x", (n, j), "float32"))))
    hoisted = Hoisted("h0", "float32", _p(n, j))
    lanes = Lanes((Local("acc", "float32"),))
    consumer = For(j, 0, 3, Kind.SERIAL, block(
        Let(hoisted, _p(n, j)),
        Accumulate(Load("adj_q", (n, j), "float32"), Bin(Op.ADD, hoisted, _p(n, _plus(j, 1))), augmented=True),
        Let(lanes, Fold("sum", (Row(_p(n, Const(0, INDEX_DTYPE))),), 0, 4, lanes))))
    out = stage_plane(block(producer, consumer), "adj_p", 1, "stage1", "float32")

    def at(*index):
        return Element("stage1", tuple(index), "float32", partial=True)

    assert out == block(
        For(j, 0, 4, Kind.SERIAL, block(Let(at(j), Load("x", (n, j), "float32")))),  # a store: the local's element
        For(j, 0, 3, Kind.SERIAL, block(
            Let(hoisted, at(j)),  # the hoisted local keeps its load (it prints as its name)
            Accumulate(Load("adj_q", (n, j), "float32"), Bin(Op.ADD, hoisted, at(_plus(j, 1))), augmented=True),
            Let(lanes, Fold("sum", (Local("stage1", "float32"),), 0, 4, lanes)))))  # a row of the plane: the local
    # only the elements read are written: a select that reads one keeps its branch, as for a load
    pick = Select(Bin(Op.GT, j, Const(0, INDEX_DTYPE)), at(j), Const(0.0, "float32"))
    assert Emitter({}).expr(pick).startswith("(stage1[j] if ")
    assert Emitter({}).expr(replace(pick, true=Element("row1", (j,), "float32"))).startswith("branchless(")
    # a plane of two dimensions: a row of it is the local's row
    row = stage_plane(Let(lanes, Fold("sum", (Row(_p(n, i, Const(0, INDEX_DTYPE))),), 0, 4, lanes)), "adj_p", 1, "s", "float32")
    assert row.value.rows == (Element("s", (i,), "float32", partial=True),)


def _pipeline(a):
    return ops.max_pool2d(ops.relu(ops.avg_pool2d(a, 3, stride=1, padding=1)), 2)


def test_a_staged_gradient_matches_the_unstaged_one(monkeypatch):
    x = np.cos(np.arange(2 * 2 * 8 * 8, dtype=np.float64)).reshape(2, 2, 8, 8)
    ct = np.sin(np.arange(2 * 2 * 4 * 4, dtype=np.float64)).reshape(2, 2, 4, 4)
    assert "one plane at a time from stage" in hd.explain(hd.func(_pipeline), x).backward_source
    staged = hd.vjp(hd.func(_pipeline), x)[1](ct)
    monkeypatch.setenv("HALIDE_AD_SKIP", "stage_plane")
    assert "stage" not in hd.explain(hd.func(_pipeline), x).backward_source
    np.testing.assert_allclose(hd.vjp(hd.func(_pipeline), x)[1](ct), staged, rtol=1e-12)


def _at(*index):
    return Element("stage1", tuple(index), "float32", partial=True)


def test_a_plane_read_where_it_is_computed_becomes_a_scalar_of_one_loop():
    acc, acc64 = Local("acc", "float32"), Local("acc", "float64")
    producer = For("j", 0, 4, Kind.SERIAL, block(Let(acc64, Load("x", (n, j), "float64")), Let(_at(j), acc64)))
    consumer = For("j", 0, 4, Kind.SERIAL, block(
        Let(acc, Bin(Op.MUL, _at(j), Load("e", (n, j), "float32"))), Store("adj_x", (n, j), acc)))
    out = fuse_plane(block(producer, consumer), "stage1", "float32")
    value = Local("stage1_value", "float32")
    assert out == block(For("j", 0, 4, Kind.SERIAL, block(
        Let(acc64, Load("x", (n, j), "float64")), Let(value, Cast("float32", acc64)),  # rounded as the store did
        Let(acc, Bin(Op.MUL, value, Load("e", (n, j), "float32"))), Store("adj_x", (n, j), acc))))
    assert not plane_read(out, "stage1") and plane_read(block(producer, consumer), "stage1")
    # the consumer reads a neighbour's element, or a local of the producer's: two loops stay
    shifted = replace(consumer, body=block(Let(acc, _at(_plus(j, 1))), Store("adj_x", (n, j), acc)))
    carried = replace(consumer, body=block(Store("adj_x", (n, j), Bin(Op.MUL, _at(j), acc64))))
    # the producer writes a buffer; the loops' ranges differ
    writes = replace(producer, body=block(Store("adj_y", (n, j), acc64), *producer.body.body))
    for pair in (block(producer, shifted), block(producer, carried), block(writes, consumer),
                 block(producer, replace(consumer, hi=3))):
        assert fuse_plane(pair, "stage1", "float32") == pair


def _softmax(a):
    return ops.softmax(a, axis=-1)


def test_softmax_gradient_reads_its_exp_adjoint_where_it_is_computed(monkeypatch):
    x = np.cos(np.arange(16 * 40, dtype=np.float32)).reshape(16, 40)
    ct = np.sin(np.arange(16 * 40, dtype=np.float32)).reshape(16, 40)
    source = hd.explain(hd.func(_softmax), x).backward_source
    assert "reading each element of adj_softmax_exp where it is computed" in source
    fused = hd.vjp(hd.func(_softmax), x)[1](ct)
    monkeypatch.setenv("HALIDE_AD_SKIP", "fuse_plane")
    assert "where it is computed" not in hd.explain(hd.func(_softmax), x).backward_source
    assert np.array_equal(hd.vjp(hd.func(_softmax), x)[1](ct), fused)  # the same bits
