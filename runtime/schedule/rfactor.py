"""split_reduction: a long sum or product to one point (a loss) as partial results that run in
parallel, then their combination (Halide's rfactor). A rewrite of the program's Funcs, before
they are lowered: halide_ad/compiler.py runs it on the forward's reductions."""
from __future__ import annotations

import math
from dataclasses import replace

from halide_ad.ir import INDEX_DTYPE, Bin, Cast, Const, Func, Load, Op, Range, Reduce, Var, dtype_of, is_float
from halide_ad.runtime import lower
from halide_ad.runtime.schedule.driver import decision
from halide_ad.runtime.schedule.parallel import parallel_dim, parallel_min_points
from halide_ad.traverse import simplify, substitute, walk

MAX_PARTS = 16  # partial results of a reduction to one point


@decision(lambda funcs: "none" if funcs is None else f"{funcs[0].name} in parts, summed into {funcs[1].name}")
def split_reduction(f: Func, taken: set[str]) -> tuple[Func, Func] | None:
    """A long sum or product to one point (a loss) as partial results over MAX_PARTS or fewer
    equal chunks of its first reduction variable whose extent they divide, a Func of their own
    whose points run in parallel, then their combination (Halide's rfactor). None where `f`'s
    points already run in parallel, or no chunking fits. The chunks are fixed by the extents, so
    the result does not depend on the thread count; float32 partials are float64."""
    r = f.body
    if (not isinstance(r, Reduce) or r.op not in ("sum", "prod") or not is_float(f.dtype)
            or parallel_dim(f.shape, lower.terms(r)) is not None
            or math.prod(f.shape) * lower.terms(r) < parallel_min_points()):
        return None
    for k, rv in enumerate(r.rvars):
        extent = rv.hi - rv.lo
        parts = next((n for n in range(min(MAX_PARTS, extent // 2), 1, -1) if extent % n == 0), None)
        if parts is not None:
            break
    else:
        return None
    names = {n.name for n in walk(r) if isinstance(n, Var)} | {v.name for v in f.vars} | taken

    def fresh(base: str) -> str:
        while base in names:
            base += "_"
        names.add(base)
        return base

    part, inner = Var(fresh(f"{rv.var.name}_part")), Var(fresh(f"{rv.var.name}_in"))
    size = extent // parts
    at = {rv.var: Bin(Op.ADD, Bin(Op.ADD, Bin(Op.MUL, part, Const(size, INDEX_DTYPE)), inner),
                      Const(rv.lo, INDEX_DTYPE))}
    wide = "float64" if f.dtype == "float32" else f.dtype
    body = simplify(substitute(r.body, at))
    body = body if dtype_of(body) == wide else Cast(wide, body)
    where = None if r.where is None else simplify(substitute(r.where, at))
    rvars = r.rvars[:k] + (Range(inner, 0, size),) + r.rvars[k + 1:]
    partial = Func(fresh(f"{f.name}_parts"), (part, *f.vars), (parts, *f.shape),
                   Reduce(r.op, body, rvars, where, r.loc), wide, f.loc)
    combined = Reduce(r.op, Load(partial.name, (part, *f.vars), wide), (Range(part, 0, parts),), None, r.loc)
    return partial, replace(f, body=combined)
