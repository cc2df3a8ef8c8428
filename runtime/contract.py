"""Contractions routed to BLAS.

A reduction of a product of two tensors whose indices are plain variables, `y[i, j] = sum_k
x[i, k] * w[k, j]`, or a convolution's adjoint, `adj_x[n, c, i + r, j + s] += adj_y[n, k, i, j] *
w[k, c, r, s]`, is a matrix product: numpy's einsum (tensordot, so BLAS) computes it far faster than
any loop nest we generate. Window variables that are added to another variable (r, s above) are
enumerated in Python, one einsum on strided views per tap, as im2col would do without the copy.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

from halide_ad.ir import Bin, Call, Const, Expr, Load, Op, Range, Var, is_float
from halide_ad.show import show
from halide_ad.solver.affine import linear_form

MAX_TAPS = 64
MIN_CONTRACTED = 16  # below this many summed points a fused loop nest is as good


@dataclass(frozen=True)
class Contraction:
    """out[out_index] += scale * sum over the other variables of a[a_index] * b[b_index]."""
    out: str
    out_index: tuple[Expr, ...]
    a: Load
    b: Load
    scale: float
    domain: tuple[Range, ...]
    taps: tuple[Range, ...]
    shapes: tuple[tuple[str, tuple[int, ...]], ...]
    formula: str
    inverse: object = None  # the solver's verified gather for the same term, which hd.explain reports

    @property
    def form(self) -> str:
        return self.inverse.form if self.inverse is not None else "gather-window"

    def accumulate(self, buffers: dict[str, np.ndarray]) -> None:
        """One einsum (BLAS) over all taps; taps that shift the output window (col2im, as in a
        convolution's input gradient) are then added window by window."""
        shapes = dict(self.shapes)
        arrays = {n: buffers[n].reshape(shapes[n]) for n in (self.out, self.a.buffer, self.b.buffer)}
        ranges = {r.var: r for r in self.domain}
        letters = {r.var: chr(ord("a") + k) for k, r in enumerate(self.domain)}
        shifting = {v for e in self.out_index for v in _offset_vars(_terms(e))}
        loop_taps = [t for t in self.taps if t.var in shifting]
        va, sa = self._operand(arrays[self.a.buffer], self.a.index, {}, ranges, letters)
        vb, sb = self._operand(arrays[self.b.buffer], self.b.index, {}, ranges, letters)
        first = {t.var: t.lo for t in loop_taps}
        so = _view(arrays[self.out], self.out_index, first, ranges, letters)[1]
        lead = "".join(letters[t.var] for t in loop_taps)
        full = np.einsum(f"{sa},{sb}->{lead}{so}", va, vb, optimize=True)
        if self.scale != 1:
            full *= full.dtype.type(self.scale)
        for values in itertools.product(*(range(t.lo, t.hi) for t in loop_taps)):
            env = dict(zip((t.var for t in loop_taps), values, strict=True))
            vo = _view(arrays[self.out], self.out_index, env, ranges, letters)[0]
            vo += full[tuple(v - t.lo for v, t in zip(values, loop_taps, strict=True))]

    def _operand(self, array, index, env, ranges, letters):
        """The operand's view; taps it reads at an offset (x[i + r]) become leading axes of a
        stacked copy (im2col), so that all taps go into one BLAS call."""
        stacked = [t for t in self.taps if t.var not in env and any(t.var in _offset_vars(_terms(e)) for e in index)]
        if not stacked:
            return _view(array, index, env, ranges, letters)
        views = []
        for values in itertools.product(*(range(t.lo, t.hi) for t in stacked)):
            view, subs = _view(array, index, {**env, **dict(zip((t.var for t in stacked), values, strict=True))},
                               ranges, letters)
            views.append(view)
        data = np.stack(views).reshape(tuple(t.extent for t in stacked) + views[0].shape)
        return data, "".join(letters[t.var] for t in stacked) + subs


def _offset_vars(terms: dict) -> set[Var]:
    """The variables of an index component that has more than one (all but its main one are taps)."""
    vs = {v for v, c in terms.items() if v is not None and c}
    return vs if len(vs) > 1 else set()


def _terms(e: Expr) -> dict[Var, int] | None:
    """Integer affine coefficients of an index component, with the constant under key None."""
    form = linear_form(e)
    if form is None:
        return None
    coeffs, constant = form
    return {v: c for v, c in coeffs.items() if c} | {None: constant}


def _view(array, index, env, ranges, letters):
    """The strided view of `array` that `index` reads as the non-tap variables run, and its subscripts."""
    slices, subs = [], ""
    for e in index:
        t = _terms(e)
        offset = t.get(None, 0) + sum(c * env[v] for v, c in t.items() if v in env)
        main = [(v, c) for v, c in t.items() if v is not None and v not in env and c]
        if not main:
            slices.append(offset)
            continue
        (v, c), = main
        r = ranges[v]
        start = offset + c * r.lo
        slices.append(slice(start, start + c * (r.hi - r.lo - 1) + 1, c))
        subs += letters[v]
    return array[tuple(slices) + (Ellipsis,)], subs  # with `...`, a 0-d result is a view, not a copy


def _factors(value: Expr) -> tuple[list[Load], float] | None:
    match value:
        case Load():
            return [value], 1.0
        case Const(v, dtype) if is_float(dtype) or isinstance(v, int):
            return [], float(v)
        case Call("neg", (x,)):
            f = _factors(x)
            return None if f is None else (f[0], -f[1])
        case Bin(Op.MUL, x, y):
            fx, fy = _factors(x), _factors(y)
            if fx is None or fy is None:
                return None
            return fx[0] + fy[0], fx[1] * fy[1]
        case Bin(Op.DIV, x, Const(v)) if v:
            f = _factors(x)
            return None if f is None else (f[0], f[1] / v)
    return None


def contraction(out: str, out_index: tuple[Expr, ...], value: Expr, domain: tuple[Range, ...],
                where: Expr | None, shapes: dict[str, tuple[int, ...]]) -> Contraction | None:
    """`out[out_index] += value` over `domain` as BLAS calls, or None if it is not a contraction
    (or too small to gain from one)."""
    f = _factors(value)
    if where is not None or f is None or len(f[0]) != 2 or not all(is_float(x.dtype) for x in f[0]):
        return None
    (a, b), scale = f
    ranges = {r.var: r for r in domain}
    components = [(_terms(e), "out") for e in out_index] + [(_terms(e), "a") for e in a.index] + [
        (_terms(e), "b") for e in b.index]
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
    tap_ranges = tuple(ranges[v] for v in sorted(taps, key=lambda v: list(ranges).index(v)))
    summed = math.prod(ranges[v].extent for v in used - out_vars - taps)
    if math.prod(t.extent for t in tap_ranges) > MAX_TAPS or summed < MIN_CONTRACTED:
        return None
    formula = f"{out}[{', '.join(map(show, out_index))}] += {show(value)}"
    return Contraction(out, out_index, a, b, scale, domain, tap_ranges,
                       tuple((n, shapes[n]) for n in {out, a.buffer, b.buffer}), formula)
