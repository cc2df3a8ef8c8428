"""tabled_points: lone points around a gather loop nest's box whose gathers are constant taps
(the corners of a bilinear gradient's planes: 9 taps each), run as one loop over tables of their
taps. A specialized copy of the body per corner cost numba as much to compile as an edge's loop.
runtime/gathers.py prints the loop and its tables.
"""
from __future__ import annotations

from halide_ad import config
from halide_ad.ir import Const, Load, dtype_of
from halide_ad.runtime.contract import factors
from halide_ad.solver.bounds import checked_at_run_time


def tabled_points(regions, dims, staged) -> list:
    """(region, its taps) for the regions among `regions` (Split.outside's (box, gathers) pairs)
    that are single points in `dims` and whose gathers are only constant times loads of one buffer
    at one leading index, the rest constants (`constant_taps`). Empty unless there are two or more,
    all reading the same buffer at the same leading index, and that buffer is not among `staged`
    (a plane kept in a local array), or where HALIDE_AD_SKIP names tabled_points."""
    if config.skipped("tabled_points"):
        return []
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
