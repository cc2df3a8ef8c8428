"""Compute where read, instead of storing and reading back: a Func in its reader (forward fusion,
`inline_stages`), and an intermediate adjoint in the adjoints that read it (`inline_adjoints`).
Both ask one cost model, `worth_recomputing`, whether an expression is worth computing at each of
its reads instead of once into a buffer.

Every Func is a loop nest and a buffer: `hd.sum(...) / 9` is a sum written out, then read again
to divide it; `ops.sum(x * x)` writes the squares before it sums them; a pooling of a relu
writes the relu. Each such pass over memory costs as much as the computation around it. The
adjoints repeat the pattern: the `adj_sum[j] = adj_avg[j] / 9` of an average, the
`adj_y[j] * (x[j] > 0)` of a relu.

A Func is inlined into its reader when nothing else needs it stored: it is not an output, it is
not among the buffers the driver names as `needed` (for the forward a gradient runs after,
`ad.read_by_gradients`: every buffer the reverse-mode scatters of the program read, for every
input, a superset of what any gradient kernel reads; for a plain call's forward, none), and it is
not a max or min (their gradients read the stored argmax). A plain copy of another buffer
(`f[i] = b[i]`) is read from that buffer by all its readers; any other Func has one reader, and:

* a pointwise Func is inlined when the cost model agrees (a relu under a 2x2/2 pooling window or a
  3x3 blur, the squares under a sum; not an exp under a 5x5 window);
* a sum or product is inlined into a pointwise reader that reads it once, at its own point (the
  division of a box filter's sum).

Neither side may be a BLAS contraction: its loads must stay plain loads for BLAS to read. A read
of the Func checked at run time (a data-dependent index) keeps it stored: the check is against the
Func's shape, which inlining would lose.
"""
from __future__ import annotations

import math
from collections.abc import Callable
import functools
from dataclasses import replace

from halide_ad.ir import Bin, Call, Const, Expr, Func, Load, Op, Program, Reduce, Select, adjoint_name, const, dtype_of
from halide_ad.runtime.contract import Contraction, formula
from halide_ad.runtime.plans import AdjointPlan, map_values, reads, values
from halide_ad.runtime.route import with_engine
from halide_ad.solver import Fallback, Gather
from halide_ad.solver.bounds import checked_at_run_time
from halide_ad.traverse import children, loads, rewrite, simplify, substitute, walk

# ---- the cost model ---------------------------------------------------------------------------

MAX_NODES = 200  # inlined into one another, a reshape's div/mod indices multiply in size
MAX_WORK = 64  # operations per stored point, recomputed: the cost of a pass over memory
MAX_LOADS = 2  # recomputed, a value's loads repeat too: each tap of a window would load them all
_CHEAP_CALLS = ("neg", "not", "abs", "stop_gradient")
DIVISION = 4  # a float division costs about four multiplications (throughput, vectorized)
INDEX_DIVISION = 2  # an integer // or % by a constant: a multiplication and a shift, and a sign fix


def worth_recomputing(value: Expr, times: float) -> bool:
    """Whether to compute `value` at each of its reads instead of storing it once and reading it
    back, when its reads evaluate each of its points `times` times on average.

    Storing costs a pass over memory: a write, and a read per use. Evaluated at most once per
    point, recomputing always wins, unless the expression is so large that the reader's compile
    time grows (MAX_NODES). Evaluated more often, it wins while the arithmetic redone, `times` x
    the value's operations (its indices' included), stays under MAX_WORK, the value loads few
    buffers, and it has no math function, power or integer division by a variable (tens of cycles
    each, not vectorized). A relu under a 3x3 window: 9; an average's `adj * (1/25)` under its
    5x5 window: 25, recomputed (stored, that gradient ran about 1.5x slower); a zero or reflect
    padding under a 3x3 convolution (a test and an index fold per tap): over 64, stored; an exp
    under any window: stored."""
    if len(list(walk(value))) > MAX_NODES:
        return False
    if times <= 1:
        return True
    work = _work(value)
    return (work is not None and times * max(1, work) <= MAX_WORK
            and sum(1 for n in walk(value) if isinstance(n, Load)) <= MAX_LOADS)


def _work(e: Expr) -> int | None:
    """The operations that evaluating `e` takes, None if one of them is costly."""
    if isinstance(e, Bin) and e.op in (Op.FLOORDIV, Op.MOD):
        if not isinstance(e.rhs, Const):
            return None
        total = INDEX_DIVISION
    elif (isinstance(e, Bin) and e.op is Op.POW) or (isinstance(e, Call) and e.fn not in _CHEAP_CALLS):
        return None
    else:
        total = DIVISION if isinstance(e, Bin) and e.op is Op.DIV else int(isinstance(e, (Bin, Call, Select)))
    for c in children(e):
        work = _work(c)
        if work is None:
            return None
        total += work
    return total


# ---- Funcs -----------------------------------------------------------------------------------


def inline_stages(program: Program, is_contraction: Callable[[Func], bool],
                  needed: set[str] | None) -> tuple[Func, ...]:
    """`program`'s Funcs, each one that need not be stored inlined into its reader (see the module's
    doc). `needed`: the buffers to store besides the outputs (what gradients read, for the
    forward a gradient runs after), None to store them all.
    Inlining into a reader updates it before it is itself considered."""
    if needed is None:
        return program.funcs
    keep = needed | set(program.outputs)
    funcs, out = list(program.funcs), []
    for k in range(len(funcs)):
        f = funcs[k]  # with what was inlined into it
        readers = [j for j in range(k + 1, len(funcs)) if _loads_of(funcs[j].body, f.name)]
        if f.name not in keep and readers and _copy_inlinable(f, [funcs[j] for j in readers], is_contraction):
            for j in readers:
                funcs[j] = replace(funcs[j], body=_inlined(funcs[j].body, f))
            continue
        if (f.name in keep or len(readers) != 1 or f.keeps_argindex or is_contraction(f)
                or is_contraction(funcs[readers[0]]) or not _inlinable(f, funcs[readers[0]])):
            out.append(f)
            continue
        reader = funcs[readers[0]]
        funcs[readers[0]] = replace(reader, body=_inlined(reader.body, f))
    return tuple(out)


def _loads_of(e: Expr, name: str) -> list[Load]:
    return [n for n in loads(e) if n.buffer == name]


def _reductions(e: Expr) -> list[Reduce]:
    return [n for n in walk(e) if isinstance(n, Reduce)]


def _copy_inlinable(f: Func, readers: list[Func], is_contraction: Callable[[Func], bool]) -> bool:
    """Whether `f` is a plain copy, `f[i] = b[i]` (the copy of an argument that a gradient or jvp
    taken while tracing differentiates: halide_ad/retrace.py, halide_ad/forward.py), which every
    reader can read from b instead, however many there are: a load for a load, and one pass over
    memory less."""
    if not (isinstance(f.body, Load) and f.body.index == f.vars and f.body.dtype == f.dtype):
        return False
    return not any(is_contraction(r) or any(checked_at_run_time(e) for n in _loads_of(r.body, f.name)
                                            for e in n.index) for r in readers)


def _inlinable(f: Func, reader: Func) -> bool:
    reads = _loads_of(reader.body, f.name)
    if any(map(checked_at_run_time, (e for n in reads for e in n.index))):
        return False  # the check is against f's shape: inlined, f's own reads would go unchecked
    if _reductions(f.body):
        if any(r.op not in ("sum", "prod") for r in _reductions(f.body)):
            return False
        inside_reductions = [n for r in _reductions(reader.body) for n in _loads_of(r, f.name)]
        return (len(reads) == 1 and not inside_reductions and f.shape == reader.shape
                and reads[0].index == reader.vars and worth_recomputing(f.body, 1))
    times = math.prod(reader.shape) * _evaluations(reader.body, f.name) / max(1, math.prod(f.shape))
    return worth_recomputing(f.body, times)


def _evaluations(e: Expr, name: str) -> int:
    """How many times one point of the reader evaluates loads of `name`: each load once, times the
    terms of every reduction around it (a window over a Func reads each of its points once per
    window that covers it)."""
    if isinstance(e, Load) and e.buffer == name:
        return 1
    inside = sum(_evaluations(c, name) for c in children(e))
    return inside * math.prod(rv.hi - rv.lo for rv in e.rvars) if isinstance(e, Reduce) else inside


def _inlined(body: Expr, f: Func) -> Expr:
    """`body` with every load of `f` replaced by `f`'s value there. (Tracing names every
    reduction variable uniquely, and renames a pure variable that has one's name, so `f`'s
    reduction variables cannot capture the reader's.)"""
    def rule(n: Expr) -> Expr | None:
        if isinstance(n, Load) and n.buffer == f.name:
            return substitute(f.body, dict(zip(f.vars, n.index, strict=True)))
        return None
    return rewrite(body, rule)


# ---- adjoints --------------------------------------------------------------------------------

def inline_adjoints(plans: list[AdjointPlan], wrt: tuple[str, ...]) -> list[AdjointPlan]:
    """Don't store an intermediate adjoint that is one cheap expression per element (the
    `adj_sum[j] = adj_avg[j] / 9` of an average, the `adj_y[j] * (x[j] > 0)` of a relu): the
    adjoints that read it compute it where they read it, saving a pass over memory."""
    out = list(plans)
    scanned = {adjoint_name(p.adjoint.scan.update.name) for p in plans if p.adjoint.scan is not None}
    for k, plan in enumerate(out):
        name = adjoint_name(plan.adjoint.buffer)
        if name in scanned:  # an update's backward run reads it whole (runtime/lower_updates.py)
            continue
        value = _pointwise_value(plan, wrt)
        later = out[k + 1:]
        blas_reads = any(isinstance(c, Contraction) and reads(c.inverse.scatter.value, name)
                         for p in later for c in p.contributions)
        if blas_reads and _copy_of_stored(plan, value, out[:k]):
            # a copy of a stored adjoint (a bias's `adj_sum[j] = adj_y[j]`): BLAS reads that one
            out[k] = replace(plan, inlined=True)
            out[k + 1:] = [replace(p, contributions=tuple(_reading(c, name, value.buffer)
                                                          for c in p.contributions)) for p in later]
            continue
        if value is None or blas_reads:
            continue
        readers = [c for p in later for c in p.contributions if any(reads(v, name) for v in values(c))]
        if not worth_recomputing(value, _adjoint_evaluations(readers, name, plan.adjoint.shape)):
            continue

        def inline(e, plan=plan, value=value, name=name):
            def rule(n):
                if isinstance(n, Load) and n.buffer == name:
                    return substitute(value, dict(zip(plan.new_vars, n.index, strict=True)))
                return None
            return simplify(rewrite(e, rule))
        out[k] = replace(plan, inlined=True)
        out[k + 1:] = [replace(p, contributions=tuple(map_values(c, inline) for c in p.contributions))
                       for p in later]
    return out


def _copy_of_stored(plan: AdjointPlan, value: Expr | None, earlier: list[AdjointPlan]) -> bool:
    """Whether `value`, the adjoint's at each point, is another adjoint's at the same point, of the
    same shape and dtype, stored (or the cotangent itself)."""
    if not (isinstance(value, Load) and value.index == plan.new_vars and value.dtype == plan.adjoint.dtype):
        return False
    return any(adjoint_name(p.adjoint.buffer) == value.buffer and not p.inlined
               and p.adjoint.shape == plan.adjoint.shape and (p.contributions or p.adjoint.seeded)
               for p in earlier)


def _reading(c, old: str, new: str):
    """Contribution `c` reading buffer `new` where it read `old` (at the same points)."""
    def rename(e: Expr) -> Expr:
        return rewrite(e, lambda n: replace(n, buffer=new) if isinstance(n, Load) and n.buffer == old
                       else None)

    if not isinstance(c, Contraction):
        return map_values(c, rename)
    inverse = map_values(c.inverse, rename)
    inverse = replace(inverse, scatter=replace(inverse.scatter, value=rename(inverse.scatter.value)))
    shapes = tuple(dict((new if n == old else n, shape) for n, shape in c.shapes).items())
    return with_engine(replace(c, a=rename(c.a), b=None if c.b is None else rename(c.b), shapes=shapes,
                               inverse=inverse, formula=formula(c.out, c.out_index, inverse.scatter.value),
                               padded=tuple(replace(p, source=rename(p.source)) for p in c.padded)))


def _adjoint_evaluations(readers: list[Gather | Fallback], name: str, shape: tuple[int, ...]) -> float:
    """How many times the readers evaluate each point of adjoint `name` on average: each reader's
    scatter evaluates its value once per point of its domain (a window's gather, once per tap)."""
    total = 0
    for c in readers:
        extents = [r.extent for r in c.scatter.domain]
        if not all(isinstance(n, int) for n in extents):
            return math.inf
        total += math.prod(extents) * len(_loads_of(c.scatter.value, name))
    return total / max(1, math.prod(shape))


def _pointwise_value(plan: AdjointPlan, wrt) -> Expr | None:
    """The value of adj_<buffer>[new_vars] when it is one cheap expression with no loop or test."""
    adj = plan.adjoint
    if adj.buffer in wrt or adj.seeded or len(plan.contributions) != 1:
        return None
    (g,) = plan.contributions
    if not isinstance(g, Gather) or len(g.pieces) != 1:
        return None
    (piece,) = g.pieces
    tests = []  # in order: a loop's `lo < hi` comes before the tests that read at its point
    while piece.loops:  # a loop that runs at most once (a pooling window at a ragged edge)
        if not piece.single[0]:
            return None
        tests.append(Bin(Op.LT, piece.loops[0].lo, piece.loops[0].hi))
        piece = piece.fixing(0, piece.loops[0].lo)
    tests += piece.guards[0]  # tests on j alone, e.g. a relu's x[j] > 0
    if not tests:
        return piece.value
    return Select(functools.reduce(lambda a, b: Bin(Op.AND, a, b), tests), piece.value,
                  const(0, dtype_of(piece.value)))
