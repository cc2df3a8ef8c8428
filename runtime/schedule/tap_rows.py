"""tap_rows: a gather loop nest's box whose windows read along its last dimension runs a row at a
time (`taps_by_rows`, schedule/rows.py, decides): the box's last loop, around its Point, becomes a
loop over the row storing each point's first terms (a Point of those terms), then each window's
loops around a loop over the row that adds one tap to every point of it, so that LLVM vectorizes
along the row. Each point adds its terms in the order a point at a time does
(`gathers.gather_statements`), so the bits do not change.

Skipped (HALIDE_AD_SKIP=tap_rows, or taps_by_rows), the box runs a point at a time: the same bits.
"""
from __future__ import annotations

from dataclasses import replace

from halide_ad import config
from halide_ad.ir import Expr, Load, Var
from halide_ad.runtime import lower
from halide_ad.runtime.loops import Accumulate, Block, For, Kind, Local, Point, Stmt, block, nest
from halide_ad.runtime.schedule.accumulate import split_accumulators
from halide_ad.runtime.schedule.rows import taps_by_rows


def tap_rows(s: Stmt, var: Var, index: tuple[Expr, ...], written: str, dtype: str) -> Stmt:
    """`s`, a gather loop nest's box (its loops around a Point of the box's gathers, the last over
    `var`, the last of the adjoint's variables `index`), with its last loop run a row at a time
    where `taps_by_rows` decides so: a loop over the row of Points of each point's pieces read
    unconditionally as a constant times loads (`lower.constant_product`, as terms of `dtype`),
    then each window's loops around a loop over the row adding one tap into the adjoint
    `written` (of `dtype`, not wider: the caller's test). `s` where the decision declines, or
    where a window would run in lanes (`split_accumulators`, another order)."""
    match s:
        case For(lo=lo, hi=hi, body=Block((Point(gathers=gs),))):
            rows = _rows(gs, var, lo, hi, index, written, dtype)
            return s if rows is None else rows
        case For(body=Block((inner,))):
            return replace(s, body=block(tap_rows(inner, var, index, written, dtype)))
    return s


def _rows(gs, var: Var, lo, hi, index: tuple[Expr, ...], written: str, dtype: str) -> Stmt | None:
    """The box's gathers `gs` over one row, columns lo..hi-1 of `var` (`tap_rows`); None where
    it declines."""
    if not taps_by_rows(var, gs, written):
        return None
    acc, target = Local("acc", dtype), Load(written, index, dtype)

    def along_row(s: Stmt) -> For:
        return For(var, lo, hi, Kind.SERIAL, block(s))

    like: dict[tuple[Load, ...], float] = {}
    windows: list[Stmt] = []
    for g in gs:
        windows.append(lower.describe(g))
        for piece in g.pieces:
            if (key := lower.constant_product(piece, dtype)) is not None:
                like[key[0]] = like.get(key[0], 0.0) + key[1]
                continue
            point = block(lower.gather_piece(piece, acc))
            if not config.skipped("split_accumulators") and split_accumulators(point) != point:
                return None
            windows.append(nest([(loop.var, loop.lo, loop.hi, Kind.SERIAL) for loop in piece.loops],
                                along_row(Accumulate(target, piece.value, augmented=True))))
    terms = tuple((lower.product(loads), scale) for loads, scale in like.items())
    return block(along_row(Point(terms=terms, terms_dtype=dtype)), *windows)
