"""The interpreter tier's separable windows: a Func, or an adjoint's scatters, whose taps are a
window of rows times a window of columns runs as two passes of `vectorized.py`, one axis into a
temporary, then the other. A bilinear resize's forward then costs 2 + 2 taps a point, not 2 x 2,
and its gradient's four scatters become two along each axis; a 3x3 blur, 3 + 3 taps, not 9.

A window is found on the IR as written, per axis pair (the last two of the window's index):
the body is multiplied out into terms, each term one load of the windowed buffer times factors
that depend on that load's row index's variables alone or on its column index's alone (a
scatter's terms also share a seed, the adjoint they spread); the terms must be every pairing of
one row tap with one column tap, each once (weights of rank one, as `schedule/boundary.py`'s
`Separable` asks of the compiled path's gathers: that analysis reads the solver's gathers, with
constant weights inside a box, which a first call has not computed). The passes are a Func or a
Scatter each, so phases, clamped reads and pieces run as they do for any other. Sums reassociate:
the two tiers agree to the rounding of sums, as everywhere on the interpreter.
"""
from __future__ import annotations

import math

import numpy as np

from halide_ad import config
from halide_ad.ir import Bin, Cast, Expr, Func, Load, Op, Range, Reduce, Scatter, Var, dtype_of, is_float
from halide_ad.runtime import buffers as memory, vectorized
from halide_ad.traverse import free_vars

MAX_TERMS = 16  # terms of a body multiplied out, beyond which it is no window
GAIN = 0.8  # the two passes run where they cost at most this much of the taps taken together

Key = tuple[Expr, tuple[Expr, ...]]  # one axis's tap: (its index, its weights)


def func(f: Func, buffers: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray | None]:
    """`vectorized.func`, a separable window as its two passes."""
    passes = split_func(f, {name: np.shape(a) for name, a in buffers.items()})
    if passes is None:
        return vectorized.func(f, buffers)
    first, second = passes
    temporary, _ = vectorized.func(first, buffers)
    return vectorized.func(second, buffers | {first.name: temporary})


def scatters(group: tuple[Scatter, ...], adj: np.ndarray, buffers: dict[str, np.ndarray]) -> None:
    """`vectorized.scatter` of each of an adjoint's scatters, as `scatter_plan` groups them."""
    for passes in scatter_plan(group, adj.shape):
        if isinstance(passes, Scatter):
            vectorized.scatter(passes, adj, buffers)
            continue
        name, shape, first, second = passes
        temporary = memory.pool.zeros(shape, adj.dtype)
        for t in first:
            vectorized.scatter(t, temporary, buffers)
        here = buffers | {name: temporary}
        for t in second:
            vectorized.scatter(t, adj, here)


def scatter_plan(group: tuple[Scatter, ...], shape: tuple[int, ...]) -> list:
    """An adjoint's scatters as they run (`vectorized_cost` counts by the same plan): all of them
    as the two passes of one separable window (`split_scatters`'s tuple), else each alone, as
    two passes or as itself."""
    whole = split_scatters(group, shape)
    return [whole] if whole else [split_scatters((s,), shape) or s for s in group]


# --- the analysis ---------------------------------------------------------------------------------


def _terms(e: Expr, dtype: str) -> list[tuple[Expr, ...]] | None:
    """`e` as a sum of products, each a tuple of factors: its sums and products in `dtype`
    multiplied out (at most MAX_TERMS terms), or None."""
    if isinstance(e, Bin) and e.op in (Op.ADD, Op.MUL) and dtype_of(e) == dtype:
        a, b = _terms(e.lhs, dtype), _terms(e.rhs, dtype)
        if a is None or b is None:
            return None
        out = a + b if e.op is Op.ADD else [x + y for x in a for y in b]
        return out if len(out) <= MAX_TERMS else None
    return [(e,)]


def _product(factors, dtype: str, last: Expr | None = None) -> Expr:
    """The product of `factors` (then `last`) in `dtype`."""
    out = last
    for f in reversed(factors):
        f = f if dtype_of(f) == dtype else Cast(dtype, f)
        out = f if out is None else Bin(Op.MUL, f, out)
    return out


def _sum(parts: list[Expr]) -> Expr:
    out = parts[0]
    for p in parts[1:]:
        out = Bin(Op.ADD, out, p)
    return out


def _ordered(factors) -> tuple[Expr, ...]:
    return tuple(sorted(factors, key=repr))  # (a tap's weights, compared as a set)


def _taps(terms, index_of, rows: set[Var], cols: set[Var]):
    """[(row key, column key, the other factors)] for the terms: each factor depends on the row
    index's variables alone (a row weight), on the column index's alone or on none (a column
    weight), or on others (the rest). However constants fall, a term is its row weights times
    its column weights times the rest, so any pairing found is exact."""
    out = []
    for factors, index in zip(terms, index_of, strict=True):
        row, col, rest = [], [], []
        for f in factors:
            v = free_vars(f)
            (row if v and v <= rows else col if v <= cols else rest).append(f)
        out.append(((index[-2], _ordered(row)), (index[-1], _ordered(col)), _ordered(rest)))
    return out


def _rank_one(taps) -> tuple[list[Key], list[Key]] | None:
    """(row taps, column taps) where the terms are each pairing of one of each, once."""
    rows = list(dict.fromkeys(r for r, _, _ in taps))
    cols = list(dict.fromkeys(c for _, c, _ in taps))
    pairs = [(r, c) for r, c, _ in taps]
    if len(set(pairs)) != len(pairs) or len(pairs) != len(rows) * len(cols):
        return None
    return rows, cols


def _axis_vars(index_of) -> tuple[set[Var], set[Var]] | None:
    """(the row index's variables, the column index's) over every term, or None where the index
    has fewer than two dimensions, the two share a variable or another dimension uses either."""
    if any(len(ix) < 2 for ix in index_of) or len({ix[:-2] for ix in index_of}) != 1:
        return None
    rows = set().union(*(free_vars(ix[-2]) for ix in index_of))
    cols = set().union(*(free_vars(ix[-1]) for ix in index_of))
    lead = set().union(*(free_vars(e) for e in index_of[0][:-2]))
    if not rows or not cols or rows & cols or lead & (rows | cols):
        return None
    return rows, cols


def split_func(f: Func, shapes: dict[str, tuple[int, ...]]) -> tuple[Func, Func] | None:
    """f as (a first pass, f from the first pass's buffer) where its body is a separable window
    (a sum of a windowed buffer's loads, or a Reduce sum of one, over rows and columns) and the
    two passes cost less (GAIN); else None. `shapes`: the buffers' shapes."""
    reduce = f.body if isinstance(f.body, Reduce) else None
    body = f.body if reduce is None else reduce.body
    if config.skipped("separable_window") or not is_float(f.dtype) or dtype_of(body) != f.dtype or \
            (reduce is not None and (reduce.op != "sum" or reduce.where is not None)):
        return None
    terms = _terms(body, f.dtype)
    loads = [[x for x in factors if isinstance(x, Load) and len(x.index) >= 2] for factors in terms or ()]
    if terms is None or any(len(w) != 1 for w in loads) or len({w[0].buffer for w in loads}) != 1:
        return None
    index_of = [w[0].index for w in loads]
    axes = _axis_vars(index_of)
    if axes is None:
        return None
    taps = _taps([tuple(x for x in factors if x is not w[0]) for factors, w in zip(terms, loads, strict=True)],
                 index_of, *axes)
    found = None if any(rest for _, _, rest in taps) else _rank_one(taps)
    rvars = {r.var: r.hi - r.lo for r in (reduce.rvars if reduce else ())}
    pure = [[v for v in f.vars if v in a] for a in axes]
    if found is None or any(len(p) != 1 for p in pure) or set(rvars) - axes[0] - axes[1] \
            or (axes[0] | axes[1]) - set(f.vars) - rvars.keys():
        return None
    source = shapes[loads[0][0].buffer][-2:]
    size, extent = math.prod(f.shape), dict(zip(f.vars, f.shape, strict=True))
    def cost(first: int) -> int:  # the first pass keeps the other axis at the source's extent
        second = 1 - first
        points = lambda axis: len(found[axis]) * math.prod(n for v, n in rvars.items() if v in axes[axis])
        return points(first) * size // extent[pure[second][0]] * source[second] + points(second) * size
    first = min((0, 1), key=cost)
    if cost(first) > GAIN * len(terms) * math.prod(rvars.values()) * size:
        return None
    second, lead = 1 - first, index_of[0][:-2]
    v = pure[second][0]
    def wrap(e: Expr, axis: int) -> Expr:
        rv = tuple(r for r in (reduce.rvars if reduce else ()) if r.var in axes[axis])
        return Reduce("sum", e, rv) if rv else e
    def read(i: Expr) -> Load:
        index = (i, v) if first == 0 else (v, i)
        return Load(loads[0][0].buffer, lead + index, loads[0][0].dtype)
    temporary = Func(f"{f.name}\0{('rows', 'columns')[first]}", f.vars,
                     tuple(source[second] if u == v else n for u, n in zip(f.vars, f.shape, strict=True)),
                     wrap(_sum([_product(w, f.dtype, read(i)) for i, w in found[first]]), first), f.dtype)
    again = _sum([_product(w, f.dtype, Load(temporary.name, tuple(i if u == v else u for u in f.vars), f.dtype))
                  for i, w in found[second]])
    out = Func(f.name, f.vars, f.shape, wrap(again, second), f.dtype, f.loc, f.argindex)
    return (temporary, out) if dtype_of(temporary.body) == dtype_of(out.body) == dtype_of(f.body) else None


SOURCE = Var("source'")  # the second pass's variable over the source's extent (no traced name has a quote)


def split_scatters(group: tuple[Scatter, ...], shape: tuple[int, ...]) \
        -> tuple[str, tuple[int, ...], list[Scatter], list[Scatter]] | None:
    """(a temporary's name and shape, the scatters into it, the scatters from it into the adjoint
    of `shape`) where `group` spreads a separable window (each scatter a seed times a row weight
    times a column weight, at a row tap and a column tap) and the two passes cost less (GAIN);
    else None."""
    dtype = dtype_of(group[0].value) if group else "bool"
    if config.skipped("separable_window") or not is_float(dtype) or group[0].where is not None \
            or len({(s.domain, s.where) for s in group}) != 1:
        return None
    terms = [_terms(s.value, dtype) for s in group]
    if any(t is None or len(t) != 1 for t in terms) or any(dtype_of(s.value) != dtype for s in group):
        return None
    index_of = [s.index for s in group]
    axes = _axis_vars(index_of)
    position = {r.var: k for k, r in enumerate(group[0].domain)}
    if axes is None or not axes[0] | axes[1] <= position.keys() or SOURCE in position:
        return None
    taps = _taps([t[0] for t in terms], index_of, *axes)
    found = _rank_one(taps)
    if found is None or len({rest for _, _, rest in taps}) != 1:
        return None
    seed = taps[0][2]
    seeded = set().union(*map(free_vars, seed))
    domain = group[0].domain
    def plan(keep: int):
        """(the temporary's variables, the first pass's domain, the second's, their cost) where the
        first pass sums the other axis's taps and the temporary keeps `keep`'s variables."""
        summed, kept = axes[1 - keep], axes[keep]
        first = tuple(r for r in domain if not (r.var in kept and r.var not in seeded))
        dims = [r.var for r in first if r.var not in summed]
        spot = min(position[v] for v in summed) - 0.5
        layout = tuple(sorted(dims + [SOURCE], key=lambda v: spot if v is SOURCE else position[v]))
        second = tuple(r for r in domain if r.var in dims or r.var in kept) + \
            (Range(SOURCE, 0, shape[len(shape) - 2 + 1 - keep]),)
        count = lambda rs: math.prod(r.hi - r.lo for r in rs)
        return layout, first, second, len(found[1 - keep]) * count(first) + len(found[keep]) * count(second)
    keep = min((0, 1), key=lambda k: plan(k)[3])
    layout, first, second, cost = plan(keep)
    ranges = {r.var: r for r in domain}
    if cost > GAIN * len(group) * math.prod(r.hi - r.lo for r in domain) or \
            any(ranges[v].lo != 0 for v in layout if v is not SOURCE):
        return None
    name = f"{group[0].buffer}\0{('columns', 'rows')[keep]}"
    extents = {r.var: r.hi - r.lo for r in second}
    lead = group[0].index[:-2]
    into = [Scatter(name, tuple(i if u is SOURCE else u for u in layout), _product(seed + w, dtype), first)
            for i, w in found[1 - keep]]
    partial = Load(name, layout, dtype)
    def at(i: Expr) -> tuple[Expr, ...]:
        return lead + ((i, SOURCE) if keep == 0 else (SOURCE, i))
    out = [Scatter(group[0].buffer, at(i), _product(w, dtype, partial), second) for i, w in found[keep]]
    return name, tuple(extents[v] for v in layout), into, out


__all__ = ["func", "scatter_plan", "scatters", "split_func", "split_scatters"]
