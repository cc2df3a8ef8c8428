"""Elimination for the index inverter (`solver/invert.py`): the index equations `index(i) == j`
solved for one pivot variable each, and the variables left free bounded as loops.

`solve` eliminates one pivot per equation (`pivot = num / den`, with `num % den == 0` as a new
constraint where den is not 1), substituting it into the other equations and constraints.
`loops_and_guards` turns the constraints on the free variables into loop bounds (a max of lower
bounds, a min of upper bounds, innermost variable last) and guards at the depth where their
variables are all bound, dropping what the gather's own ranges already imply.
"""
from __future__ import annotations

import math

from halide_ad.affine import Affine, Constraint
from halide_ad.ir import Bin, Call, Expr, Op, Range, Var, const
from halide_ad.solver.bounds import interval
from halide_ad.traverse import simplify


def solve(equations, constraints, unknowns, ranges):
    """Eliminate one pivot per equation: pivot = num / den, with num % den == 0 as a constraint."""
    pivots: dict[Var, tuple[Affine, int]] = {}
    order = {v: k for k, v in enumerate(unknowns)}
    for eq in equations:
        for p, (num, den) in pivots.items():
            eq = eq.substitute(p, num, den)
        candidates = [v for v in eq.vars if v in order and v not in pivots]
        if not candidates:
            constraints.append(Constraint("eq", eq))
            continue
        p = max(candidates, key=lambda v: (abs(eq.coeff(v)) == 1, ranges[v][1] - ranges[v][0], -order[v]))
        a = eq.coeff(p)
        num = (eq - Affine.var(p).scale(a)).scale(-1)
        den = a
        if den < 0:
            num, den = num.scale(-1), -den
        pivots = {q: ((nq.substitute(p, num, den), dq * den) if nq.coeff(p) else (nq, dq))
                  for q, (nq, dq) in pivots.items()}
        constraints = [Constraint(c.kind, c.aff.substitute(p, num, den), c.modulus * (den if c.aff.coeff(p) else 1))
                       for c in constraints]
        pivots[p] = (num, den)
        if den != 1:
            constraints.append(Constraint("mod", num, den))
    return pivots, [_normalize(c) for c in constraints]


def _normalize(c: Constraint) -> Constraint:
    g = math.gcd(*(k for _, k in c.aff.coeffs)) if c.aff.coeffs else 0
    if c.kind == "mod":
        g = math.gcd(g, c.aff.const, c.modulus)
        return Constraint("mod", Affine.of({v: k // g for v, k in c.aff.coeffs}, c.aff.const // g), c.modulus // g) \
            if g > 1 else c
    if g <= 1:
        return c
    if c.kind == "eq" and c.aff.const % g:
        return Constraint("ge", Affine.of({}, -1))  # no integer solution
    return Constraint(c.kind, Affine.of({v: k // g for v, k in c.aff.coeffs}, c.aff.const // g))


def loops_and_guards(free: list[Var], constraints: list[Constraint], params: dict[Var, tuple[int, int]]):
    """Loop ranges for the free variables and the guards at each depth; None if provably empty.

    `params` are the gather's own variables j with their ranges; a guard that their ranges
    already imply is dropped, and so is a loop bound that another bound dominates.
    """
    depth = {f: d + 1 for d, f in enumerate(free)}
    constraints = constraints + _projections(constraints, free, depth)
    guards: list[list[Expr]] = [[] for _ in range(len(free) + 1)]
    lower: dict[Var, list[Expr]] = {f: [] for f in free}
    upper: dict[Var, list[Expr]] = {f: [] for f in free}
    for c in constraints:
        if c.kind == "mod" and c.modulus == 1:
            continue
        if not c.aff.coeffs:
            holds = {"ge": c.aff.const >= 0, "eq": c.aff.const == 0, "mod": c.aff.const % max(c.modulus, 1) == 0}
            if not holds[c.kind]:
                return None
            continue
        d = max((depth[v] for v in c.aff.vars if v in depth), default=0)
        if c.kind == "ge" and d > 0:
            f = free[d - 1]
            k = c.aff.coeff(f)
            rest = c.aff - Affine.var(f).scale(k)
            if k > 0:  # k*f + rest >= 0  <=>  f >= ceil(-rest / k) == -(rest // k)
                lower[f].append(rest.scale(-1).to_expr() if k == 1 else
                                Call("neg", (Bin(Op.FLOORDIV, rest.to_expr(), const(k)),)))
            else:  # f <= floor(rest / -k)
                upper[f].append(Bin(Op.ADD, rest.to_expr() if k == -1 else
                                    Bin(Op.FLOORDIV, rest.to_expr(), const(-k)), const(1)))
        elif not (c.kind == "ge" and d == 0 and c.aff.vars <= params.keys() and c.aff.bounds(params)[0] >= 0):
            guards[d].append(c.to_expr())
    loops = []
    for f in free:
        lo = _fold(Op.MAX, lower[f], params)
        hi = _fold(Op.MIN, upper[f], params)
        loops.append(Range(f, lo, hi))
    return loops, guards


def _projections(constraints: list[Constraint], free: list[Var], depth) -> list[Constraint]:
    """Implied constraints on outer loop variables, so that their loops skip empty iterations.

    `x + r >= 5` with 0 <= r <= 1 implies x >= 4: an inner variable with constant bounds is
    replaced by its extreme value (one Fourier-Motzkin step). Adding implied constraints is
    always sound; the loops just get tighter.
    """
    const_range: dict[Var, list[int | None]] = {f: [None, None] for f in free}
    for c in constraints:
        if c.kind == "ge" and len(c.aff.coeffs) == 1 and c.aff.coeffs[0][0] in const_range:
            f, k = c.aff.coeffs[0]
            if k == 1:  # f + c >= 0
                lo = -c.aff.const
                const_range[f][0] = lo if const_range[f][0] is None else max(const_range[f][0], lo)
            elif k == -1:  # -f + c >= 0
                hi = c.aff.const
                const_range[f][1] = hi if const_range[f][1] is None else min(const_range[f][1], hi)
    out = []
    for c in constraints:
        aff = c.aff
        while c.kind == "ge" and sum(v in depth for v in aff.vars) > 1:
            inner = max((v for v in aff.vars if v in depth), key=depth.get)
            k = aff.coeff(inner)
            lo, hi = const_range[inner]
            extreme = hi if k > 0 else lo
            if extreme is None:
                break
            aff = Affine.of({v: c_ for v, c_ in aff.coeffs if v != inner}, aff.const + k * extreme)
            out.append(Constraint("ge", aff))
    return out


def _fold(op: Op, terms: list[Expr], params) -> Expr:
    """max (or min) of `terms`, less those that another term dominates over the params' box."""
    terms = list(dict.fromkeys(simplify(t) for t in terms))
    spans = {t: interval(t, params) for t in terms}

    def dominates(a: Expr, b: Expr) -> bool:
        sa, sb = spans[a], spans[b]
        if sa is None or sb is None:
            return False
        return sa[0] >= sb[1] if op is Op.MAX else sa[1] <= sb[0]

    keep = list(terms)
    for t in terms:
        if any(o is not t and dominates(o, t) for o in keep) and len(keep) > 1:
            keep.remove(t)
    out = keep[0]
    for t in keep[1:]:
        out = Bin(op, out, t)
    return out
