"""pointwise_phases: a pointwise definition that reads through quotients or parities of its
innermost variables (`x[i // 2]`, a 2x upsampling; a bilinear weight's `i % 2 == 0`) runs split
as the gradient's gathers are (boundary.py), those dimensions in phases j = s*q + p, in each of
which every quotient is q + a constant and every parity test is decided, so that the loads are
unit-stride and the loop vectorizes. runtime/kernels.py writes the phases' loops
(`gathers.split_loop_nest`)."""
from __future__ import annotations

from halide_ad.ir import Bin, Const, Func, Op, Reduce
from halide_ad.solver import Gather, GatherPiece
from halide_ad.runtime.schedule.boundary import Split, interior
from halide_ad.traverse import free_vars, walk


def pointwise_phases(f: Func) -> Split | None:
    """The Split that runs pointwise `f` in phases, or None where there are no phases to run, or
    a phase's definition would need a guard or a loop."""
    if isinstance(f.body, Reduce) or not f.vars or not any(
            isinstance(n, Bin) and n.op in (Op.FLOORDIV, Op.MOD) and isinstance(n.rhs, Const)
            and f.vars[-1] in free_vars(n.lhs) for n in walk(f.body)):
        return None  # phases start from the innermost dimension: without its quotient, no schedule to ask
    split = interior(f.vars, f.shape, [as_gather(f)])
    if split is None or not split.phased:
        return None
    gathers = [g for gs in split.phases.values() for g in gs] + [g for _, gs in split.outside for g in gs]
    if any(len(g.pieces) != 1 or g.pieces[0].loops or any(g.pieces[0].guards) for g in gathers):
        return None
    return split


def as_gather(f: Func) -> Gather:
    """A pointwise definition as a gather of one term, which the schedule splits as it does
    the gradient's."""
    return Gather(None, f.vars, (GatherPiece((), ((),), f.body, ()),))
