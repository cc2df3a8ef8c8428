"""The interpreter tier's cost model: what `vectorized.py` takes to run a program, in numpy's element
operations, estimated from the plans it runs by (which variables loop, which sums go to BLAS),
without running anything. `halide_ad.tiered` runs a program's first calls on the interpreter
when each pass's (the forward's, the gradient's) is at most HALIDE_AD_INTERPRET_MAX.

Calibration, measured at the commit that added it on the 2-core development machine (under load):
the nine kernel cases of `python -m benchmarks` at their benchmark shapes ran their forward and
gradient passes at 0.5-1e9 of these operations per second of CPU time.
"""
from __future__ import annotations

import math

from halide_ad.ir import Bin, Call, Const, Expr, Func, Op, Program, Reduce, Scatter, Update, Var, dtype_of
from halide_ad.runtime import reference, vectorized_separable as separable
from halide_ad.runtime.vectorized_plans import CHUNK, product_factors, index_dims, looped_vars
from halide_ad.traverse import children, free_vars

PYTHON_STEP = 2000  # element operations that one numpy call from Python costs, about (~5 us)
BLAS_MACS = 16  # multiply-adds that BLAS does in the time of one numpy element operation, about
SLOW_CALLS = {"erf": 50}  # numpy has no erf: the reference calls math.erf per element


def passes(program: Program, adjoints) -> tuple[int, int]:
    """(forward, gradient): the element operations that `func` and `scatter` (and the reference,
    for updates) take to run `program`'s Funcs, and the Scatters of `adjoints`, estimated from
    the same plans: each node of an expression costs the size of the varying variables it
    depends on, once per loop point, plus PYTHON_STEP per numpy call; a sum of products costs
    its multiply-adds / BLAS_MACS."""
    shapes = {b.name: b.shape for b in program.inputs} | {f.name: f.shape for f in program.funcs}
    forward = sum(_update_work(f) for f in program.funcs if isinstance(f, Update))
    forward += sum(_func_work(g) for f in program.funcs if isinstance(f, Func)
                   for g in separable.split_func(f, shapes) or (f,))  # (a separable window: its two passes)
    gradient = sum(_update_work(a.scan.update) for a in adjoints if a.scan)
    gradient += sum(math.prod(a.shape) + sum(_scatter_work(p) if isinstance(p, Scatter) else
                                             math.prod(p[1]) + sum(map(_scatter_work, p[2] + p[3]))
                                             for p in separable.scatter_plan(a.scatters, a.shape))
                    for a in adjoints)
    return forward, gradient


def _update_work(u: Update) -> int:
    """The reference steps through the rdom in Python, each step over the pure points."""
    return 2 * math.prod(r.hi - r.lo for r in u.rdom) * (PYTHON_STEP + math.prod(r.hi - r.lo for r in u.pure))


def _func_work(f: Func) -> int:
    counts = {v: n for v, n in zip(f.vars, f.shape, strict=True)}
    body = f.body
    if not isinstance(body, Reduce):
        return math.prod(f.shape) + _expr_work((body,), counts, set(), _pieces(counts, f.vars))
    counts |= {r.var: reference._extent(r) for r in body.rvars}
    looped = looped_vars(index_dims((body.body, body.where)), counts, {r.var for r in body.rvars})
    if looped and body.op not in ("sum", "prod"):
        looped = {r.var for r in body.rvars}
    summed = {r.var for r in body.rvars} - looped
    contracted = product_factors(body.body, dtype_of(body)) if body.op == "sum" and body.where is None and summed else []
    return math.prod(f.shape) + _expr_work((body.body, body.where), counts, looped, _pieces(counts, f.vars),
                                           contracted)


def _scatter_work(s: Scatter) -> int:
    counts = {r.var: reference._extent(r) for r in s.domain}
    looped = looped_vars(list(s.index) + index_dims((s.value, s.where, *s.index)), counts, set(counts))
    named = set().union(*(free_vars(i) for i in s.index)) - looped
    contracted = product_factors(s.value, dtype_of(s.value)) if s.where is None and set(counts) - looped - named else []
    points = math.prod(counts[v] for v in looped)
    return points * math.prod(counts[v] for v in named if v in counts) + _expr_work(
        (s.value, s.where, *s.index), counts, looped, _pieces(counts, tuple(named)), contracted)


def _pieces(counts: dict[Var, int], kept) -> int:
    return max(1, math.prod(counts[v] for v in kept if v in counts) // CHUNK)


def _expr_work(exprs, counts: dict[Var, int], looped: set[Var], pieces: int, contracted=()) -> int:
    """Element operations of evaluating `exprs` at each point of the `looped` variables, where
    the first is the product of `contracted` that einsum sums (if there are two factors or more)."""
    free = {v: n for v, n in counts.items() if v not in looped}
    ops = calls = 0
    roots = list(exprs)
    if len(contracted) > 1:
        ops += math.prod(free[v] for v in set().union(*map(free_vars, contracted)) if v in free) // BLAS_MACS
        calls += 1
        roots = list(contracted) + roots[1:]
    for e in roots:
        for n, points in _operations(e, free) if e is not None else ():
            ops += points * (SLOW_CALLS.get(n.fn, 1) if isinstance(n, Call) else 1)
            calls += 1
    return math.prod(counts[v] for v in looped) * (ops + calls * PYTHON_STEP * pieces)


def _operations(e: Expr, free: dict[Var, int]):
    """(node, points) for each numpy operation that evaluating `e` runs: a node costs the
    points of the varying variables it depends on; a product chain multiplies its factors
    smallest first (`vectorized._product`), each step the points of the factors so far."""
    def points(variables) -> int:
        return math.prod(free[v] for v in variables if v in free)

    if isinstance(e, (Const, Var)):
        return
    factors = product_factors(e, dtype_of(e)) if isinstance(e, Bin) and e.op == Op.MUL else []
    if len(factors) > 2:
        for f in factors:
            yield from _operations(f, free)
        seen: set[Var] = set()
        for k, f in enumerate(sorted(factors, key=lambda f: points(free_vars(f)))):
            seen |= free_vars(f)
            if k:
                yield e, points(seen)
        return
    yield e, points(free_vars(e))
    for c in children(e):
        yield from _operations(c, free)


__all__ = ["passes"]
