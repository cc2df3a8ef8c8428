"""An interior box's windows a row at a time, the window's loops outside the row's (the pass
`schedule.tap_rows.tap_rows`, as `schedule.rows.taps_by_rows` decides); a staged plane computed
only where it is read (`schedule.stage.read_box`).

Each point adds its terms in the same order either way: the gradients with and without
HALIDE_AD_SKIP=taps_by_rows (read_box) must be the same bytes, and PyTorch's values."""
from __future__ import annotations

import re

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import halide_ad as hd
import halide_ad.ops as ops
from halide_ad.ir import INDEX_DTYPE, Bin, Const, Load, Op, Range, Scatter, Var
from halide_ad.runtime import lower, schedule
from halide_ad.runtime.loops import Accumulate, For, Kind, Point, block
from halide_ad.runtime.schedule.tap_rows import tap_rows
from halide_ad.solver import Gather, GatherPiece

# a row loop over the last output variable inside a window's two loops: `for j3 in range(2, ...)`
# directly under `for r_2 ...` (after r_2's unsigned index, `r_2_nn = nonneg(r_2)`)
ROW_FORM = re.compile(r"for r_2 in range\([^\n]*\n(\s+r_2_nn = nonneg\(r_2\)\n)?\s+for j3 in range\(")


@hd.func
def layer(x, w, b):
    return ops.max_pool2d(ops.relu(ops.conv2d(x, w, b, padding=1)), 2)


@hd.func
def valid_conv(x, w):
    return ops.conv2d(x, w)


def torch_layer(x, w, b):
    return F.max_pool2d(F.relu(F.conv2d(x, w, b, padding=1)), 2)


def torch_valid_conv(x, w):
    return F.conv2d(x, w)


i, j, r = Var("i"), Var("j"), Var("r")


def _box_of(*pieces: GatherPiece):
    """A box's nest over rows 1..4 and columns 1..6 around a Point of one gather of `pieces` (the
    loops named as the emitter names them), and that gather."""
    value = Bin(Op.MUL, Load("dy", (i, j), "float32"), Load("w", (r,), "float32"))
    gather = Gather(Scatter("x", (i, Bin(Op.ADD, j, r)), value, (Range(r, 0, 3),)), (i, j), pieces)
    return For("i", 1, 5, Kind.PARALLEL, block(For("j", 1, 7, Kind.SERIAL, block(Point((gather,)))))), gather


def test_tap_rows_runs_the_boxs_last_loop_a_row_at_a_time(monkeypatch, capsys):
    """The row's first terms (2 * x[i, j]) as a Point of terms, then the window's loop around the
    row's, each tap added into the adjoint's row; a guarded piece declines; a skip leaves it."""
    shifted = Load("dy", (i, Bin(Op.SUB, j, r)), "float32")
    window = GatherPiece((Range(r, 0, 3),), ((), ()), Bin(Op.MUL, shifted, Load("w", (r,), "float32")), ())
    plain = GatherPiece((), ((),), Bin(Op.MUL, Const(2.0, "float32"), Load("x", (i, j), "float32")), ())
    box, gather = _box_of(plain, window)
    target = Load("adj_x", (i, j), "float32")
    rows = For("i", 1, 5, Kind.PARALLEL, block(
        For(j, 1, 7, Kind.SERIAL, block(Point(terms=((Load("x", (i, j), "float32"), 2.0),), terms_dtype="float32"))),
        lower.describe(gather),
        For(r, 0, 3, Kind.SERIAL, block(For(j, 1, 7, Kind.SERIAL, block(Accumulate(target, window.value,
                                                                                   augmented=True)))))))
    assert tap_rows(box, j, (i, j), "adj_x", "float32") == rows
    guarded = GatherPiece((Range(r, 0, 3),), ((), (Bin(Op.LT, r, Const(2, INDEX_DTYPE)),)), window.value, ())
    declined, _ = _box_of(plain, guarded)
    assert tap_rows(declined, j, (i, j), "adj_x", "float32") == declined
    monkeypatch.setenv("HALIDE_AD_SKIP", "tap_rows")
    monkeypatch.setenv("HALIDE_AD_DUMP", "tap_rows")
    assert schedule.run(tap_rows, box, j, (i, j), "adj_x", "float32") == box
    assert "# after tap_rows (skipped)" in capsys.readouterr().out


CASES = {"layer": (layer, torch_layer, 3), "valid": (valid_conv, torch_valid_conv, 2)}


def _inputs(case: str, dtype, strided: bool):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 3, 10, 24 if strided else 12)).astype(dtype)
    x = x[..., ::2] if strided else x  # a non-contiguous input: every other column
    w = rng.standard_normal((2, 3, 3, 3)).astype(dtype)
    b = rng.standard_normal(2).astype(dtype)
    return (x, w, b)[:CASES[case][2]]


def _grads(fn, args):
    """The forward and the gradients of a fresh copy of `fn` (a function keeps the kernels of its
    first call's settings), and its backward's source."""
    fresh = hd.func(lambda *a: fn(*a))
    out, f_vjp = hd.vjp(fresh, *args)
    ct = np.random.default_rng(4).standard_normal(out.shape).astype(out.dtype)
    return out, f_vjp(ct), ct, hd.explain(fresh, *args).backward_source


@pytest.mark.parametrize("dtype, strided", [(np.float32, False), (np.float64, True), (np.float32, True)],
                         ids=["f32", "f64-strided", "f32-strided"])
@pytest.mark.parametrize("case", list(CASES))
def test_rows_of_taps_give_the_same_bits(monkeypatch, case, dtype, strided):
    monkeypatch.setenv("HALIDE_AD_TIERED", "0")
    args = _inputs(case, dtype, strided)
    out, grads, ct, source = _grads(CASES[case][0], args)
    monkeypatch.setenv("HALIDE_AD_SKIP", "taps_by_rows")
    _, point_grads, _, point_source = _grads(CASES[case][0], args)
    assert ROW_FORM.search(source) and not ROW_FORM.search(point_source), source
    for g, h in zip(grads, point_grads, strict=True):
        assert g.tobytes() == h.tobytes()
    torch_args = [torch.tensor(np.ascontiguousarray(a).astype(np.float64), requires_grad=True) for a in args]
    CASES[case][1](*torch_args).backward(torch.tensor(ct.astype(np.float64)))
    tol = 1e-4 if dtype == np.float32 else 1e-10
    for g, t in zip(grads, torch_args, strict=True):
        np.testing.assert_allclose(g, t.grad.numpy(), rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_staged_plane_is_computed_where_it_is_read(monkeypatch, dtype):
    """The zero padding's adjoint, a (12, 14) plane of which adj_x reads rows 1 to 10 and
    columns 1 to 12: its nest runs those, and with HALIDE_AD_SKIP=read_box the whole plane."""
    monkeypatch.setenv("HALIDE_AD_TIERED", "0")
    args = _inputs("layer", dtype, False)
    _, grads, _, source = _grads(layer, args)
    monkeypatch.setenv("HALIDE_AD_SKIP", "read_box")
    _, whole_grads, _, whole_source = _grads(layer, args)
    assert _staged_points(source) == {"j2": (1, 10), "j3": (1, 12)}
    assert _staged_points(whole_source) == {"j2": (0, 11), "j3": (0, 13)}
    for g, h in zip(grads, whole_grads, strict=True):
        assert g.tobytes() == h.tobytes()


def _staged_points(source: str) -> dict[str, tuple[int, int]]:
    """The least and greatest row (j2) and column (j3) that the nest writing the staged plane
    `stage1` sets, from its loops' bounds and its assignments."""
    start = source.index("stage1 = np.empty")
    nest = source[start:source.index("\n", source.rindex("stage1[j2, j3]"))]  # to its last store
    points: dict[str, list[int]] = {"j2": [], "j3": []}
    for var, lo, hi in re.findall(r"for (j[23]) in range\((\d+), (\d+)\)", nest):
        points[var] += [int(lo), int(hi) - 1]
    for var, at in re.findall(r"(j[23]) = (\d+)\n", nest):
        points[var].append(int(at))
    return {var: (min(at), max(at)) for var, at in points.items()}
