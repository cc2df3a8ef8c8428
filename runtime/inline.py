"""Compute where read, instead of storing and reading back: a Func in its reader (forward fusion,
`inline_stages`), and an intermediate adjoint in the adjoints that read it (`inline_adjoints`).

Forward fusion: a Func computed where its one reader reads it, instead of stored and read back.

Every Func is a loop nest and a buffer: `hd.sum(...) / 9` is a sum written out, then read again
to divide it; `ops.sum(x * x)` writes the squares before it sums them; a pooling of a relu
writes the relu. Each such pass over memory costs as much as the computation around it.

A Func is inlined into its reader when nothing else needs it stored: it is not an output, it is
not among the buffers the driver names as `needed` (for the forward a gradient runs after,
`ad.read_by_gradients`: every buffer the reverse-mode scatters of the program read, for every
input, a superset of what any gradient kernel reads; for a plain call's forward, none), and it is
not a max or min (their gradients read the stored argmax). A plain copy of another buffer
(`f[i] = b[i]`) is read from that buffer by all its readers; any other Func has one reader, and:

* a pointwise Func is inlined where the reader evaluates each of its points once on average (a
  relu under a 2x2/2 pooling window, the squares under a sum), or up to MAX_RECOMPUTED times when
  it is cheap (a relu under a 3x3 blur); an exp under a 5x5 window stays stored;
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

from halide_ad.ir import Bin, Call, Expr, Func, Load, Op, Program, Reduce, Select, adjoint_name, const, dtype_of
from halide_ad.runtime.contract import Contraction, formula
from halide_ad.runtime.plans import AdjointPlan, map_values, reads, values
from halide_ad.runtime.route import with_engine
from halide_ad.solver import Fallback, Gather
from halide_ad.solver.bounds import checked_at_run_time
from halide_ad.traverse import children, larger_than, loads, rewrite, simplify, substitute, walk

MAX_RECOMPUTED = 9  # evaluations of each point of a cheap pointwise Func, inlined
CHEAP_NODES = 16  # a pointwise Func this small (and free of math functions) is cheap to recompute
_CHEAP_CALLS = ("neg", "not", "abs", "stop_gradient")


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
                and reads[0].index == reader.vars)
    times = math.prod(reader.shape) * _evaluations(reader.body, f.name) / max(1, math.prod(f.shape))
    return times <= 1 or (times <= MAX_RECOMPUTED and _cheap(f.body))


def _evaluations(e: Expr, name: str) -> int:
    """How many times one point of the reader evaluates loads of `name`: each load once, times the
    terms of every reduction around it (a window over a Func reads each of its points once per
    window that covers it)."""
    if isinstance(e, Load) and e.buffer == name:
        return 1
    inside = sum(_evaluations(c, name) for c in children(e))
    return inside * math.prod(rv.hi - rv.lo for rv in e.rvars) if isinstance(e, Reduce) else inside


def _cheap(e: Expr) -> bool:
    nodes = list(walk(e))
    return len(nodes) <= CHEAP_NODES and not any(
        isinstance(n, Call) and n.fn not in _CHEAP_CALLS for n in nodes)


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

MAX_INLINED_LOADS = 2  # per tap of a window that reads an inlined adjoint
MAX_INLINED_NODES = 200  # a reshape's div/mod index: inlined into the next one, the sizes multiply


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
        if value is None or blas_reads or larger_than([value], MAX_INLINED_NODES):
            continue

        readers = [c for p in later for c in p.contributions if any(reads(v, name) for v in values(c))]
        windows = any(isinstance(c, Fallback) or any(piece.loops for piece in c.pieces) for c in readers)
        if windows and not (_cheap_per_tap(value) and sum(isinstance(n, Load) for n in walk(value)) <= MAX_INLINED_LOADS):
            continue  # a window would recompute it once per tap: store it once instead

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


def _cheap_per_tap(e: Expr) -> bool:
    """No division, power or transcendental function: a few cycles to recompute per tap."""
    return not any((isinstance(n, Bin) and n.op in (Op.DIV, Op.POW, Op.FLOORDIV, Op.MOD))
                   or (isinstance(n, Call) and n.fn not in ("neg", "not", "abs")) for n in walk(e))


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
