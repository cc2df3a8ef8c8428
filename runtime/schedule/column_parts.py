"""column_parts: a sum over the rows (a layer norm gain's gradient, `adj_g[j] += adj_y[i, j] *
xhat[i, j]` over i) folded into the row group that runs before it, as partial column sums per
fixed block of rows, while each row is in cache; runtime/kernels.py writes the blocks' loop and
the combination.

Run after the group, the sum is one more pass over its rows (~1.3 ms of layer norm's backward
over (4096, 1024) float32, on one thread). Folded, block b adds its rows in order into row b of a
float64 buffer of the kernel's own, and the blocks' rows are added in order after the group: the
blocks depend on the row count alone, so the result does not depend on the thread count. The
order of the terms is not that of the pass after the group: the bits of such a gradient change.

A bias's gradient (`adj_b[j] += adj_y[i, j]`, layer norm's shift) is routed to numpy's sum, a
pass after the kernel (~0.55 ms over (4096, 1024) float32); the compiler offers its gather to
the kernel before it (`emit_backward`'s `optional`), which keeps it where it folds here.
"""
from __future__ import annotations

from dataclasses import dataclass

from halide_ad import config
from halide_ad.ir import Const, Load, Var, adjoint_name
from halide_ad.runtime.schedule.boundary import piece_exprs
from halide_ad.runtime.schedule.driver import decision
from halide_ad.runtime.schedule.rfactor import MAX_PARTS
from halide_ad.runtime.schedule.rows import gathers_by_rows
from halide_ad.traverse import substitute, walk

MIN_BLOCK = 64  # rows of a block at the least: fewer, and the partial rows cost more than the pass
# rows whose terms a block adds into its partial row per pass over it, where they divide the
# block: each column's partial sum is loaded and stored once per ROWS_AT_ONCE rows, and takes
# their terms summed in order in the terms' type (one conversion and one float64 add per column,
# not one per row; runtime/kernels.py). Layer norm's backward over (4096, 1024) on one thread,
# CPU time, at 3fb195a: 5.96-6.05 -> 5.53-5.54 ms (HALIDE_AD_SKIP=rows_at_once: one row at a time).
ROWS_AT_ONCE = 4


@dataclass(frozen=True, slots=True)
class Blocks:
    """The group's rows in `count` blocks of `size`."""
    count: int
    size: int


def row_blocks(rows: int) -> Blocks | None:
    """The most blocks (at most MAX_PARTS, as `rfactor`) of at least MIN_BLOCK rows that divide
    `rows` evenly, or None where fewer than two do."""
    count = next((n for n in range(min(MAX_PARTS, rows // MIN_BLOCK), 1, -1) if rows % n == 0), None)
    return None if count is None else Blocks(count, rows // count)


@decision()
def column_parts(computed, gathers, group: range, depth: int) -> int:
    """How many adjoints of `computed` right after the row group `group` (adjoints over `depth`
    leading dimensions) fold into it (see the module's doc): 1-D adjoints, not seeded, that
    would run a row at a time (`gathers_by_rows`), each piece summing over exactly the group's
    rows with no guard, reading the group's adjoints only at the row it sums. 0 where the
    group runs over more than one dimension or its rows do not split into blocks, or with
    HALIDE_AD_SKIP=column_parts."""
    first = computed[group.start]
    if config.skipped("column_parts") or depth != 1 or row_blocks(first.adjoint.shape[0]) is None:
        return 0
    rows = first.adjoint.shape[0]
    written = {adjoint_name(computed[m].adjoint.buffer) for m in group}
    folded: set[str] = set()  # complete only after the group: a later one may not read them
    for m in range(group.stop, len(computed)):
        plan, gs = computed[m], gathers[m]
        if not (len(plan.adjoint.shape) == 1 and not plan.adjoint.seeded and gs
                and len(plan.contributions) == len(gs) and gathers_by_rows(plan.new_vars, plan.adjoint.shape, gs)
                and all(_sums_rows(p, rows, written, folded) for g in gs for p in g.pieces)):
            break
        folded.add(adjoint_name(plan.adjoint.buffer))
    return len(folded)


def _sums_rows(piece, rows: int, written: set[str], folded: set[str]) -> bool:
    """Whether gather `piece` adds one term per row over [0, rows), unguarded, reading the
    adjoints `written` only at that row and none of `folded`."""
    if len(piece.loops) != 1 or any(c for level in piece.guards for c in level):
        return False
    (loop,) = piece.loops
    if tuple(b.value if isinstance(b, Const) else b for b in (loop.lo, loop.hi)) != (0, rows):
        return False
    reads = [n for e in piece_exprs(piece) for n in walk(e) if isinstance(n, Load)]
    return all(n.buffer not in folded and (n.buffer not in written or n.index[:1] == (loop.var,)) for n in reads)


def row_term(piece, row: Var):
    """The term that `piece` (one of `column_parts`' pieces) adds at the group's `row`."""
    return substitute(piece.value, {piece.loops[0].var: row})
