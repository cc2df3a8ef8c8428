"""hoist_loads: a gather loop nest's iteration reads the loads it can once, at its top, and the
indices they share once, before them (`loads_to_hoist` chooses them).

Without this, a store between two phases makes LLVM read again and not vectorize. An index that
two hoisted loads share is computed once, before them: numba's compile time grows with every
operation, and an edge of a bilinear gradient reads 12 loads at 4 columns. `hoist` writes the
decision into an iteration's statements: `ix<k> = ...` and `h<k> = ...` Lets at their top, the
statements reading those locals.
"""
from __future__ import annotations

import collections

from halide_ad.ir import INDEX_DTYPE, Bin, Expr, Load, Reduce, Var
from halide_ad.runtime.loops import Hoisted, Let, Local, Row, Stmt, block, map_exprs
from halide_ad.runtime.schedule.driver import decision, said
from halide_ad.solver.bounds import checked_at_run_time, interval
from halide_ad.traverse import map_children, walk


@decision(lambda chosen: f"loads {said(chosen[1])}, indices {said(chosen[0])}")
def loads_to_hoist(gathers, ranges: dict[Var, tuple[int, int]], shapes: dict[str, tuple[int, ...]],
                   written: str) -> tuple[list[Bin], list[Load]]:
    """(the indices computed once, the loads read once) for an iteration of a loop nest over
    `ranges` (inclusive, per loop variable bound at or outside the point the loads are read at)
    running `gathers`: every load of their pieces that depends only on those variables (none of
    a loop inside that point, of a piece's window, nor of a reduction nested in it: each changes
    within the iteration), reads a buffer other than the one `written`, and is in range for all
    of them (`shapes`), so that reading it even where a guard fails is safe; and the compound
    indices that two or more of those share."""
    chosen: dict[Load, None] = {}
    for g in gathers:
        for piece in g.pieces:
            for e in [piece.value, *(c for level in piece.guards for c in level)]:
                inner = {r.var for r in piece.loops} | {r.var for n in walk(e) if isinstance(n, Reduce)
                                                        for r in n.rvars}
                for n in walk(e):
                    if (isinstance(n, Load) and n not in chosen and n.buffer != written and n.index
                            and not any(isinstance(m, Var) and (m in inner or m not in ranges)
                                        for i in n.index for m in walk(i))
                            and all(_within(i, shapes[n.buffer][d], ranges) for d, i in enumerate(n.index))):
                        chosen[n] = None
    shared = collections.Counter(i for n in chosen for i in dict.fromkeys(n.index) if isinstance(i, Bin))
    return [i for i, count in shared.items() if count > 1], list(chosen)


def _within(e: Expr, n: int, ranges) -> bool:
    if checked_at_run_time(e):
        return False
    span = interval(e, ranges)
    return span is not None and 0 <= span[0] and span[1] < n


def hoist(shared: list[Bin], loads: list[Load]) -> tuple[list[Let], dict[Expr, Local]]:
    """(the Lets that compute the `shared` indices into `ix<k>` and read the `loads` into `h<k>`
    (`loads_to_hoist`'s choice), each reading the locals before it (`ix1 = ix0 + 1`); what each
    local replaces, for `reading`)."""
    env: dict[Expr, Local] = {}
    lets = []
    for name, e in [(f"ix{k}", i) for k, i in enumerate(shared)] + [(f"h{k}", n) for k, n in enumerate(loads)]:
        value = substituted(e, env)
        lets.append(Let(Hoisted(name, e.dtype, e) if isinstance(e, Load) else Local(name, INDEX_DTYPE), value))
        env[e] = lets[-1].var
    return lets, env


def hoist_loads(s: Stmt, gathers, ranges: dict[Var, tuple[int, int]], shapes: dict[str, tuple[int, ...]],
                written: str) -> Stmt:
    """`s`, an iteration of `gathers` over `ranges` writing buffer `written`, with the loads that
    `loads_to_hoist` chooses read once at its top, and the indices they share computed once."""
    lets, env = hoist(*loads_to_hoist(gathers, ranges, shapes, written))
    return block(*lets, reading(s, env))


def reading(s: Stmt, env: dict[Expr, Expr]) -> Stmt:
    """`s` with each expression of `env` (loads, indices, variables) replaced by its value, the
    outermost first: a hoisted load is read from its local whole, not at a hoisted index."""
    return map_exprs(s, lambda e: substituted(e, env)) if env else s


_KEYS = (Load, Bin, Var)


def substituted(e: Expr, env: dict[Expr, Expr]) -> Expr:
    """`e` with its outermost subexpressions that are keys of `env` replaced (a row a lane fold
    reads keeps its first load, whose indices are replaced)."""
    if type(e) in _KEYS and e in env:  # (a lookup hashes a whole subtree: only where a key may be)
        return env[e]
    if isinstance(e, Row):
        return Row(map_children(e.first, lambda c: substituted(c, env)))
    return map_children(e, lambda c: substituted(c, env)) if isinstance(e, Expr) else e
