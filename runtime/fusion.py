"""Forward fusion: a Func computed where its one reader reads it, instead of stored and read back.

Every Func is a loop nest and a buffer: `hd.sum(...) / 9` is a sum written out, then read again
to divide it; `ops.sum(x * x)` writes the squares before it sums them; a pooling of a relu
writes the relu. Each such pass over memory costs as much as the computation around it.

A Func is inlined into its reader when nothing else needs it stored: it is not an output, no
gradient reads it (`ad.read_by_gradients`: every buffer the reverse-mode scatters of the program
read, for every input, a superset of what any gradient kernel reads), and it is not a max or min
(their gradients read the stored argmax). It has one reader, and:

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
from dataclasses import replace

from halide_ad.ir import Call, Expr, Func, Load, Program, Reduce
from halide_ad.solver.bounds import checked_at_run_time
from halide_ad.traverse import children, loads, rewrite, substitute, walk

MAX_RECOMPUTED = 9  # evaluations of each point of a cheap pointwise Func, inlined
CHEAP_NODES = 16  # a pointwise Func this small (and free of math functions) is cheap to recompute
_CHEAP_CALLS = ("neg", "not", "abs", "stop_gradient")


def inline_stages(program: Program, is_contraction: Callable[[Func], bool],
                  needed: set[str] | None) -> tuple[Func, ...]:
    """`program`'s Funcs, each one that need not be stored inlined into its reader (see the module's
    doc). `needed`: the buffers a gradient reads (`ad.read_by_gradients`), None to store them all.
    Inlining into a reader updates it before it is itself considered."""
    if needed is None:
        return program.funcs
    keep = needed | set(program.outputs)
    funcs, out = list(program.funcs), []
    for k in range(len(funcs)):
        f = funcs[k]  # with what was inlined into it
        readers = [j for j in range(k + 1, len(funcs)) if _loads_of(funcs[j].body, f.name)]
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
