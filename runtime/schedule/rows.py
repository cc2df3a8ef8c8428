"""interchange_rows: a sum or product whose reads walk memory with the output's last dimension runs
a row at a time, that dimension's loop inside the reduction's loops. The gradient's version:
`gathers_by_rows` (whether an adjoint's windows run so) and `column_blocks` (how a 1-D one run so
splits into blocks of columns that run in parallel), which runtime/gathers.py follows; and
`taps_by_rows`, whether an interior box's windows run a row at a time, the window's loops outside
the row's (HALIDE_AD_SKIP=taps_by_rows turns it off).

Point by point, the reduction would stride across rows for every element of the output (a mean
over the channels of NCHW ran 6x slower than numpy). Each element still takes its terms in
reduction order, so the result is the same bits.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from halide_ad import config
from halide_ad.ir import Expr, Load, Reduce, Var
from halide_ad.runtime.loops import Accumulate, Allocate, Element, For, If, Kind, Let, Local, Stmt, Store, block
from halide_ad.runtime.schedule.accumulate import unit_stride
from halide_ad.runtime.schedule.driver import decision
from halide_ad.runtime.schedule.parallel import parallel_min_points, perfect_loops
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


@decision()
def gathers_by_rows(vars_, shape, gathers) -> bool:
    """Whether an adjoint's windows run with its last variable's loop innermost
    (`gathers.emit_row_gathers`): the windows' reads walk memory with that variable, none with a
    window variable, no guard and no window bound depends on it. A layer norm's gain gradient,
    `adj_g[j] += adj_y[i, j] * xhat[i, j]` over i, walked every column across 4096 rows."""
    if not vars_ or shape[-1] < 2:
        return False
    last, pieces = vars_[-1], [p for g in gathers for p in g.pieces]
    windows = [p for p in pieces if p.loops]
    if not windows or any(c for p in pieces for level in p.guards for c in level):
        return False
    if any(isinstance(b, Expr) and last in free_vars(b) for p in windows for loop in p.loops
           for b in (loop.lo, loop.hi)):
        return False
    return any(unit_stride(p.value, last) for p in windows) and not any(
        n.index and free_vars(n.index[-1]) & {loop.var for loop in p.loops}
        for p in windows for n in walk(p.value) if isinstance(n, Load))


@decision()
def taps_by_rows(var: Var, gathers, written: str) -> bool:
    """Whether an interior box's gathers run a row of `var` (the adjoint's last variable) at a
    time, each window's loops outside the loop over the row, adding into the row
    (the `tap_rows` pass): some window reads memory with `var`, and no piece has a guard, a loop
    proved to run once, a window bound that moves with `var`, a reduction inside, or a read of
    `written`. Each point adds its terms in the same order, so the bits do not change; point by
    point, a convolution's input gradient (72 taps) summed one scalar chain that LLVM left
    unvectorized, and a row at a time ran that box in 57-60 us instead of 99-101 (d1dfb0b)."""
    if config.skipped("taps_by_rows"):
        return False
    pieces = [p for g in gathers for p in g.pieces]
    windows = [p for p in pieces if p.loops]
    return (any(unit_stride(p.value, var) for p in windows)
            and not any(c for p in pieces for level in p.guards for c in level)
            and not any(any(p.single) or any(isinstance(b, Expr) and var in free_vars(b)
                                             for loop in p.loops for b in (loop.lo, loop.hi)) for p in pieces)
            and not any(isinstance(n, Reduce) or isinstance(n, Load) and n.buffer == written
                        for p in pieces for n in walk(p.value)))


# The fewest columns a thread takes of a 1-D adjoint run a row at a time: a 4 KiB page of float32
# per row. A block reads its stretch of every row; a stretch shorter than a page restarts the
# hardware prefetcher row after row. A layer norm gain's gradient over (4096, 1024) float32 took
# 7.6-10 ms on two threads in 8 blocks of 128 columns, 3.8-7 ms in 2 of 512, and 1.0-1.2 ms on
# one thread sweeping whole rows (the same bits: each column adds its rows in order either way).
COLUMN_BLOCK = 1024
COLUMN_BLOCKS = 16  # the most blocks it splits into (parallel_for hands them to the threads)


@decision()
def column_blocks(shape: tuple[int, ...], terms: float) -> int | None:
    """How many blocks of columns a 1-D adjoint run a row at a time splits into, to run in
    parallel; None for serial (short, or not 1-D: those run in parallel over their rows). Each
    column adds its terms in the same order either way, so the bits do not change. Rows of
    fewer than 2 * COLUMN_BLOCK run on one thread, whole (a layer norm's gain gradient over
    rows of 1024: see COLUMN_BLOCK)."""
    if len(shape) != 1 or shape[0] < 2 * COLUMN_BLOCK or terms < parallel_min_points():
        return None
    return min(shape[0] // COLUMN_BLOCK, COLUMN_BLOCKS)
