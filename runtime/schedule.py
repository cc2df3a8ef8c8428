"""Scheduling: split each gather loop nest into an interior box and boundary strips.

At the boundary a gather needs its guards (`j == 0`) and clamped window bounds
(`range(max(j - 7, 0), min(j + 1, 3))`); inside, interval analysis decides every such guard and
picks one side of every min/max, so the interior loop has no per-element branch and constant
window loops that LLVM can unroll and vectorize.
"""
from __future__ import annotations

from dataclasses import replace

from halide_ad.ir import Bin, Const, Expr, Op, Range, Var, const, dtype_of, is_float
from halide_ad.solver import Gather, GatherPiece
from halide_ad.solver.bounds import interval
from halide_ad.solver.invert import piece_is_empty
from halide_ad.traverse import rewrite, simplify, walk

MAX_MARGIN = 8
Box = dict[Var, tuple[int, int]]  # inclusive ranges of the gather variables


def interior(new_vars: tuple[Var, ...], shape: tuple[int, ...], gathers: list[Gather]):
    """(box, the gathers specialized to it), or None when no useful interior exists.

    The box first grows margins until every boundary guard and min/max is decided; then, where a
    few more rows allow it, until every small quotient (the `(j + 1) // 30` of a mirror's mod) is
    one value, so those loops run exactly once and disappear from the interior.
    """
    extents = dict(zip(new_vars, shape, strict=True))
    margins = _grow({v: (0, 0) for v in new_vars}, extents, gathers, _boundary_terms)
    if margins is None or all(m == (0, 0) for m in margins.values()):
        return None  # no useful box, or no boundary at all: nothing to split
    margins = _grow(margins, extents, gathers,
                    lambda p, box: _boundary_terms(p, box) + _quotient_terms(p, box)) or margins
    box = _box(margins, extents)
    return box, [_specialize(g, box) for g in gathers]


def _box(margins, extents) -> Box:
    return {v: (lo, extents[v] - 1 - hi) for v, (lo, hi) in margins.items()}


def _grow(margins, extents, gathers, terms):
    """Margins, grown by one around each variable of an undecided term until none is left;
    None when the box empties or a margin passes MAX_MARGIN."""
    margins = dict(margins)
    while True:
        box = _box(margins, extents)
        if any(lo > hi for lo, hi in box.values()):
            return None
        undecided = [t for g in gathers for p in g.pieces for t in terms(p, box)]
        if not undecided:
            return margins
        for v in set().union(*(_vars(t) for t in undecided)) & margins.keys():
            margins[v] = (margins[v][0] + 1, margins[v][1] + 1)
            if max(margins[v]) > MAX_MARGIN:
                return None


def _vars(e: Expr) -> set[Var]:
    return {n for n in walk(e) if isinstance(n, Var)}


def _boundary_terms(p: GatherPiece, box: Box) -> list[Expr]:
    """Guards and min/max bounds over the gather variables alone that the box leaves open."""
    out = [g for g in p.guards[0] if _is_boundary(g, box) and not _decided(g, box)]
    for loop in p.loops:
        for bound in (loop.lo, loop.hi):
            terms = _minmax_args(bound)
            if len(terms) > 1 and _vars(bound) <= box.keys() and not _dominance_decided(bound, box):
                out += [t for t in terms if _vars(t)]
    return out


def _quotient_terms(p: GatherPiece, box: Box) -> list[Expr]:
    """Floor divisions in loop bounds that take two values over the box (and the outer loops'
    ranges): a mirror's period quotient, one value away from the edges. (A stride's quotient takes
    many values, and stays.)"""
    out = []
    ranges = dict(box)
    for loop in p.loops:
        for bound in (loop.lo, loop.hi):
            for n in walk(bound):
                if isinstance(n, Bin) and n.op is Op.FLOORDIV and _vars(n) & box.keys():
                    span = interval(n, ranges)
                    if span is not None and span[1] - span[0] == 1:
                        out.append(n)
        _enter(loop, ranges)
    return out


def _enter(loop: Range, ranges: Box) -> None:
    """Add the range of `loop`'s variable (over the ranges of the variables outside it)."""
    lo, hi = interval(_pick(loop.lo, ranges), ranges), interval(_pick(loop.hi, ranges), ranges)
    if lo is not None and hi is not None:
        ranges[loop.var] = (lo[0], hi[1] - 1)


def _is_boundary(g: Expr, box: Box) -> bool:
    """A linear guard on the gather variables (not a parity test, not a data-dependent one)."""
    return _vars(g) <= box.keys() and not any(isinstance(n, Bin) and n.op is Op.MOD for n in walk(g))


def _truth(g: Expr, box: Box) -> bool | None:
    match g:
        case Bin(Op.GE, e, Const(0)):
            span = interval(e, box)
            return None if span is None else True if span[0] >= 0 else False if span[1] < 0 else None
        case Bin(Op.EQ, e, Const(0)):
            span = interval(e, box)
            return None if span is None else True if span == (0, 0) else False if not span[0] <= 0 <= span[1] else None
    return None


def _decided(g: Expr, box: Box) -> bool:
    return _truth(g, box) is not None


def _minmax_args(e: Expr) -> list[Expr]:
    if isinstance(e, Bin) and e.op in (Op.MIN, Op.MAX):
        return _minmax_args(e.lhs) + _minmax_args(e.rhs)
    return [e]


def _pick(e: Expr, box: Box) -> Expr:
    """`e` with every min/max whose winner the box decides replaced by that winner."""
    if not (isinstance(e, Bin) and e.op in (Op.MIN, Op.MAX)):
        return e
    a, b = _pick(e.lhs, box), _pick(e.rhs, box)
    sa, sb = interval(a, box), interval(b, box)
    if sa is not None and sb is not None:
        if (e.op is Op.MAX and sa[0] >= sb[1]) or (e.op is Op.MIN and sa[1] <= sb[0]):
            return a
        if (e.op is Op.MAX and sb[0] >= sa[1]) or (e.op is Op.MIN and sb[1] <= sa[0]):
            return b
    return Bin(e.op, a, b)


def _dominance_decided(bound: Expr, box: Box) -> bool:
    return not (isinstance(_pick(bound, box), Bin) and _pick(bound, box).op in (Op.MIN, Op.MAX))


def _specialize(g: Gather, box: Box) -> Gather:
    pieces = []
    for p in g.pieces:
        p = _drop_single_loops(p, box)
        if p is None:
            continue
        truths = [_truth(c, box) if _is_boundary(c, box) else None for c in p.guards[0]]
        if False in truths:
            continue
        top = tuple(c for c, t in zip(p.guards[0], truths, strict=True) if t is None)
        loops = tuple(Range(r.var, _pick(r.lo, box), _pick(r.hi, box)) for r in p.loops)
        piece = replace(p, loops=loops, guards=(top,) + p.guards[1:])
        if not piece_is_empty(piece, box):
            pieces.append(piece)
    return replace(g, pieces=tuple(pieces))


def _fold(e: Expr, ranges: Box) -> Expr:
    """`e` with every integer sub-expression that the ranges pin to one value replaced by it."""
    def rule(n: Expr) -> Expr | None:
        if isinstance(n, Const) or dtype_of(n) == "bool" or is_float(dtype_of(n)):
            return None
        names = _vars(n)
        if not names or not names <= ranges.keys():
            return None
        span = interval(n, ranges)
        return const(span[0], dtype_of(n)) if span is not None and span[0] == span[1] else None
    return simplify(rewrite(e, rule))


def _drop_single_loops(p: GatherPiece, box: Box) -> GatherPiece | None:
    """`p` without the loops that run exactly once wherever the box puts j (their variable becomes
    a constant); None when one of them never runs."""
    ranges = dict(box)
    k = 0
    while k < len(p.loops):
        loop = p.loops[k]
        lo, hi = _fold(_pick(loop.lo, ranges), ranges), _fold(_pick(loop.hi, ranges), ranges)
        if not (isinstance(lo, Const) and isinstance(hi, Const)) or hi.value - lo.value > 1:
            _enter(loop, ranges)
            k += 1
            continue
        if hi.value <= lo.value:
            return None
        p = p.fixing(k, lo)
    return p


__all__ = ["interior"]
