"""hoist_loads: the loads a gather loop nest's iteration reads once, at its top, and the indices
they share.

Without this, a store between two phases makes LLVM read again and not vectorize. An index that
two hoisted loads share is computed once, before them: numba's compile time grows with every
operation, and an edge of a bilinear gradient reads 12 loads at 4 columns. runtime/gathers.py
writes the decision as `ix<k> = ...` and `h<k> = ...` Lets at the top of the iteration.
"""
from __future__ import annotations

import collections

from halide_ad.ir import Bin, Expr, Load, Reduce, Var
from halide_ad.solver.bounds import checked_at_run_time, interval
from halide_ad.traverse import walk


def hoist_loads(gathers, ranges: dict[Var, tuple[int, int]], shapes: dict[str, tuple[int, ...]],
                written: str) -> tuple[list[Bin], list[Load]]:
    """(the indices computed once, the loads read once) for an iteration of a loop nest over
    `ranges` (inclusive, per loop variable) running `gathers`: every load of their pieces that
    depends only on the loop variables (none of a piece's window, nor of a reduction nested in
    it), reads a buffer other than the one `written`, and is in range for all of them (`shapes`),
    so that reading it even where a guard fails is safe; and the compound indices that two or
    more of those share."""
    chosen: dict[Load, None] = {}
    for g in gathers:
        for piece in g.pieces:
            for e in [piece.value, *(c for level in piece.guards for c in level)]:
                inner = {r.var for r in piece.loops} | {r.var for n in walk(e) if isinstance(n, Reduce)
                                                        for r in n.rvars}
                for n in walk(e):
                    if (isinstance(n, Load) and n not in chosen and n.buffer != written and n.index
                            and not any(isinstance(m, Var) and m in inner for i in n.index for m in walk(i))
                            and all(_within(i, shapes[n.buffer][d], ranges) for d, i in enumerate(n.index))):
                        chosen[n] = None
    shared = collections.Counter(i for n in chosen for i in dict.fromkeys(n.index) if isinstance(i, Bin))
    return [i for i, count in shared.items() if count > 1], list(chosen)


def _within(e: Expr, n: int, ranges) -> bool:
    if checked_at_run_time(e):
        return False
    span = interval(e, ranges)
    return span is not None and 0 <= span[0] and span[1] < n
