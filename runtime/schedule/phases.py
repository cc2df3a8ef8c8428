"""pointwise_split: a pointwise definition run split as the gradient's gathers are (boundary.py),
in either of two cases, for the same reason (a loop with no per-element branch, unit-stride loads,
that vectorizes):

* it reads through quotients or parities of its innermost variables (`x[i // 2]`, a 2x upsampling;
  a bilinear weight's `i % 2 == 0`): those dimensions run in phases j = s*q + p, in each of which
  every quotient is q + a constant and every parity test is decided;
* it is a sum of terms some of which are `select(<a linear test of its variables>, value, 0)` (the
  gather pieces that a gradient taken while tracing writes back, halide_ad/retrace.py): those
  tests are its pieces' guards, decided in the interior box and folded in each region around it.

runtime/kernels.py writes the split's loops (`gathers.split_loop_nest`)."""
from __future__ import annotations

from halide_ad.ir import Bin, Const, Expr, Func, Load, Op, Reduce, Select
from halide_ad.solver import Gather, GatherPiece
from halide_ad.runtime.schedule.boundary import Split, interior
from halide_ad.runtime.schedule.driver import decision, said_split
from halide_ad.traverse import free_vars, walk


@decision(said_split)
def pointwise_split(f: Func) -> Split | None:
    """The Split that runs pointwise `f` in phases or around an interior box, or None where there
    is neither to run, or a phase's or region's definition would still need a guard or a loop."""
    if isinstance(f.body, Reduce) or not f.vars:
        return None
    guarded = _guarded(f)
    if guarded is None and not any(
            isinstance(n, Bin) and n.op in (Op.FLOORDIV, Op.MOD) and isinstance(n.rhs, Const)
            and f.vars[-1] in free_vars(n.lhs) for n in walk(f.body)):
        return None  # phases start from the innermost dimension: without its quotient, no schedule to ask
    split = interior(f.vars, f.shape, [guarded or as_gather(f)])
    if split is None or not (split.phased or guarded):
        return None
    gathers = [g for gs in split.phases.values() for g in gs] + [g for _, gs in split.outside for g in gs]
    if any(p.loops or any(p.guards) for g in gathers + split.inside for p in g.pieces):
        return None
    return split


def as_gather(f: Func) -> Gather:
    """A pointwise definition as a gather of one term, which the schedule splits as it does
    the gradient's."""
    return Gather(None, f.vars, (GatherPiece((), ((),), f.body, ()),))


def _guarded(f: Func) -> Gather | None:
    """`f`'s body, a sum t1 + t2 + ... (added left to right, as retrace.py writes it), as a gather
    with one piece per term, a `select(test, value, 0)`'s test its guards, where one term is such a
    select over f's variables alone; else None. The pieces' values summed left to right in order,
    those whose guards hold, are the body's sum (with `+ 0` left out)."""
    terms: list[Expr] = []
    e = f.body
    while isinstance(e, Bin) and e.op is Op.ADD:
        terms.append(e.rhs)
        e = e.lhs
    terms.append(e)
    pieces = tuple(_piece(t, f) for t in reversed(terms))
    return Gather(None, f.vars, pieces) if any(p.guards[0] for p in pieces) else None


def _piece(term: Expr, f: Func) -> GatherPiece:
    if (isinstance(term, Select) and isinstance(term.false, Const) and term.false.value == 0
            and free_vars(term.cond) and free_vars(term.cond) <= set(f.vars) and not any(
                isinstance(n, (Load, Reduce)) or isinstance(n, Bin) and n.op in (Op.FLOORDIV, Op.MOD)
                for n in walk(term.cond))):
        return GatherPiece((), (_conjuncts(term.cond),), term.true, ())
    return GatherPiece((), ((),), term, ())


def _conjuncts(e: Expr) -> tuple[Expr, ...]:
    if isinstance(e, Bin) and e.op is Op.AND:
        return _conjuncts(e.lhs) + _conjuncts(e.rhs)
    return (e,)
