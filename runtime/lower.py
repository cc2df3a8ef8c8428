"""Funcs and reductions -> plain loop nests (runtime/loops.py): one serial loop per dimension and
per reduction variable, outermost first, unscheduled. The passes under runtime/schedule/ decide
the rest."""
from __future__ import annotations

import math

import numpy as np

from halide_ad.ir import Const, Func, Reduce, dtype_of, is_float
from halide_ad.runtime.loops import Accumulate, Block, If, Kind, Let, Local, Stmt, Store, block, nest

LONG_SUM = 256  # terms from which a float32 sum or product accumulates in float64


def accumulator_dtype(op: str, dtype: str, terms: int) -> str:
    """float64 for a float32 sum or product of LONG_SUM terms or more. Each float32 add rounds
    to the running total's precision: a sum of 16M squares came out 2% low. The result is
    rounded to float32 once, at the store."""
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
