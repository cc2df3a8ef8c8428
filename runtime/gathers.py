"""The gradient's gather loop nests, built whole as loop-nest data (runtime/loops.py) as the decisions
of runtime/schedule/ say (runtime/kernels.py drives); runtime/emit.py prints them.

A gather loop nest without a Split is one perfect nest, whose parallel loop the choose_parallel pass
picks. One with a Split (schedule/boundary.py) is built as a plain nest around a `loops.Point` of
its gathers (not yet built) that passes rewrite: the interior box's loops and each region's, each
around a Point of its own specialized gathers (`split_box`, schedule/regions.py), the edge columns
inside the box's row loop (`edge_columns`, schedule/columns.py), a strided dimension in phases
(`phases`, schedule/strided.py), a separable window as two passes over a ring of rows (`separable`,
schedule/separable.py), an adjoint's box whose windows read along its last dimension a row at a
time, each tap added to the whole row (`tap_rows`, schedule/tap_rows.py), the corners whose gathers
are constant taps as one loop over tables (`tabled_points`, schedule/corners.py); `expand_points`
then builds each Point's statements. Loads read once per iteration are hoisted (schedule/hoist.py:
`hoist` and `reading` rewrite the iteration's statements); an adjoint whose windows walk memory
along its last dimension runs a row at a time, in column blocks when it is 1-D (schedule/rows.py,
`row_gathers`). A point's guarded pieces follow its sums, the reductions inside them computed before
(`lift_reductions`); the weighted sums are flat `Chain` expressions (`(h1 + h2) * f32_2`). A box
without regions runs the general gathers' plain nest only outside it (the `outside_box` pass,
schedule/spans.py).
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

from halide_ad.ir import INDEX_DTYPE, Bin, Const, Expr, Load, Op, Reduce, Var
from halide_ad.runtime import lower, schedule
from halide_ad.runtime.emit import Emitter
from halide_ad.runtime.loops import (Accumulate, Allocate, Block, Chain, Comment, Element, For, Kind, Let, Local, Point,
                                     Spans, Stmt, Store, block, map_exprs, nest, walk, weighted_sums)
from halide_ad.runtime.lower import accumulator_dtype
from halide_ad.runtime.schedule import rows
from halide_ad.runtime.schedule.accumulate import split_accumulators
from halide_ad.runtime.schedule.boundary import box_ranges, cut_dims
from halide_ad.runtime.schedule.corners import tabled_points
from halide_ad.runtime.schedule.columns import edge_columns
from halide_ad.runtime.schedule.hoist import hoist_loads, reading
from halide_ad.runtime.schedule.parallel import choose_parallel, parallel_dim
from halide_ad.runtime.schedule.regions import split_box
from halide_ad.runtime.schedule.separable import separable, separable_window
from halide_ad.runtime.schedule.spans import outside_box
from halide_ad.runtime.schedule.strided import phases
from halide_ad.runtime.schedule.tap_rows import tap_rows
from halide_ad.traverse import map_children


def _kind(parallel: bool) -> Kind:
    return Kind.PARALLEL if parallel else Kind.SERIAL


def split_loop_nest(em: Emitter, vars_, shape, split, body, gathers, written: str, opened: int = 0,
                    terms: float = 1, adjoint=None, staged: frozenset[str] = frozenset()) -> Stmt:
    """The loop nest over `vars_` running `body(gathers)`, or, with a Split, one nest per region
    around the box running that region's specialized gathers (`split_box`; or, without regions,
    one over all the points outside the box running the general gathers), then one over the box
    running `split.inside`, or each phase's gathers with the phased dimensions as
    j = stride*q + p (`phases`). The regions beside the box in its last dimension only run inside
    the box's loop, next to each row's interior (`edge_columns`). `body` builds a point's
    statements, once per region and once per phase (`expand_points`). The loops over the first
    `opened` dimensions are open already (outside the nest returned); `terms` is the gathers'
    terms per point. `adjoint`: the Adjoint the nest writes, whose box's windows may run a row of
    the last dimension at a time (`tap_rows`); None for a forward definition's. `staged`: the
    buffers a pass reads a plane at a time (`stage_plane`)."""
    par = parallel_dim(shape, terms)
    dims = cut_dims(vars_, shape, split)
    box = {vars_[d]: split.box[vars_[d]] for d in dims}
    if not dims and (split is None or split.separable is None):
        # one perfect nest: choose_parallel picks its loop (inside loops already open, none is)
        nest_ = _full_loops(em, vars_, shape, range(opened, len(vars_)), None, body(gathers))
        return nest_ if opened else schedule.run(choose_parallel, nest_, terms)
    first, last = (dims[0], dims[-1]) if dims else (len(vars_) - 2, len(vars_) - 2)  # else a whole separable window
    outer = [(em.name(vars_[d]), 0, shape[d], _kind(d == par)) for d in range(opened, first)]
    i = len(vars_) - 2  # a separable window runs the last two dimensions
    two_passes = separable_window(split, shape, first, par)

    def build(point: Point) -> Stmt:
        """A point's statements: a region's with its loads read once at the top of its iteration;
        each read as the Point's `reads` says."""
        gs = list(point.gathers)
        if point.region:
            region = dict(point.region)
            ranges = {v: region.get(v, (0, n - 1)) for v, n in zip(vars_, shape, strict=True)}
            s = schedule.run(hoist_loads, body(gs), gs, ranges, em.shapes, written)
        else:
            s = body(gs, dict(point.at) or None, terms=list(point.terms), terms_dtype=point.terms_dtype)
        return reading(s, dict(point.reads))

    # the plain nest over the box's dimensions, split into its regions' nests and the box's
    general = _full_loops(em, vars_, shape, range(first, len(vars_)), par, Point(tuple(gathers)))
    split_ = schedule.run(split_box, general, split, vars_[first:], shape[first:])
    if not isinstance(split_, Block):  # (skipped: the general gathers run at every point)
        return nest(outer, expand_points(split_, build))
    regions, box_ = split_.body
    for q in split.phase_vars:
        em.name(q)
    if two_passes:  # (serial loops over i and j: separable_window's condition)
        # the box runs before the regions around it, which then find the rows it read in cache: a
        # bilinear gradient's edges ran 2.5 ms faster after its interior than before it (other
        # boxes ran as fast or slightly faster after)
        box_ = _window_loops(box_, vars_[i:])
        out = [expand_points(schedule.run(separable, box_, split.separable, em.temp("window")), build)]
        around = regions
    else:
        n = len(vars_) - 1
        if n != par and not split.phased and adjoint is not None and not wide_gathers(split.inside, adjoint):
            box_ = schedule.run(tap_rows, box_, vars_[n], tuple(vars_), written, adjoint.dtype)
        # the regions beside the box in its last dimension only (a plane's edge columns) run
        # inside the box's loop over the dimension before it, while that row is in cache
        around, box_ = schedule.run(edge_columns, Block((regions, box_)),
                                    tuple((vars_[d], box[vars_[d]]) for d in dims), last - first).body
        out = []
    # lone points (a plane's corners) whose gathers are constant taps share one loop over tables
    # of their taps
    out += expand_points(schedule.run(tabled_points, around, vars_[first:], staged), build).body
    if not split.outside and any(box[vars_[d]] != (0, shape[d] - 1) for d in dims):
        # no regions: the plain nest's Point of the general gathers runs outside the box
        inside = tuple((em.name(vars_[d]), *box[vars_[d]]) for d in dims if d < last)
        out.append(expand_points(schedule.run(outside_box, general, em.name(vars_[last]), box[vars_[last]], inside),
                                 build))
    if not two_passes:
        if split.phased:
            names = {v: em.name(v) for v in (*vars_[first:], *split.phase_vars)}
            box_ = schedule.run(phases, box_, split, names, box_ranges(vars_, shape, split), em.shapes, written)
            for s in walk(box_):  # (a phased row's aliases, named before the columns' loops print)
                if isinstance(s, Let) and type(s.var) is Var:
                    em.name(s.var)
        out.append(expand_points(box_, build))
    return nest(outer, block(*out))


def _window_loops(s: Stmt, window: tuple[Var, Var]) -> Stmt:
    """The box's nest `s` with its last two loops over the `window`'s variables (the separable
    pass reads them as expressions)."""
    match s:
        case For(body=Block((For(body=Block((Point(),))) as inner,))):
            return replace(s, var=window[0], body=Block((replace(inner, var=window[1]),)))
        case For(body=Block((inner,))):
            return replace(s, body=Block((_window_loops(inner, window),)))
    return s


def expand_points(s: Stmt, build: Callable[[Point], Stmt]) -> Stmt:
    """`s` with each Point's statements built (`build(point)`), in the order they print."""
    match s:
        case Point():
            return build(s)
        case Block(stmts):
            return block(*(expand_points(c, build) for c in stmts))
        case For(body=inner) | Spans(body=inner):
            return replace(s, body=block(expand_points(inner, build)))
    return s


def _full_loops(em: Emitter, vars_, shape, dims, par, inner: Stmt) -> Stmt:
    """`inner` in a loop over the whole extent of each of `dims`."""
    return nest([(em.name(vars_[d]), 0, shape[d], _kind(d == par)) for d in dims], inner)


def point_start(like: dict[tuple[Load, ...], float], terms, terms_dtype: str | None, seed: Expr | None,
                dtype: str) -> tuple[Expr, list[Expr]]:
    """A point's first term and the sums added to it after (`weighted_sums` of the `like`
    products and the `terms`): the cotangent `seed` of a seeded adjoint, else the first sum where
    it is of the adjoint's `dtype` (the terms' may not be), else zero."""
    sums = weighted_sums([(lower.product(loads), scale) for loads, scale in like.items()] + list(terms), dtype)
    first = seed if seed is not None else sums.pop(0) if like or sums and terms_dtype == dtype else Const(0, dtype)
    return first, sums


def gather_statements(g, like: dict[tuple[Load, ...], float], dtype: str, acc_dtype: str) -> list[Stmt]:
    """The gather's comment and pieces, but those read unconditionally as a constant times loads of
    `dtype`: these go into `like`, the constant summed per product of loads, which the caller
    adds once (`h4 * f32_1 * f32_2 + h4 * f32_1 * f32_1` is one product and one add: a region of
    a bilinear gradient reads each load in up to four gathers, and numba's compile time grows
    with every operation). A long innermost loop adds into LANES partial sums
    (`split_accumulators`)."""
    out: list[Stmt] = [lower.describe(g)]
    for piece in g.pieces:
        if (key := lower.constant_product(piece, dtype)) is not None:
            like[key[0]] = like.get(key[0], 0.0) + key[1]
            continue
        out.append(schedule.run(split_accumulators, block(lower.gather_piece(piece, Local("acc", acc_dtype)))))
    return out


def lift_reductions(s: Stmt, temp: Callable[[str], str]) -> tuple[list[Stmt], Stmt]:
    """(the loops computing each reduction inside `s`'s expressions into a local `temp("red")`,
    `s` reading those locals instead): a point's guarded pieces compute their reductions before
    the point's sums, outside their guards. Reductions are met in the order they print."""
    lifted: list[Stmt] = []

    def expr(e):
        if isinstance(e, Reduce):
            acc = lower.accumulator(e, temp("red"))
            lifted.append(schedule.run(split_accumulators, lower.accumulation(e, acc)))
            return acc
        return map_children(e, expr) if isinstance(e, Expr) else e

    s = map_exprs(s, expr)  # (before `lifted` is read: the walk fills it)
    return lifted, s


def gather_terms(gathers, shape: tuple[int, ...]) -> float:
    """How many terms the gathers add per element on average: their scatters' points over the
    adjoint's elements (a bias's gradient sums a whole batch per element, a pooling window's a
    few)."""
    return sum(math.prod(r.hi - r.lo for r in g.scatter.domain) for g in gathers) / max(1, math.prod(shape))


def wide_gathers(gs, adj) -> bool:
    """Whether the gathers' sum accumulates in float64 (`accumulator_dtype`)."""
    return accumulator_dtype("sum", adj.dtype, gather_terms(gs, adj.shape)) != adj.dtype


def row_gathers(plan, gathers, name: str, temp: Callable[[str], str]) -> Stmt:
    """An adjoint's rows, one at a time: the cotangent and the terms without a window, then each
    window's loops with the row's loop inside them, so that every read walks memory in order.
    Each element adds its terms in the same order as one element at a time would. A float64
    accumulator is a row of its own, a local array named `temp("row")`, allocated once per
    parallel iteration (once in all, serially); else the adjoint's row accumulates in place."""
    adj, vars_, shape = plan.adjoint, plan.new_vars, plan.adjoint.shape
    pieces = [p for g in gathers for p in g.pieces]
    dtype = "float64" if wide_gathers(gathers, adj) else adj.dtype
    k, n = vars_[-1], shape[-1]
    row = None if dtype == adj.dtype else temp("row")
    terms = gather_terms(gathers, shape) * n
    col_lo, col_hi = 0, n  # the columns the row's loops run
    blocks = rows.column_blocks(shape, terms)
    if blocks is None:
        acc = Load(name, vars_, adj.dtype) if row is None else Element(row, (k,), dtype)
        par = parallel_dim(shape[:-1], terms)
        allocate = Allocate(row, (n,), dtype) if row is not None else None
        outer = [(v, 0, shape[d], Kind.PARALLEL if d == par else Kind.SERIAL, allocate if d == par else None)
                 for d, v in enumerate(vars_[:-1])]
        first_allocate = allocate if par is None else None
    else:  # a 1-D adjoint (a gain's or a bias's): blocks of columns in parallel
        width, lo = -(-n // blocks), Local(temp("col"), INDEX_DTYPE)
        col_lo, col_hi = lo, Bin(Op.MIN, Chain(Op.ADD, (lo, Const(width, INDEX_DTYPE))), Const(n, INDEX_DTYPE))
        start = Let(lo, Chain(Op.MUL, (Local(f"{lo.name}_block", INDEX_DTYPE), Const(width, INDEX_DTYPE))))
        allocate = Allocate(row, (width,), dtype) if row is not None else None
        outer = [(f"{lo.name}_block", 0, blocks, Kind.PARALLEL, block(start, allocate) if allocate else start)]
        first_allocate = None
        acc = Load(name, vars_, adj.dtype) if row is None else Element(row, (Chain(Op.SUB, (k, lo)),), dtype)

    def along_row(s: Stmt) -> For:
        """`s` in a loop over the row's columns (an inline reduction's loops go inside it too)."""
        return For(k, col_lo, col_hi, Kind.SERIAL, block(s))

    first = [Load("ct_" + adj.buffer, vars_, adj.dtype)] if adj.seeded else []
    first += [p.value for p in pieces if not p.loops]
    start_row = Chain(Op.ADD, tuple(first)) if first else Const(0, adj.dtype)
    out: list[Stmt] = [along_row(Store(name, vars_, start_row) if row is None else Let(acc, start_row))]
    for g in gathers:
        out.append(lower.describe(g))
        for p in g.pieces:
            if p.loops:
                out.append(nest([(loop.var, loop.lo, loop.hi, Kind.SERIAL) for loop in p.loops],
                                along_row(Accumulate(acc, p.value))))
    if row is not None:
        out.append(along_row(Store(name, vars_, acc)))
    body: Stmt = block(*out)
    for var, lo_, hi_, kind, top in reversed(outer):
        body = For(var, lo_, hi_, kind, block(top, body) if top else block(body))
    return block(first_allocate, body) if first_allocate else body


def scatter(f, adj_name: str, dtype: str) -> Stmt:
    """Fallback `f`'s scatter into the adjoint `adj_name` of `dtype`, after comments naming it."""
    return block(lower.describe(f), Comment(f"kept as a scatter: {f.reason}"), lower.scatter(f, adj_name, dtype))
