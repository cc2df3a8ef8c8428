"""Update definitions -> loop nests (runtime/loops.py), at the rung solver/updates.py chose
(docs/updates.md), and their adjoints run backwards (`ir.ReverseScan`).

Each update is a kernel of its own; each nest below is what that kernel runs:
* rung 1 and 4 (`in_order`): the previous stage copied into the new buffer, then loops over the
  pure variables (the outermost PARALLEL), then over the rdom (PARALLEL too at rung 1 when its
  points are independent, else SERIAL in lexicographic order);
* rung 2 (`gathered`): each element, in PARALLEL, sums the previous stage's value and the pieces of
  the inverted scatter that write it, as the gradients' gathers do (`lower.gather_piece`);
* rung 3 (`partitioned`): a fixed number of partitions of the rdom in PARALLEL, each summing into
  bins of its own (`bins_buffer`) at every pure point, then each element adds the partitions' bins
  in partition order (a SERIAL loop), so the bits never depend on the thread count;
* a scan's adjoint (`reverse_scan`): the rdom in REVERSED lexicographic order.
A write whose index reads data is tested before it is made: out of range, it is skipped and the
run fails (`Fail`), as data-dependent reads do. A taped update stores what each point overwrites
(`ir.tape_name`) just before it writes.
"""
from __future__ import annotations

import math
from collections.abc import Callable

from halide_ad.ir import (INDEX_DTYPE, Bin, Buffer, Const, Expr, Load, Op, ReverseScan, Update, Var, adjoint_name,
                          tape_name)
from halide_ad.runtime.lower import gather_piece
from halide_ad.runtime.loops import Accumulate, Block, Fail, If, Kind, Let, Local, Stmt, Store, block, nest
from halide_ad.ir import show
from halide_ad.solver.bounds import box, checked_at_run_time, interval, is_data_dependent
from halide_ad.solver.updates import Schedule, combine

ZERO = Const(0, INDEX_DTYPE)  # (stored into a float buffer, as numba converts it)


def _box(vs: tuple[Var, ...], dims: tuple[int, ...]) -> list[tuple[Var, int, int, Kind]]:
    """The loops over [0, dims), the first parallel where it has more than one iteration."""
    return [(v, 0, n, Kind.PARALLEL if d == 0 and n > 1 else Kind.SERIAL)
            for d, (v, n) in enumerate(zip(vs, dims, strict=True))]


def bins_buffer(u: Update, s: Schedule) -> Buffer:
    """Rung 3's partial bins: one copy of the tensor per partition."""
    return Buffer(f"{u.name}_bins", (s.partitions,) + (u.shape or (1,)), u.dtype)


def tape_buffer(u: Update) -> Buffer:
    """What a taped update overwrites, at each point of its domain."""
    return Buffer(tape_name(u.name), tuple(r.hi - r.lo for r in u.pure + u.rdom) or (1,), u.dtype)


def copy(dst: str, src: str, shape: tuple[int, ...], dtype: str) -> Stmt:
    """dst = src, element by element (parallel over the first dimension)."""
    cs = tuple(Var(f"c{d}__") for d in range(len(shape or (1,))))
    return nest(_box(cs, shape or (1,)), Store(dst, cs, Load(src, cs, dtype)))


def point(u: Update) -> tuple[Expr, ...]:
    """The position of the current point in a buffer over the update's domain (the tape)."""
    return tuple(r.var if not r.lo else Bin(Op.SUB, r.var, Const(r.lo, INDEX_DTYPE)) for r in u.pure + u.rdom)


def _written(u: Update) -> tuple[Var, ...]:
    """The variables `w<d>__` that hold the element a point writes."""
    return tuple(Var(f"w{d}__") for d in range(len(u.index)))


def _at_written(u: Update, at: tuple[Var, ...], body: Stmt) -> Stmt:
    """Where the update's predicate holds: `at` = the written element, then `body`."""
    s = block(*(Let(w, e) for w, e in zip(at, u.index, strict=True)), body)
    return s if u.where is None else If(u.where, s)


def write(u: Update, store: Callable[[tuple[Var, ...]], Stmt]) -> Stmt:
    """Where the update's predicate holds: the written element's indices into variables, each
    tested when it reads data (or z3 could not bound it), then `store(those variables)`."""
    at = _written(u)
    ranges = box(u.pure + u.rdom)
    s = store(at)
    for d in reversed([d for d, e in enumerate(u.index) if _needs_check(e, u.shape[d], ranges)]):
        kind = "a data-dependent index" if is_data_dependent(u.index[d]) else "an index z3 could not bound"
        message = (f"{kind} was {{value}}, outside dimension {d} of {u.prev} (valid: 0..{u.shape[d] - 1}), written "
                   f"at {u.loc or show(u.index[d])}. Clamp the index (hd.clamp) or fix the index data.")
        outside = Bin(Op.OR, Bin(Op.LT, at[d], ZERO), Bin(Op.GE, at[d], Const(u.shape[d], INDEX_DTYPE)))
        s = If(outside, block(Fail(message, at[d])), block(s))
    return _at_written(u, at, s)


def _needs_check(e: Expr, n: int, ranges) -> bool:
    """A data-dependent write index, unless its clamps alone keep it inside."""
    if not checked_at_run_time(e):
        return False
    iv = interval(e, ranges)
    return iv is None or iv[0] < 0 or iv[1] >= n


def in_order(u: Update, s: Schedule) -> Block:
    """Rungs 1 and 4: the copy, then the update's points, parallel over the first pure variable
    (or the first rdom variable, where the rdom's points are independent)."""
    parallel = 0 if u.pure or s.parallel_rdom else None
    loops = [(r.var, r.lo, r.hi, Kind.PARALLEL if k == parallel and r.hi - r.lo > 1 else Kind.SERIAL)
             for k, r in enumerate(u.pure + u.rdom)]

    def store(at: tuple[Var, ...]) -> Stmt:
        tape = [Store(tape_name(u.name), point(u), Load(u.name, at, u.dtype))] if u.taped else []
        return block(*tape, Store(u.name, at, u.value))

    return block(copy(u.name, u.prev, u.shape, u.dtype), nest(loops, write(u, store)))


def gathered(u: Update, s: Schedule) -> Stmt:
    """Rung 2: name[j] = prev[j] + each piece of the inverted scatter at j, parallel over j."""
    js = s.gather.new_vars
    acc = Local("acc", u.dtype)
    body = block(Let(acc, Load(u.prev, js, u.dtype)), *(gather_piece(p, acc) for p in s.gather.pieces),
                 Store(u.name, js, acc))
    return nest(_box(js, u.shape), body)


def partitioned(u: Update, s: Schedule) -> Block:
    """Rung 3: partition k of the rdom's points in lexicographic order (a flat position p), at
    each pure point, sums into bins[k]; then each element adds bins[0], bins[1], ... to the
    previous stage's value."""
    op, operand = combine(u)
    bins = bins_buffer(u, s).name
    dims = u.shape or (1,)
    k, p = Var("k__"), Var("p__")
    js = tuple(Var(f"j{d}__") for d in range(len(dims)))
    points = math.prod(r.hi - r.lo for r in u.rdom)
    chunk = -(-points // s.partitions)
    start = Bin(Op.MUL, k, Const(chunk, INDEX_DTYPE))
    stop = Bin(Op.MIN, Bin(Op.ADD, start, Const(chunk, INDEX_DTYPE)), Const(points, INDEX_DTYPE))
    coords, stride = [], points
    for n, r in enumerate(u.rdom):  # the flat position p as the rdom's point
        stride //= r.hi - r.lo
        c = p if stride == 1 else Bin(Op.FLOORDIV, p, Const(stride, INDEX_DTYPE))
        c = c if n == 0 else Bin(Op.MOD, c, Const(r.hi - r.lo, INDEX_DTYPE))  # (p // stride < the first extent)
        coords.append(Let(r.var, c if not r.lo else Bin(Op.ADD, Const(r.lo, INDEX_DTYPE), c)))
    into_bins = write(u, lambda at: Accumulate(Load(bins, (k, *(at or (ZERO,))), u.dtype), operand,
                                               augmented=True))  # (a 0-d tensor: its one bin)
    rows = [(r.var, r.lo, r.hi, Kind.SERIAL) for r in u.pure]  # (a partition's part of every row)
    fill = nest([(k, 0, s.partitions, Kind.PARALLEL)], block(
        nest([(j, 0, n, Kind.SERIAL) for j, n in zip(js, dims, strict=True)], Store(bins, (k, *js), ZERO)),
        nest(rows + [(p, start, stop, Kind.SERIAL)], block(*coords, into_bins))))
    acc = Local("acc", u.dtype)
    total = block(Let(acc, Load(u.name, js, u.dtype)),
                  nest([(k, 0, s.partitions, Kind.SERIAL)], Let(acc, Bin(op, acc, Load(bins, (k, *js), u.dtype)))),
                  Store(u.name, js, acc))
    return block(copy(u.name, u.prev, u.shape, u.dtype), fill, nest(_box(js, dims), total))


def forward(u: Update, s: Schedule) -> Stmt:
    """The nest of update `u` at the rung of schedule `s`."""
    return gathered(u, s) if s.rung == 2 else partitioned(u, s) if s.rung == 3 else in_order(u, s)


def reverse_scan(scan: ReverseScan) -> Block:
    """`ir.ReverseScan`: adj_<prev> starts as adj_<update> (a taped update's working copy as the
    final tensor); the pure points in parallel, the rdom in reverse lexicographic order, where
    the predicate holds: the written element's adjoint moves to adj_<writes>[point], and each
    term adds its contribution."""
    u = scan.update
    adj, writes = adjoint_name(u.prev), adjoint_name(scan.writes)
    loops = _box(tuple(r.var for r in u.pure), tuple(r.hi for r in u.pure)) + [
        (r.var, r.lo, r.hi, Kind.REVERSED) for r in u.rdom]

    at, here = _written(u), point(u)  # (the written element untested: the forward run tested it)
    state = ([Store(adjoint_name(scan.state), at, Load(tape_name(u.name), here, u.dtype))]
             if scan.state is not None else [])  # the tensor as it was before this point wrote it
    terms = [Accumulate(Load(adj, t.index, u.dtype, t.loc), t.value, augmented=True) for t in scan.terms]
    terms = [a if t.where is None or t.where == u.where else If(t.where, block(a))
             for a, t in zip(terms, scan.terms, strict=True)]
    step = block(*state, Store(writes, here, Load(adj, at, u.dtype)), Store(adj, at, ZERO),
                 *(Store(adjoint_name(name), here, value) for name, value in scan.stored), *terms)
    copies = [copy(adj, adjoint_name(u.name), u.shape, u.dtype)]
    if scan.state is not None:
        copies.append(copy(adjoint_name(scan.state), u.name, u.shape, u.dtype))
    return block(*copies, nest(loops, _at_written(u, at, step)))
