"""Funcs and reductions -> plain loop nests (runtime/loops.py): one serial loop per dimension and
per reduction variable, outermost first, unscheduled. The passes under runtime/schedule/ decide
the rest. Also a gather's piece and a fallback's scatter as statements, a contribution's comment,
and a piece read as a constant times loads (`constant_product`, which a point sums once)."""
from __future__ import annotations

import math

import numpy as np

from halide_ad.ir import INDEX_DTYPE, Const, Expr, Func, Load, Op, Reduce, dtype_of, is_float, show
from halide_ad.runtime.contract import factors
from halide_ad.runtime.loops import (Accumulate, Block, Chain, Comment, For, If, Improves, Kind, Let, Local, Stmt,
                                     Store, block, nest)

LONG_SUM = 256  # terms from which a float32 sum or product accumulates in float64


def accumulator_dtype(op: str, dtype: str, terms: int) -> str:
    """float64 for a float32 sum or product of LONG_SUM terms or more. Each float32 add rounds
    to the running total's precision: a sum of 16M squares came out 2% low. The result is
    rounded to float32 once, at the store. A sum folded in vector lanes adds its terms in
    float32 a block at a time, then each block in float64 (`lanes.BLOCK`)."""
    return "float64" if op in ("sum", "prod") and dtype == "float32" and terms >= LONG_SUM else dtype


def terms(r: Reduce) -> int:
    """The terms of reduction `r`: the points of its domain."""
    return math.prod(rv.hi - rv.lo for rv in r.rvars)


def identity(op: str, dtype: str) -> Const:
    """Where reduction `op` starts, in `dtype`: the extreme integers for an integer max or min."""
    init = {"sum": 0, "prod": 1, "max": -math.inf, "argmax": -math.inf}.get(op, math.inf)
    if not is_float(dtype) and dtype != "bool" and not isinstance(init, int):
        info = np.iinfo(dtype)
        init = info.min if init < 0 else info.max
    return Const(init, dtype)


def pointwise(f: Func) -> Stmt:
    """The nest computing Func `f`, whose body has no reduction: f[vars] = body at every point."""
    return nest([(v, 0, n, Kind.SERIAL) for v, n in zip(f.vars, f.shape, strict=True)],
                Store(f.name, f.vars, f.body))


def accumulation(r: Reduce, acc: Local) -> Block:
    """`acc` = the sum, product, max or min `r`: its identity, then each term in reduction order
    where `r.where` holds."""
    step = Accumulate(acc, r.body, r.op)
    loops = [(rv.var, rv.lo, rv.hi, Kind.SERIAL) for rv in r.rvars]
    return block(Let(acc, identity(r.op, acc.dtype)), nest(loops, step if r.where is None else If(r.where, block(step))))


def accumulator(r: Reduce, name: str) -> Local:
    """The local named `name` that accumulates `r`, in `accumulator_dtype`."""
    return Local(name, accumulator_dtype(r.op, dtype_of(r), terms(r)))


def reduction(f: Func, acc: Local) -> Stmt:
    """The nest computing Func `f`, whose body is a sum, product, max or min: at every point,
    `acc` accumulates the reduction, then f[vars] = acc."""
    return nest([(v, 0, n, Kind.SERIAL) for v, n in zip(f.vars, f.shape, strict=True)],
                block(accumulation(f.body, acc), Store(f.name, f.vars, acc)))


def extremum(r: Reduce, position: Expr) -> Block:
    """`acc` = the max or min `r` and `arg` = its `position` in reduction order (-1 if empty). The
    first extremal element wins; a NaN wins over numbers, as in numpy."""
    dtype = dtype_of(r.body) if r.op in ("argmax", "argmin") else dtype_of(r)
    acc, arg, val = Local("acc", dtype), Local("arg", INDEX_DTYPE), Local("val", dtype_of(r.body))
    take = If(Improves("max" if r.op in ("max", "argmax") else "min", val, acc, arg), block(Let(acc, val), Let(arg, position)))
    step = block(Let(val, r.body), take)
    loops = [(rv.var, rv.lo, rv.hi, Kind.SERIAL) for rv in r.rvars]
    return block(Let(acc, identity(r.op, dtype)), Let(arg, Const(-1, INDEX_DTYPE)),
                 nest(loops, step if r.where is None else If(r.where, step)))


def extremum_func(f: Func, argindex: str | None, position: Expr) -> Stmt:
    """The nest computing Func `f`, an argmax or argmin, or a max or min that keeps the position
    of its extremum in buffer `argindex`."""
    r = f.body
    stores = [Store(f.name, f.vars, Local("arg", INDEX_DTYPE) if r.op in ("argmax", "argmin") else Local("acc", f.dtype))]
    if argindex is not None:
        stores.append(Store(argindex, f.vars, Local("arg", INDEX_DTYPE)))
    return nest([(v, 0, n, Kind.SERIAL) for v, n in zip(f.vars, f.shape, strict=True)],
                block(extremum(r, position), *stores))


def scatter(fallback, adjoint: str, dtype: str) -> Stmt:
    """A Fallback's scatter into buffer `adjoint` of `dtype`: loops over its domain, the variable
    whose points write disjoint elements (`fallback.parallel`, from the solver) outermost and
    parallel, adding the value where the scatter's `where` holds."""
    s = fallback.scatter
    order = sorted(s.domain, key=lambda r: r.var != fallback.parallel)
    step = Accumulate(Load(adjoint, s.index, dtype, s.loc), s.value, augmented=True)
    return nest([(r.var, r.lo, r.hi, Kind.PARALLEL if r.var == fallback.parallel else Kind.SERIAL) for r in order],
                step if s.where is None else If(s.where, block(step)))


def gather_piece(piece, acc: Local) -> Stmt:
    """`acc +=` a GatherPiece's value over its loops: its level-0 guards outside them, level k's
    inside loop k; a loop the solver proved to run at most once (`piece.single`) is a test."""
    s: Stmt = Accumulate(acc, piece.value, augmented=True)
    for level in reversed(range(len(piece.guards))):
        if piece.guards[level]:
            s = If(tuple(piece.guards[level]), block(s))
        if level > 0:
            loop, once = piece.loops[level - 1], piece.single and piece.single[level - 1]
            s = For(loop.var, loop.lo, loop.hi, Kind.AT_MOST_ONCE if once else Kind.SERIAL, block(s))
    return s


def product(loads: tuple[Load, ...]) -> Expr | None:
    """The product of `loads`, flat (`h1 * h2`); None for none."""
    return None if not loads else loads[0] if len(loads) == 1 else Chain(Op.MUL, loads)


def constant_product(piece, dtype: str) -> tuple[tuple[Load, ...], float] | None:
    """(its loads, the constant) for a GatherPiece read unconditionally as a constant times loads
    of `dtype` (a point adds those once per product of loads); else None."""
    product = None if piece.loops or any(piece.guards) else factors(piece.value)
    if product is None or not all(x.dtype == dtype for x in product[0]):
        return None
    return tuple(sorted(product[0], key=show)), product[1]


def describe(c) -> Comment:
    """A comment naming contribution `c` (a Gather or a Fallback): its form, scatter and source."""
    s = c.scatter
    return Comment(f"{c.form}: adj_{s.buffer}[{', '.join(map(show, s.index))}] += {show(s.value)}"
                   + (f"  ({s.loc})" if s.loc else ""))
