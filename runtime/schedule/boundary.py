"""Scheduling: split each gather loop nest into an interior box and boundary strips, and the
box's innermost dimension into phases.

At the boundary a gather needs its guards (`j == 0`) and clamped window bounds
(`range(max(j - 7, 0), min(j + 1, 3))`); inside, interval analysis decides every such guard and
picks one side of every min/max, so the interior loop has no per-element branch and constant
window loops that LLVM can unroll and vectorize. The points around the box are tiled into
regions, each edge row and column on its own where there are few (else one region per side), and
each region gets its own copy of the gathers, specialized the same way: at a repeat_edge border
the clamped windows fold to constant taps, and a boundary point costs what an interior one does.

A stride s leaves `(j - r) // s` and parity tests in the gathers, whose windows change with
j % s. Inside the box the innermost j runs as `j = s*q + p` with each phase p emitted on its own:
every such quotient becomes `q + constant`, every parity test is decided, and a 2x2/2 pooling
gradient becomes four straight-line writes per window.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field, replace

from halide_ad import config

from halide_ad.ir import (COMPARISONS, INDEX_DTYPE, Bin, Call, Const, Expr, Load, Op, Range, Select, Var, const, dtype_of,
                          is_float)
from halide_ad.runtime.contract import factors
from halide_ad.runtime.schedule.driver import decision, said_split
from halide_ad.solver import Gather, GatherPiece
from halide_ad.affine import Affine, linear_form
from halide_ad.solver.bounds import interval, is_data_dependent
from halide_ad.solver.invert import piece_is_empty
from halide_ad.traverse import larger_than, rewrite, simplify, substitute, walk

MAX_MARGIN = 8
MAX_PHASES = 4  # each phase is a copy of the loop body
MAX_NODES = 4000  # in all gathers: past it, splitting costs more than it saves (div/mod towers)
Box = dict[Var, tuple[int, int]]  # inclusive ranges of the gather variables


@dataclass(frozen=True)
class Split:
    """A gather loop nest's schedule: the `box` runs `inside` (specialized gathers), the rest runs
    the general ones. With phases, each `phased` dimension d of the box (the innermost one or
    two) runs as j_d = strides[d]*q_d + p_d (q_d = phase_vars[d]), and the phase combination
    (p_d, ...) runs `phases[(p_d, ...)]`, whose gathers are written in the q's."""
    box: Box
    inside: list[Gather]
    phased: tuple[Var, ...] = ()
    strides: tuple[int, ...] = ()
    phase_vars: tuple[Var, ...] = ()
    phases: dict[tuple[int, ...], list[Gather]] = field(default_factory=dict)
    outside: tuple[tuple[Box, list[Gather]], ...] = ()  # regions around the box, each specialized
    separable: Separable | None = None  # `inside` as two passes, where its window allows


@dataclass(frozen=True)
class Separable:
    """Gathers that are one weighted window over the last two dimensions (i, j) whose weights
    are an outer product: out[..., i, j] += sum_r rows[r] * sum_c cols[c] * src[lead..., a*i + r,
    b*j + c] (a bilinear or box filter's gradient). Run as two passes, columns of each source row
    first, into a temporary, a point costs len(rows) + len(cols) multiply-adds, not their product."""
    src: Load  # one of the window's loads: its buffer, leading index (lead...) and location
    row_stride: int
    col_stride: int
    rows: tuple[tuple[int, float], ...]
    cols: tuple[tuple[int, float], ...]


@decision(said_split)
def interior(new_vars: tuple[Var, ...], shape: tuple[int, ...], gathers: list[Gather]) -> Split | None:
    """How to split the loop nest, or None when neither a box nor phases would help.

    The box first grows margins until every boundary guard and min/max is decided; then, where a
    few more rows allow it, until every small quotient (the `(j + 1) // 30` of a mirror's mod) is
    one value, so those loops run exactly once and disappear from the interior.
    HALIDE_AD_SKIP=interior leaves every nest unsplit.
    """
    if not new_vars or config.skipped("interior"):
        return None  # a 0-d adjoint: one point, nothing to split
    if _larger_than(gathers, MAX_NODES):
        return None  # the general loop nest is right, and rewriting it would take longer than it runs
    extents = dict(zip(new_vars, shape, strict=True))
    margins = _grow({v: (0, 0) for v in new_vars}, extents, gathers, _boundary_terms)
    if margins is None:
        return None
    margins = _grow(margins, extents, gathers,
                    lambda p, box: _boundary_terms(p, box) + _quotient_terms(p, box)) or margins
    box = _box(margins, extents)
    split = _phases(Split(box, [_specialize(g, box) for g in gathers]), new_vars)
    unbounded = not split.phased and all(m == (0, 0) for m in margins.values())
    if unbounded and (len(new_vars) < 2 or _larger_than(gathers, MAX_SEPARABLE_NODES)):
        return None  # no boundary and no stride: nothing to split, unless the window is separable
    # windows are written out last: every piece of the phases costs z3 a query
    inside = [_unroll(_substitute_gather(g, {})) for g in split.inside]
    separable = None if split.phased or len(new_vars) < 2 else _separable(inside, *new_vars[-2:])
    if unbounded and separable is None:
        return None
    return replace(split, inside=inside, outside=_outside(split.box, extents, gathers), separable=separable)


def _separable(gathers: list[Gather], i: Var, j: Var) -> Separable | None:
    """The gathers as a Separable window over (i, j), or None: every term a constant times one
    load of the same buffer at (lead..., a*i + r, b*j + c), and the weights of rank one."""
    weights: dict[tuple[int, int], float] = {}
    src, strides = None, None
    pieces = [p for g in gathers for p in _unroll(g, MAX_SEPARABLE_TERMS).pieces]
    if len(pieces) > MAX_SEPARABLE_TERMS or any(p.loops or any(p.guards) for p in pieces):
        return None
    for p in pieces:
        f = factors(p.value)
        if f is None or len(f[0]) != 1:
            return None
        (load,), scale = f
        forms = [linear_form(e) for e in load.index[-2:]]
        if (len(load.index) < 2 or None in forms or set(forms[0][0]) != {i} or set(forms[1][0]) != {j}
                or any(v in (i, j) for e in load.index[:-2] for v in _vars(e))):
            return None
        if src is None:
            src, strides = load, (forms[0][0][i], forms[1][0][j])
        if (load.buffer, load.index[:-2]) != (src.buffer, src.index[:-2]) or \
                (forms[0][0][i], forms[1][0][j]) != strides or min(strides) < 1:
            return None
        at = (forms[0][1], forms[1][1])
        weights[at] = weights.get(at, 0.0) + scale
    if src is None or not any(weights.values()):  # (taps that cancel: nothing to factor)
        return None
    r0, c0 = max(weights, key=lambda k: abs(weights[k]))
    rows = {r: weights.get((r, c0), 0.0) for r, _ in weights}
    cols = {c: weights.get((r0, c), 0.0) / weights[r0, c0] for _, c in weights}
    big = abs(weights[r0, c0])
    strided = strides[1] > 1 and len(cols) > 1  # the rows pass reads each source row once, in order
    if (len(rows) * len(cols) < 2 * (len(rows) + len(cols)) and not strided) or any(
            abs(weights.get((r, c), 0.0) - u * v) > 1e-12 * big for r, u in rows.items() for c, v in cols.items()):
        return None  # too few terms saved to pay for the temporary's traffic (a 3x3 box), or not of rank one
    return Separable(src, strides[0], strides[1], tuple(sorted(rows.items())), tuple(sorted(cols.items())))


MAX_SEPARABLE_TERMS = 256  # terms of a window, its loops written out, that _separable looks at
MAX_SEPARABLE_NODES = 400  # a loop nest with no box or phases is only looked at for a window this small


MAX_REGIONS = 8  # each region around the box is a copy of the loop body


def _outside(box: Box, extents: dict[Var, int], gathers: list[Gather]) -> tuple[tuple[Box, list[Gather]], ...]:
    """The regions around the box, each with its gathers specialized to it; none (the general
    gathers run there) unless every guard and window bound folds, as they do at a repeat_edge
    border. A mirror's period quotients do not: there the copies would only be longer to compile."""
    outside = tuple((r, [_unroll(_at(_specialize(g, r), r)) for g in gathers]) for r in _regions(box, extents))
    gs = [(r, g) for r, region in outside for g in region]
    if (_larger_than([g for _, g in gs], MAX_NODES)
            or any(_boundary_terms(p, r) for r, g in gs for p in g.pieces)):
        return ()
    return outside


def _regions(box: Box, extents: dict[Var, int]) -> list[Box]:
    """Boxes that tile the points outside `box`: each edge row or column on its own, where there
    are few enough, so that every guard and window bound of the boundary folds to a constant and
    a boundary point costs what an interior one does; else one region per side."""
    def segments(v: Var, single: bool) -> list[tuple[int, int]]:
        (lo, hi), n = box[v], extents[v]
        if single:
            return [(c, c) for c in range(lo)] + [(lo, hi)] + [(c, c) for c in range(hi + 1, n)]
        return [s for s in ((0, lo - 1), (lo, hi), (hi + 1, n - 1)) if s[0] <= s[1]]

    single = math.prod(len(segments(v, True)) for v in box) - 1 <= MAX_REGIONS
    combos = itertools.product(*(segments(v, single) for v in box))
    return [dict(zip(box, c, strict=True)) for c in combos if any(s != box[v] for v, s in zip(box, c, strict=True))]


def _at(g: Gather, region: Box) -> Gather:
    """`g` with the variables that `region` pins to one value replaced by it."""
    return _substitute_gather(g, {v: const(lo, INDEX_DTYPE) for v, (lo, hi) in region.items() if lo == hi})


def _phases(split: Split, new_vars: tuple[Var, ...]) -> Split:
    """`split` with its innermost one or two dimensions in phases, where the inside gathers
    divide them (at most MAX_PHASES copies of the body)."""
    phased, strides = [], []
    for j in reversed(new_vars[-2:]):
        stride = _stride(split.inside, j)
        lo, hi = split.box[j]
        if stride == 1 or math.prod(strides) * stride > MAX_PHASES or (hi + 1) // stride <= -(-lo // stride):
            break  # the outer of the two only joins when the inner one is phased
        phased.insert(0, j)
        strides.insert(0, stride)
    if not phased:
        return split
    box, ranges, q_vars = dict(split.box), dict(split.box), []
    for j, stride in zip(phased, strides, strict=True):
        lo, hi = split.box[j]
        q_lo, q_hi = -(-lo // stride), (hi + 1) // stride - 1  # whole periods inside the box
        q = Var(j.name + "_q")
        q_vars.append(q)
        box[j] = (q_lo * stride, q_hi * stride + stride - 1)
        del ranges[j]
        ranges[q] = (q_lo, q_hi)
    phases = {}
    for combo in itertools.product(*(range(s) for s in strides)):
        env = {j: Bin(Op.ADD, Bin(Op.MUL, const(s), q), const(p))
               for j, s, q, p in zip(phased, strides, q_vars, combo, strict=True)}
        phases[combo] = [_unroll(_substitute_gather(_specialize(_substitute_gather(g, env), ranges), {}))
                         for g in split.inside]
    return Split(box, split.inside, tuple(phased), tuple(strides), tuple(q_vars), phases)


MAX_UNROLLED = 9  # straight-line terms one window may become


def _unroll(g: Gather, budget: int = MAX_UNROLLED) -> Gather:
    """`g` with each window loop of a constant trip count written out as straight-line terms
    (a phase of a 3x3/2 pool reads 1, 2 or 4 neighbours): their loads then depend on q alone,
    so the phases of one iteration share them."""
    pieces: list[GatherPiece] = []
    for p in g.pieces:
        pieces += _unrolled(p, budget)
    if len(pieces) == len(g.pieces) and all(a is b for a, b in zip(pieces, g.pieces)):
        return g  # nothing written out
    # a written-out tap is a constant in a parity test, (4*q + 1) % 2: fold it
    return _substitute_gather(replace(g, pieces=tuple(pieces)), {})


def _unrolled(p: GatherPiece, budget: int) -> list[GatherPiece]:
    if not p.loops:
        return [p]
    trips = linear_form(simplify(Bin(Op.SUB, p.loops[0].hi, p.loops[0].lo)))
    if trips is None or any(trips[0].values()) or not 1 <= trips[1] <= budget:
        return [p]
    count = trips[1]
    out = []
    for t in range(count):
        lo = simplify(Bin(Op.ADD, p.loops[0].lo, const(t, INDEX_DTYPE)))
        out += _unrolled(p.fixing(0, _divide(lo)), budget // count)
    return out


def _stride(gathers: list[Gather], j: Var) -> int:
    """The lcm of the periods in j of the floor divisions and mods by constants in the gathers.
    `(a*j + e) // d` has period d / gcd(a, d): `(2*j + t + 1) % 2`, a bilinear weight's parity
    test, does not change with j, and phases for it would only make the loads strided."""
    stride = 1
    for g in gathers:
        for p in g.pieces:
            for e in piece_exprs(p):
                for n in walk(e):
                    if (isinstance(n, Bin) and n.op in (Op.FLOORDIV, Op.MOD) and isinstance(n.rhs, Const)
                            and j in _vars(n.lhs)):
                        period = _period(n.lhs, j, n.rhs.value)
                        if math.lcm(stride, period) <= MAX_PHASES:
                            stride = math.lcm(stride, period)
    return stride


def _period(e: Expr, j: Var, divisor: int) -> int:
    form = linear_form(e)
    return divisor if form is None else divisor // math.gcd(form[0].get(j, 0), divisor)


def _larger_than(gathers: list[Gather], nodes: int) -> bool:
    """More than `nodes` nodes in all the expressions of all the gathers' pieces."""
    return larger_than((e for g in gathers for p in g.pieces for e in piece_exprs(p)), nodes)


def piece_exprs(p: GatherPiece):
    """Every expression a gather piece evaluates: its value, guards and loop bounds."""
    yield p.value
    for level in p.guards:
        yield from level
    for loop in p.loops:
        yield loop.lo
        yield loop.hi


def _substitute_gather(g: Gather, env: dict[Var, Expr]) -> Gather:
    # simplified again after dividing: a test that folds to a constant folds its select
    sub = lambda e: simplify(_divide_indices(simplify(substitute(e, env))))
    pieces = tuple(GatherPiece(tuple(Range(r.var, sub(r.lo), sub(r.hi)) for r in p.loops),
                               tuple(tuple(sub(c) for c in level) for level in p.guards), sub(p.value),
                               tuple((v, sub(e)) for v, e in p.solution), p.single)
                   for p in g.pieces)
    return replace(g, pieces=pieces)


def _divide_indices(e: Expr) -> Expr:
    """`_divide` applied to the integer parts of `e`: the whole of an expression without loads
    (an index, a bound, a parity test), else each load's index and each select's test. (Values
    can be large; their float arithmetic has nothing to divide.)"""
    def rule(n: Expr) -> Expr | None:
        if isinstance(n, Load):
            return replace(n, index=tuple(_divide(i) for i in n.index))
        if isinstance(n, Select) and not is_data_dependent(n.cond):
            return replace(n, cond=_divide(n.cond))
        if isinstance(n, Bin) and n.op in COMPARISONS:  # `2 * q + 1 - 2 * q == arg[...]`
            return Bin(n.op, *(side if is_data_dependent(side) else _divide(side) for side in (n.lhs, n.rhs)))
        return None
    return _divide(e) if not is_data_dependent(e) else rewrite(e, rule)


def _divide(e: Expr) -> Expr:
    """`(k*a + c) // k` as `a + c // k` and `(k*a + c) % k` as `c % k`, for linear a; and every
    linear integer expression in the canonical form `2 * q + 1` (`-2*q + 2*q` is 0)."""
    def rule(n: Expr) -> Expr | None:
        if ((isinstance(n, Bin) and n.op in (Op.ADD, Op.SUB, Op.MUL)) or (isinstance(n, Call) and n.fn == "neg")) \
                and dtype_of(n) == INDEX_DTYPE:
            form = linear_form(n)
            return None if form is None else Affine.of(*form).to_expr()
        if not (isinstance(n, Bin) and n.op in (Op.FLOORDIV, Op.MOD) and isinstance(n.rhs, Const)
                and isinstance(n.rhs.value, int) and n.rhs.value > 0):
            return None
        form = linear_form(n.lhs)
        k = n.rhs.value
        if form is None or any(c % k for c in form[0].values()):
            return None
        coeffs, c = form
        if n.op is Op.MOD:
            return const(c % k, dtype_of(n))
        out: Expr = const(c // k, dtype_of(n))
        for v, a in coeffs.items():
            out = Bin(Op.ADD, out, Bin(Op.MUL, const(a // k, dtype_of(n)), v))
        return simplify(out)
    return simplify(rewrite(e, rule))


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
        growing = set().union(*(_vars(t) for t in undecided)) & margins.keys()
        if not growing:  # a term no margin decides (a test of constants left unfolded): no split
            return None
        for v in growing:
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
    return _vars(g) <= box.keys() and not any(
        (isinstance(n, Bin) and n.op is Op.MOD) or isinstance(n, Load) for n in walk(g))


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
        trips = linear_form(simplify(Bin(Op.SUB, hi, lo)))
        if trips is None or any(trips[0].values()) or trips[1] > 1:
            _enter(loop, ranges)
            k += 1
            continue
        if trips[1] <= 0:
            return None
        p = p.fixing(k, lo)
    return p


__all__ = ["interior"]


def cut_dims(vars_, shape, split: Split | None) -> list[int]:
    """The dimensions that the split's box or phases cut."""
    if split is None:
        return []
    return [d for d, v in enumerate(vars_) if v in split.box and (split.box[v] != (0, shape[d] - 1) or v in split.phased)]


def box_ranges(vars_, shape, split: Split) -> dict[Var, tuple[int, int]]:
    """Inclusive ranges of the gather variables and the phase variables inside the box."""
    ranges = {v: split.box.get(v, (0, n - 1)) for v, n in zip(vars_, shape, strict=True)}
    for j, stride, q in zip(split.phased, split.strides, split.phase_vars, strict=True):
        lo, hi = split.box[j]
        ranges[q] = (lo // stride, (hi + 1) // stride - 1)
    return ranges
