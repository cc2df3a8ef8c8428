"""split_box: a gather loop nest's plain loops around a Point of its general gathers, split as the
Split that boundary.py's `interior` decides: one nest per region around the box, around a Point of
that region's specialized gathers (a thin region, under parallel_min_points points, serial), and
the box's loops around a Point of its own (`Split.inside`). The passes after it move and rewrite
these nests (`edge_columns`, `phases`, `separable`, `tabled_points`).
"""
from __future__ import annotations

from halide_ad.ir import INDEX_DTYPE, Const, Var
from halide_ad.runtime.loops import Block, For, Kind, Let, Point, Stmt, block
from halide_ad.runtime.schedule.parallel import perfect_loops, region_parallel


def split_box(s: Stmt, split, vars_: tuple[Var, ...], shape: tuple[int, ...]) -> Block:
    """`s`, the perfect loops over `vars_` (each over its whole extent in `shape`) around a Point
    of the general gathers, as a Block of the regions' Block (each region's loops, a loop of one
    point a Let, around a Point of its region) and the box's loops (each over the box's range,
    or the whole extent, of the same kind as `s`'s) around a Point of `split.inside`."""
    loops = perfect_loops(s)
    regions = []
    for region, gs in split.outside:
        ranges = {v: region.get(v, (0, n - 1)) for v, n in zip(vars_, shape, strict=True)}
        parallel = region_parallel(ranges)
        inner: Stmt = Point(tuple(gs), region=tuple(region.items()))
        for v, loop in reversed(list(zip(vars_, loops, strict=True))):
            lo, hi = ranges[v]
            if lo == hi:  # a loop of one point costs numba more to compile than the body
                inner = block(Let(v, Const(lo, INDEX_DTYPE)), inner)
            else:
                kind = loop.kind if parallel else Kind.SERIAL
                inner = For(loop.var, lo, hi + 1, kind, block(inner))
        regions.append(inner)
    box: Stmt = Point(tuple(split.inside))
    for v, loop, n in reversed(list(zip(vars_, loops, shape, strict=True))):
        lo, hi = split.box.get(v, (0, n - 1))
        box = For(loop.var, lo, hi + 1, loop.kind, block(box))
    return Block((Block(tuple(regions)), box))
