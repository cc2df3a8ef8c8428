"""edge_columns: a gather loop nest's regions beside its interior box in the last dimension only (a
plane's edge columns) run inside the box's loop over the dimension before it, next to each row's
interior, while that row is in cache.

Skipped (HALIDE_AD_SKIP=edge_columns), they run as the other regions do, each its own nest
before the box: the same results.
"""
from __future__ import annotations

from dataclasses import replace

from halide_ad.ir import Var
from halide_ad.runtime.loops import Block, For, Kind, Let, Point, Stmt, walk


def edge_columns(s: Block, box: tuple[tuple[Var, tuple[int, int]], ...], depth: int) -> Block:
    """`s`, a Block of the regions' Block (each region a nest from the box's first cut dimension
    in, around a Point of its region) and the box's plain nest (its loops from that dimension
    in), with the regions that match the `box` (its cut dimensions' inclusive ranges, in order)
    in every cut dimension but the last moved into the box: their loops over the dimensions
    before the last dropped, the rest serial, those below the box in the last dimension before
    the box's loop over it, those above after it (at `depth`, inside the box's loops over the
    dimensions before the last)."""
    regions, inside = s.body
    *before, (last, (lo, _)) = box
    low: list[Stmt] = []
    high: list[Stmt] = []
    kept: list[Stmt] = []
    for r in regions.body:
        (region,) = [dict(p.region) for p in walk(r) if isinstance(p, Point)]
        if region[last] == box[-1][1] or any(region[v] != extent for v, extent in before):
            kept.append(r)
        else:
            (low if region[last][1] < lo else high).append(_serial(_inner(r, depth)))
    if not low and not high:
        return s
    return Block((Block(tuple(kept)), _beside(inside, depth, low, high)))


def _inner(s: Stmt, depth: int) -> Stmt:
    """A region's nest without its outer `depth` loops (a loop of one point is a Let)."""
    if depth == 0:
        return s
    match s:
        case For(body=body):
            return _inner(_only(body), depth - 1)
        case Block((Let(), *rest)):
            return _inner(_only(Block(tuple(rest))), depth - 1)
    raise ValueError(f"not a region's nest: {s!r}")


def _serial(s: Stmt) -> Stmt:
    match s:
        case For(body=body):
            return replace(s, kind=Kind.SERIAL, body=_serial(body))
        case Block(body):
            return Block(tuple(map(_serial, body)))
    return s


def _beside(s: Stmt, depth: int, low: list[Stmt], high: list[Stmt]) -> Stmt:
    """The box's nest `s` with its statement at `depth` between the `low` and `high` columns."""
    if depth == 0:
        return Block((*low, s, *high))
    match s:
        case For(body=body):
            return replace(s, body=Block((_beside(_only(body), depth - 1, low, high),)))
    raise ValueError(f"not a box's plain nest: {s!r}")


def _only(b: Block) -> Stmt:
    """A block's one statement, or the block (a loop's body spliced from a block)."""
    return b.body[0] if len(b.body) == 1 else b
