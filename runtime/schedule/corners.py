"""tabled_points: lone points around a gather loop nest's box whose gathers are constant taps
(the corners of a bilinear gradient's planes: 9 taps each), run as one loop over tables of their
taps. A specialized copy of the body per corner cost numba as much to compile as an edge's loop.

`points_to_table` decides which regions (of Split.outside) qualify; the pass `tabled_points`
replaces their nests, among a gather loop nest's regions (each a nest around a `loops.Point` of
its region's gathers), by the loop over tables.
"""
from __future__ import annotations

from halide_ad.ir import INDEX_DTYPE, Const, Load, Op, Var, dtype_of
from halide_ad.runtime.contract import factors
from halide_ad.runtime.loops import Accumulate, Block, Chain, Element, For, Kind, Let, Local, Point, Table, block, walk
from halide_ad.runtime.schedule.driver import decision, said
from halide_ad.solver.bounds import checked_at_run_time


@decision(lambda points: "; ".join([f"{len(points)} point(s)", *(said(region) for region, _ in points)]))
def points_to_table(regions, dims, staged) -> list:
    """(region, its taps) for the regions among `regions` (Split.outside's (box, gathers) pairs)
    that are single points in `dims` and whose gathers are only constant times loads of one buffer
    at one leading index, the rest constants (`constant_taps`). Empty unless there are two or more,
    all reading the same buffer at the same leading index, and that buffer is not among `staged`
    (a plane kept in a local array)."""
    points = []
    for region, gs in regions:
        if not all(region[v][0] == region[v][1] for v in dims if v in region) or not gs:
            continue
        taps = constant_taps(gs)
        if taps is not None:
            points.append((region, taps))
    heads = {(t[0].buffer, t[0].index[:t[1]], t[0].dtype, t[1]) for _, taps in points for t in taps[:1]}
    if len(points) < 2 or len(heads) != 1 or next(iter(heads))[0] in staged:
        return []
    return points


def constant_taps(gs) -> list[tuple[Load, int, float]] | None:
    """(load, where its constant indices start, weight) for each load the gathers read, or None
    unless every piece is unguarded, loop-free, a constant times one load, and every load's index
    is the same leading expressions (no run-time check among them), then constants."""
    taps = []
    for g in gs:
        for p in g.pieces:
            f = None if p.loops or any(p.guards) else factors(p.value)
            if f is None or len(f[0]) != 1:
                return None
            (load,), scale = f
            lead = len(load.index)
            while lead and isinstance(load.index[lead - 1], Const):
                lead -= 1
            if (lead == len(load.index) or load.dtype != dtype_of(p.value)
                    or any(checked_at_run_time(e) for e in load.index[:lead])):
                return None
            taps.append((load, lead, scale))
    if not taps or len({(t[0].buffer, t[0].index[:t[1]], t[1]) for t in taps}) != 1:
        return None
    weights: dict[Load, float] = {}  # a load read by several gathers is one tap
    for load, _, scale in taps:
        weights[load] = weights.get(load, 0.0) + scale
    return [(load, taps[0][1], scale) for load, scale in weights.items()]


def tabled_points(s: Block, dims: tuple[Var, ...], staged) -> Block:
    """`s`, a gather loop nest's regions (one statement each, around the Point of its region's
    gathers), without the lone points whose gathers are constant taps (`points_to_table`'s choice
    of them, in `dims`; none reading a buffer of `staged`), which run after the rest as one loop
    over tables: each point's position in `dims`, and its taps' constant indices and weights,
    then a Point of the local `taps`, the sum of its taps. A point runs only its own count of
    taps: rows are padded to the longest, and a padding tap at weight 0 would still turn an inf
    it read into nan."""
    regions = [(dict(p.region), list(p.gathers)) for c in s.body for p in walk(c) if isinstance(p, Point)]
    if len(regions) != len(s.body):  # (not one Point per region: nothing this pass knows)
        return s
    chosen = points_to_table(regions, dims, staged)
    points = [(k, region, taps) for k, (region, _) in enumerate(regions) for r, taps in chosen if r is region]
    if not points:
        return s
    per_point = [taps for _, _, taps in points]
    load, lead, _ = per_point[0][0]
    width = max(len(taps) for taps in per_point)
    at = [v for v in dims if v in points[0][1]]
    tail = len(load.index) - lead
    where = Table(repr([[region[v][0] for v in at] for _, region, _ in points]), "int64")
    index = Table(repr([[[e.value for e in t[0].index[lead:]] for t in taps] + [[0] * tail] * (width - len(taps))
                        for taps in per_point]), "int64")
    weight = Table(repr([[t[2] for t in taps] + [0.0] * (width - len(taps)) for taps in per_point]), load.dtype)
    count = Table(repr([len(taps) for taps in per_point]), "int64")
    point, tap, taps = Local("point", INDEX_DTYPE), Local("tap", INDEX_DTYPE), Local("taps", load.dtype)

    def const(k: int) -> Const:
        return Const(k, INDEX_DTYPE)

    read = Element(load.buffer, load.index[:lead] + tuple(
        Element(index, (point, tap, const(k)), INDEX_DTYPE) for k in range(tail)), load.dtype, buffer=True)
    add = Accumulate(taps, Chain(Op.MUL, (read, Element(weight, (point, tap), load.dtype))), augmented=True)
    loop = For(point.name, 0, len(points), Kind.SERIAL, block(
        *(Let(v, Element(where, (point, const(k)), INDEX_DTYPE)) for k, v in enumerate(at)),
        Let(taps, Const(0, load.dtype)),
        For(tap.name, 0, Element(count, (point,), INDEX_DTYPE), Kind.SERIAL, block(add)),
        Point((), ((taps, 1.0),), load.dtype)))
    tabled = {k for k, _, _ in points}
    return Block(tuple(c for k, c in enumerate(s.body) if k not in tabled) + (loop,))
