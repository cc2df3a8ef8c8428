"""interchange_rows: a sum or product whose reads walk memory with the output's last dimension runs
a row at a time, that dimension's loop inside the reduction's loops.

Point by point, the reduction would stride across rows for every element of the output (a mean
over the channels of NCHW ran 6x slower than numpy). Each element still takes its terms in
reduction order, so the result is the same bits.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from halide_ad.ir import Load
from halide_ad.runtime.loops import Accumulate, Allocate, Element, For, If, Kind, Let, Local, Stmt, Store, block
from halide_ad.runtime.schedule.accumulate import unit_stride
from halide_ad.runtime.schedule.parallel import perfect_loops
from halide_ad.traverse import free_vars, walk


def interchange_rows(s: Stmt, out_dtype: str, fresh: Callable[[str], str]) -> Stmt:
    """`s`, a reduction's nest from lower.reduction (after choose_parallel), with its last pure
    loop moved inside the reduction's loops where that helps (`_walks_rows`), else `s`. The row
    accumulates in the output buffer, of `out_dtype`, or, where the accumulator is wider, in a
    local array named `fresh("row")`, allocated once per parallel iteration (once in all,
    serially), and copied to the output after."""
    outer = perfect_loops(s)
    if not outer or len(outer[-1].body.body) != 3:
        return s
    last = outer[-1]
    init, reduction, store = last.body.body
    chain, step, where = _reduction(reduction)
    if (not isinstance(init, Let) or not isinstance(init.var, Local) or not isinstance(store, Store)
            or store.value != init.var or step is None or step.target != init.var
            or not _walks_rows(last, chain, step)):
        return s
    acc, k = init.var, last.var
    row = None if acc.dtype == out_dtype else fresh("row")

    def along_row(stmt: Stmt) -> For:
        return For(k, last.lo, last.hi, Kind.SERIAL, block(stmt))

    if row is None:
        target = Load(store.buffer, store.index, out_dtype)
        first = Store(store.buffer, store.index, init.value)
    else:
        target = Element(row, (k,), acc.dtype)
        first = Let(target, init.value)
    add = Accumulate(target, step.value, step.op)
    inner: Stmt = along_row(add if where is None else If(where, block(add)))
    for loop in reversed(chain):
        inner = replace(loop, body=block(inner))
    rows = block(along_row(first), inner, *([along_row(Store(store.buffer, store.index, target))] if row else []))
    allocate = Allocate(row, (last.hi - last.lo,), acc.dtype) if row else None
    parallel = next((d for d, loop in enumerate(outer[:-1]) if loop.kind is Kind.PARALLEL), None)
    for d in reversed(range(len(outer) - 1)):
        rows = replace(outer[d], body=block(allocate, rows) if allocate and d == parallel else block(rows))
    return block(allocate, rows) if allocate and parallel is None else rows


def _reduction(s: Stmt) -> tuple[list[For], Accumulate | None, object]:
    """(the reduction's loops, its accumulation, its where) for a perfect nest of loops around an
    Accumulate, or one under an If."""
    chain = perfect_loops(s)
    inner = chain[-1].body.body if chain else ()
    where = None
    if len(inner) == 1 and isinstance(inner[0], If) and inner[0].otherwise is None:
        where, inner = inner[0].cond, inner[0].then.body
    step = inner[0] if len(inner) == 1 and isinstance(inner[0], Accumulate) else None
    return chain, step, where


def _walks_rows(last: For, chain: list[For], step: Accumulate) -> bool:
    """Whether a sum or product over `chain` runs better with `last` innermost: `last` is serial
    (the parallel loop stays outside), at least two points long, the reads' last index steps by
    one with it, and no read's last index moves with a reduction variable."""
    rvars = {loop.var for loop in chain}
    return (step.op in ("sum", "prod") and bool(chain) and last.kind is Kind.SERIAL and last.hi - last.lo >= 2
            and unit_stride(step.value, last.var)
            and not any(n.index and free_vars(n.index[-1]) & rvars for n in walk(step.value) if isinstance(n, Load)))
