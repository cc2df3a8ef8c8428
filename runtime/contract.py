"""Contractions: a reduction of a product of two tensors whose indices are plain variables, `y[i,
j] = sum_k x[i, k] * w[k, j]`, or a convolution's adjoint, `adj_x[n, c, i + r, j + s] += adj_y[n,
k, i, j] * w[k, c, r, s]`, is a matrix product: BLAS or a direct convolution kernel computes it far
faster than any loop nest we generate. This module recognizes them (`contraction`) and keeps
their math; the engines under runtime/engines/ plan and run them, and runtime/route.py picks
one. Window variables that are added to another variable (r, s above) are taps.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

import numpy as np

from halide_ad.affine import linear_form
from halide_ad.ir import Bin, Call, Const, Expr, Load, Op, Range, Select, Var, const, is_float, show
from halide_ad.traverse import rewrite

MAX_TAPS = 64
MIN_CONTRACTED = 16  # below this many summed points a fused loop nest is as good
MIN_PADDED_WORK = 1 << 15  # multiply-adds below which a padded operand's copies cost more than BLAS saves


@dataclass(frozen=True)
class Padding:
    """Buffer `name` is `source`'s buffer zero-padded by `pads`, (before, after) per axis: what a
    contraction reads where it reads through `hd.constant_exterior`, `select(in bounds,
    x[...], 0)`, so that the product is a contraction at all (the select kept it a loop nest,
    unvectorized: the digits example's weight gradient took 0.24 ms, BLAS on a padded copy 0.03)."""
    name: str
    source: Load
    pads: tuple[tuple[int, int], ...]

    def padded(self, array: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
        """`array` (of `shape`'s size) padded with zeros."""
        out = np.zeros(_padded_shape(shape, self.pads), array.dtype)
        out[tuple(slice(lo, lo + n) for n, (lo, _) in zip(shape, self.pads, strict=True))] = array.reshape(shape)
        return out


@dataclass(frozen=True)
class Contraction:
    """out[out_index] += scale * sum over the other variables of a[a_index] * b[b_index], or with
    no `b`, of a[a_index] alone (a bias's gradient: numpy's sum, see `_sum`)."""
    out: str
    out_index: tuple[Expr, ...]
    a: Load
    b: Load | None
    scale: float
    domain: tuple[Range, ...]
    taps: tuple[Range, ...]
    shapes: tuple[tuple[str, tuple[int, ...]], ...]
    formula: str
    inverse: object = None  # the solver's verified gather for the same term, which hd.explain reports
    plan: object = field(default=None, compare=False, repr=False)  # its engine's (runtime/route.py)
    padded: tuple[Padding, ...] = ()  # operands read as zero-padded copies, made per call

    @property
    def form(self) -> str:
        return self.inverse.form if self.inverse is not None else "gather-window"

    @property
    def loads(self) -> tuple[Load, ...]:
        """The reads of the program's buffers (a padded operand's source, not its copy)."""
        sources = {p.name: p.source for p in self.padded}
        return tuple(sources.get(x.buffer, x) for x in ((self.a,) if self.b is None else (self.a, self.b)))

    @property
    def engine(self) -> str:
        return self.plan.name

    def accumulate(self, buffers: dict[str, np.ndarray], *, assign: bool = False) -> None:
        """out += the contraction, or with `assign`, out = it (zero where it does not write), by
        its engine."""
        if self.padded:
            shapes = dict(self.shapes)
            buffers = buffers | {p.name: p.padded(buffers[p.source.buffer], shapes[p.source.buffer])
                                 for p in self.padded}
        self.plan.accumulate(buffers, assign=assign)



def variables(e: Expr) -> set[Var]:
    return {v for v, c in terms(e).items() if v is not None and c}


def used(index) -> set[Var]:
    return set().union(*map(variables, index))


def plain(index) -> set[Var]:
    """The variables that `index` reads only as whole components (x[..., v, ...])."""
    forms = [terms(e) for e in index]
    whole = {v for f in forms for v in f if v is not None and f == {v: 1, None: 0}}
    return whole - {v for f in forms if len(f) != 2 or f.get(None) != 0 or 1 not in f.values() for v in f}


def offset_vars(terms: dict) -> set[Var]:
    """The variables of an index component that has more than one (all but its main one are taps)."""
    vs = {v for v, c in terms.items() if v is not None and c}
    return vs if len(vs) > 1 else set()


@functools.lru_cache(maxsize=4096)  # planning asks again about the same components; callers must not mutate
def terms(e: Expr) -> dict[Var, int] | None:
    """Integer affine coefficients of an index component, with the constant under key None."""
    form = linear_form(e)
    if form is None:
        return None
    coeffs, constant = form
    return {v: c for v, c in coeffs.items() if c} | {None: constant}



def tap_product_vars(c: Contraction) -> tuple[Var, ...] | None:
    """Where a tap offsets an output variable of stride > 1 (`out[n, c, 2*i + r]`, a strided
    convolution's input gradient): the output index's variables, in the order of a product over
    them, summed over the rest, that a gather then adds into the output. `_correlation` would
    instead stack a copy of an operand per tap, for small products, one per phase of the stride.
    The variables come whole first, then the taps, then the variables the taps offset: the
    product's rows are one operand's, its columns the other's. None otherwise."""
    taps = {t.var for t in c.taps}
    whole, tapped, shifted = [], [], []
    strided = False
    for e in c.out_index:
        t = terms(e)
        vs = [v for v in t if v is not None and t[v]]
        tap, main = [v for v in vs if v in taps], [v for v in vs if v not in taps]
        if not tap:
            whole += vs
            continue
        if len(main) != 1:
            return None
        strided |= t[main[0]] > 1
        tapped += tap
        shifted += main
    order = tuple(whole + tapped + shifted)
    if not strided or len(set(order)) != len(order) or any(r.lo != 0 for r in c.domain if r.var in order):
        return None
    return order


def factors(value: Expr) -> tuple[list[Load], float] | None:
    """`value` as a product of loads and a constant scale, or None where it is not one."""
    match value:
        case Load():
            return [value], 1.0
        case Const(v, dtype) if is_float(dtype) or isinstance(v, int):
            return [], float(v)
        case Call("neg", (x,)):
            f = factors(x)
            return None if f is None else (f[0], -f[1])
        case Bin(Op.MUL, x, y):
            fx, fy = factors(x), factors(y)
            if fx is None or fy is None:
                return None
            return fx[0] + fy[0], fx[1] * fy[1]
        case Bin(Op.DIV, x, Const(v)) if v:
            f = factors(x)
            return None if f is None else (f[0], f[1] / v)
    return None


def contraction(out: str, out_index: tuple[Expr, ...], value: Expr, domain: tuple[Range, ...],
                where: Expr | None, shapes: dict[str, tuple[int, ...]], *,
                one_operand: bool = False) -> Contraction | None:
    """`out[out_index] += value` over `domain` as BLAS calls, or None if it is not a contraction
    (or too small to gain from one). With `one_operand`, a sum of one load (times a constant)
    with no taps is one too, computed by numpy. A load read through a zero exterior becomes a
    read of a zero-padded copy (`Padding`)."""
    ranges = {r.var: r for r in domain}
    shown = value
    padded: dict[Select, Padding] = {}
    value = rewrite(value, lambda n: _padded_read(n, ranges, shapes, padded) if isinstance(n, Select) else None)
    shapes = shapes | {p.name: _padded_shape(shapes[p.source.buffer], p.pads) for p in padded.values()}
    f = factors(value)
    if (where is not None or f is None or len(f[0]) not in ((1, 2) if one_operand else (2,))
            or not all(is_float(x.dtype) for x in f[0])):
        return None
    loads, scale = f
    a, b = loads if len(loads) == 2 else (loads[0], None)
    components = [(terms(e), "out") for e in out_index] + [(terms(e), "a") for e in a.index] + [
        (terms(e), "b") for e in (b.index if b is not None else ())]
    if any(t is None or any(v is not None and v not in ranges for v in t) for t, _ in components):
        return None
    taps: set[Var] = set()
    for t, _ in components:
        vs = [v for v in t if v is not None and t[v]]
        if len(vs) > 1:
            main = max(vs, key=lambda v: ranges[v].extent)
            taps.update(v for v in vs if v is not main)
    for t, _ in components:
        main = [v for v in t if v is not None and t[v] and v not in taps]
        if len(main) > 1 or any(t[v] < 0 for v in main):
            return None
    for where_ in ("out", "a", "b"):  # each variable names at most one axis of each operand
        mains = [v for t, w in components if w == where_ for v in t if v is not None and t[v] and v not in taps]
        if len(mains) != len(set(mains)):
            return None
    used = {v for t, w in components if w in ("a", "b") for v in t if v is not None and t[v]}
    out_vars = {v for t, w in components if w == "out" for v in t if v is not None and t[v]}
    if not out_vars - taps <= used:
        return None
    absent = [r for r in domain if r.var not in used | out_vars]
    if absent:
        return None  # a variable that only repeats a term: leave it to the loop nest
    read = {w: {v for t, w_ in components if w_ == w for v in t if v is not None and t[v]} for w in ("a", "b")}
    if b is not None and not taps and read["a"] == read["b"]:
        return None  # dot products, row-wise ones (softmax's gradient) too: each term read once, no reuse for BLAS
    tap_ranges = tuple(ranges[v] for v in sorted(taps, key=lambda v: list(ranges).index(v)))
    summed = math.prod(ranges[v].extent for v in used - out_vars - taps)
    if math.prod(t.extent for t in tap_ranges) > MAX_TAPS or summed < MIN_CONTRACTED or (b is None and taps):
        return None
    if padded and math.prod(r.extent for r in domain) < MIN_PADDED_WORK:
        return None
    sources = {p.source.buffer for p in padded.values()}
    return Contraction(out, out_index, a, b, scale, domain, tap_ranges,
                       tuple((n, shapes[n]) for n in {out} | {x.buffer for x in loads} | sources),
                       formula(out, out_index, shown), padded=tuple(padded.values()))


def _padded_read(e: Select, ranges: dict[Var, Range], shapes: dict[str, tuple[int, ...]],
                 padded: dict[Select, Padding]) -> Expr | None:
    """`select(in bounds, x[index], 0)` as a read of x padded with zeros (its `Padding` added to
    `padded`), where the condition is exactly the bounds tests of `index` that the ranges can
    fail (as `hd.constant_exterior` writes them); else None."""
    x = e.true
    if not (isinstance(x, Load) and isinstance(e.false, Const) and e.false.value == 0 and x.buffer in shapes):
        return None
    shape = shapes[x.buffer]
    tested = set()  # (axis, side): side 0 tests index >= 0, side 1 index < n
    for c in _conjuncts(e.cond):
        axes = [k for k, i in enumerate(x.index) if isinstance(c, Bin) and c.lhs == i]
        if not axes or not isinstance(c.rhs, Const):
            return None
        side = 0 if c.op == Op.GE and c.rhs.value == 0 else 1 if c.op == Op.LT else None
        if side is None or any(side == 1 and c.rhs.value != shape[k] for k in axes):
            return None
        tested.update((k, side) for k in axes)
    pads = []
    for k, (i, n) in enumerate(zip(x.index, shape, strict=True)):
        t = terms(i)
        if t is None or any(v is not None and v not in ranges for v in t):
            return None
        lo = t[None] + sum(c * (ranges[v].lo if c > 0 else ranges[v].hi - 1) for v, c in t.items() if v is not None)
        hi = t[None] + sum(c * (ranges[v].hi - 1 if c > 0 else ranges[v].lo) for v, c in t.items() if v is not None)
        pad = (max(0, -lo), max(0, hi - (n - 1)))
        if (pad[0] and (k, 0) not in tested) or (pad[1] and (k, 1) not in tested):
            return None
        pads.append(pad)
    if not any(lo or hi for lo, hi in pads):
        return x
    if e not in padded:
        name = f"{x.buffer}_zero_padded"
        while name in shapes or any(p.name == name for p in padded.values()):
            name += "_"
        padded[e] = Padding(name, x, tuple(pads))
    index = tuple(Bin(Op.ADD, i, const(lo)) if lo else i for i, (lo, _) in zip(x.index, pads, strict=True))
    return Load(padded[e].name, index, x.dtype, x.loc)


def _conjuncts(e: Expr) -> list[Expr]:
    if isinstance(e, Bin) and e.op == Op.AND:
        return _conjuncts(e.lhs) + _conjuncts(e.rhs)
    return [e]


def _padded_shape(shape: tuple[int, ...], pads) -> tuple[int, ...]:
    return tuple(n + lo + hi for n, (lo, hi) in zip(shape, pads, strict=True))


def formula(out: str, out_index: tuple[Expr, ...], value: Expr) -> str:
    """`out[out_index] += value`, as source comments show a contraction."""
    return f"{out}[{', '.join(map(show, out_index))}] += {show(value)}"
