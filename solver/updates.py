"""How an update definition may run (see docs/updates.md): the highest rung that z3 proves gives
the serial order's result.

1. parallel: over every pure variable (they never touch each other's elements, by the front end's
   rule), and over the rdom when z3 proves that distinct rdom points write distinct elements and
   none reads what another writes;
2. gather: `t[e(r)] += v(r)` with an affine e whose writes collide (`out[r // 2] += x[r]`), which
   the index inverter turns into a gather, as it does reverse mode's scatters;
3. partial bins: `t[e(r)] += v(r)` (or -=) where neither e nor v reads t, the writes may collide
   (a histogram, or a few rows' histograms), and t is small next to the rdom: a fixed number of
   partitions of the rdom each fill bins of their own, summed in partition order, so the bits never
   depend on the thread count;
4. serial: the rdom's points in lexicographic order (parallel over the pure variables still).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import z3

from halide_ad.errors import BoundsError
from halide_ad.ir import RUN_TIME_CHECKED, Call, Load, Op, Scatter, Update, Var, const
from halide_ad.update_ad import combine, is_own_read, reads_self
from halide_ad.solver.bounds import UNSETTLED, box, checked_at_run_time, out_of_range
from halide_ad.solver.invert import Gather, invert
from halide_ad.solver.z3_bridge import Query, Unsupported
from halide_ad.traverse import simplify, substitute, walk

PARTITIONS = 16  # rung 3's fixed partition count: more than the cores of most machines, few bins each


@dataclass(frozen=True)
class Schedule:
    rung: int                       # 1 to 4 (see the module's doc)
    parallel_rdom: bool             # rung 1: the rdom's points are independent too
    reason: str                     # for hd.explain
    partitions: int = 0             # rung 3
    gather: Gather | None = None    # rung 2: each element sums the points that write it


def schedule(u: Update) -> Schedule:
    if not u.rdom:
        return Schedule(1, True, "no reduction domain: every point is written once, in parallel over "
                                 + _names(u.pure) if u.pure else "a single point")
    if u.independent:
        return Schedule(1, True, "z3 proves that distinct rdom points write distinct elements and read "
                                 "nothing another point writes: parallel over "
                                 + _names(u.pure + u.rdom))
    c = combine(u)
    gather = _as_gather(u, c)
    if gather is not None:
        return Schedule(2, False, f"an affine accumulation that z3 inverts: each element of {u.prev} sums "
                                  "the rdom points that write it (a gather, parallel over the elements)",
                        gather=gather)
    points = math.prod(r.hi - r.lo for r in u.rdom)  # at each pure point
    rows = math.prod(r.hi - r.lo for r in u.pure)  # the pure points, each with bins of its own
    size = math.prod(u.shape)
    pure = f"; parallel over {_names(u.pure)}" if u.pure else ""
    # Partial bins below PARTITIONS rows (pure points): from there on the rows alone keep the threads
    # busy, each summed in the serial order. Chosen from the shapes, never the thread count, so the
    # bits never change. All the rows' bins must be few next to one row's points: a bilateral
    # grid's splat (2M cells, 4M pixels a channel) stays at rung 4, whose copy is all it allocates.
    few_bins = rows < PARTITIONS and points >= 2 * PARTITIONS and size * PARTITIONS <= max(4 * points, 2 ** 16)
    if (c is not None and c[0] in (Op.ADD, Op.SUB) and few_bins
            and not any(reads_self(u, e) for e in u.index) and not reads_self(u, u.where)):
        each = f" (at each point of {_names(u.pure)})" if u.pure else ""
        return Schedule(3, False, f"writes may collide (the index `{', '.join(map(str, u.index))}` is not "
                                  f"one-to-one), so {PARTITIONS} fixed partitions of the rdom{each} each sum "
                                  "into bins of their own, added in partition order: the same bits on any "
                                  "number of threads", PARTITIONS)
    if c is not None and c[0] in (Op.ADD, Op.SUB) and not reads_self(u, c[1]):
        why = ("an accumulation whose writes may collide; partial bins are for long reductions into few "
               f"bins, at fewer than {PARTITIONS} pure points" if not few_bins
               else "an accumulation whose index reads the tensor")
    elif reads_self(u, u.value) or any(reads_self(u, e) for e in u.index):
        why = "reads of the tensor being updated may see another rdom point's write (a scan)"
    else:
        why = "writes may collide (which one survives depends on the order)"
    tape = "; it records what each point overwrites, for the gradient" if u.taped else ""
    return Schedule(4, False, f"serial over the rdom in lexicographic order: {why}{pure}{tape}")


def _as_gather(u: Update, c) -> Gather | None:
    """Rung 2: `t[e(p)] += v(p)` with an affine e (no data in it) and neither e nor v reading t,
    inverted as reverse mode's scatters are (solver/invert.py): t[j] = t0[j] + the sum of v(p)
    over {p : e(p) == j}."""
    if (c is None or c[0] not in (Op.ADD, Op.SUB) or any(checked_at_run_time(e) or reads_self(u, e) for e in u.index)
            or reads_self(u, u.where) or reads_self(u, c[1])):
        return None
    new_vars = tuple(Var(f"{u.name}_j{d}") for d in range(len(u.shape)))
    operand = c[1] if c[0] is Op.ADD else Call("neg", (c[1],))
    result = invert(Scatter(u.name, u.index, operand, u.pure + u.rdom, u.where, u.loc), u.shape, new_vars)
    return result if isinstance(result, Gather) else None


def _names(ranges) -> str:
    return ", ".join(r.var.name for r in ranges)


def independent_rdom(u: Update) -> bool:
    """z3 proves: two distinct rdom points (at one pure point) write distinct elements, and
    neither reads the element the other writes."""
    if not u.rdom:
        return True  # one write per pure point, and pure points are disjoint by construction
    if any(reads_self(u, e) for e in u.index) or reads_self(u, u.where):
        return False  # indices computed from the changing tensor: no static answer
    reads = [n for n in walk(u.value) if isinstance(n, Load) and n.buffer == u.name]
    q = Query()
    try:
        a, b = _two_points(q, u)
        q.add(q.either(*(a[r.var] != b[r.var] for r in u.rdom)))
        write_a = [q.to_z3(e, a) for e in u.index]
        clash = [_all_equal(q, write_a, [q.to_z3(e, b) for e in u.index])]
        clash += [_all_equal(q, write_a, [q.to_z3(e, b) for e in load.index]) for load in reads]
        q.add(q.either(*clash))
    except Unsupported:
        return False
    return q.check() == "unsat"


def _two_points(q: Query, u: Update) -> tuple[dict, dict]:
    """Two points of `u`'s domain in `q`: the same pure variables (pure points never touch each
    other's elements), rdom variables of their own, each in range and where `where` holds."""
    a = {r.var: q.var(r.var) for r in u.pure + u.rdom}
    b = dict(a) | {r.var: q.var(r.var, "_other") for r in u.rdom}
    for point in (a, b):
        for r in u.pure + u.rdom:
            q.add(r.lo <= point[r.var], point[r.var] < r.hi)
        if u.where is not None:
            q.add(q.to_z3(u.where, point))
    return a, b


def reversible(u: Update) -> bool:
    """z3 proves what running `u` backwards for its adjoint needs: distinct points write distinct
    elements, and a read of the tensor at any other element than the one being written is never
    of an element that this point or a later one (in the rdom's order) writes, so it sees the
    element's final value."""
    if not u.rdom or any(reads_self(u, e) for e in u.index) or reads_self(u, u.where):
        return False
    others = [n for n in walk(u.value) if isinstance(n, Load) and n.buffer == u.name and not is_own_read(u, n)]
    q = Query()
    try:
        a, b = _two_points(q, u)
        write_a = [q.to_z3(e, a) for e in u.index]
        collide = z3.And(z3.Or(*(a[r.var] != b[r.var] for r in u.rdom)),
                         _all_equal(q, write_a, [q.to_z3(e, b) for e in u.index]))
        later = _not_before(q, [a[r.var] for r in u.rdom], [b[r.var] for r in u.rdom])
        stale = [z3.And(later, _all_equal(q, write_a, [q.to_z3(e, b) for e in load.index])) for load in others]
        q.add(z3.Or(collide, *stale))
    except Unsupported:
        return False
    return q.check() == "unsat"


def _not_before(q: Query, a: list, b: list):
    """a >= b in lexicographic order."""
    terms, equal = [], []
    for x, y in zip(a, b, strict=True):
        terms.append(z3.And(*equal, x > y))
        equal.append(x == y)
    return z3.Or(*terms, z3.And(*equal))


def _all_equal(q: Query, xs, ys):
    return z3.And(*(x == y for x, y in zip(xs, ys, strict=True))) if xs else z3.BoolVal(True, q.ctx)


def check_write_bounds(u: Update) -> Update:
    """`u`, once every write is proved inside the tensor; a data-dependent write index is left to
    the kernel's run-time check (as is one z3 could not settle, marked RUN_TIME_CHECKED); an
    affine write that can leave the tensor is a BoundsError."""
    domain = u.pure + u.rdom
    conds = (u.where,) if u.where is not None else ()
    index = list(u.index)
    for d, (e, n) in enumerate(zip(u.index, u.shape, strict=True)):
        example = out_of_range(e, n, domain, conds, box(domain))
        if example is None:
            continue
        if example is UNSETTLED:
            index[d] = Call(RUN_TIME_CHECKED, (e,))
            continue
        at = ", ".join(f"{k} = {v}" for k, v in example.items())
        bad = simplify(substitute(e, {Var(k): const(v) for k, v in example.items()}))
        raise BoundsError(f"the update of {u.prev} writes index {bad} of dimension {d} (valid: 0..{n - 1}) "
                          f"with `{e}` when {at}. Shrink the hd.rdom's range, or clamp the index "
                          "(hd.clamp) so that every write stays inside", u.loc)
    return dataclasses.replace(u, index=tuple(index)) if index != list(u.index) else u
