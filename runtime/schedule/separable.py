"""separable_window: whether a Split's separable window (boundary.py finds it) runs as two passes
over a ring of rows, and the ring's size; the pass `separable` rewrites the box's loops so."""
from __future__ import annotations

from dataclasses import replace

from halide_ad import config
from halide_ad.affine import Affine
from halide_ad.ir import INDEX_DTYPE, Const, Expr, Op, Var
from halide_ad.runtime.loops import (Allocate, Block, Chain, Comment, Element, For, IfElse, Kind, Let, Point, Stmt,
                                     block, weighted_sums)
from halide_ad.runtime.schedule.driver import decision

MAX_SEPARABLE_TEMP = 1 << 18  # elements of a separable window's ring of rows: its rows stay in cache


def ring_rows(sep) -> int:
    """The rows of a separable window's temporary: a ring of a power of two, at least the source
    rows one output row reads, so that a row's slot is `row & (ring - 1)`."""
    offsets = [r for r, _ in sep.rows]
    return 1 << (max(offsets) - min(offsets)).bit_length()


@decision()
def separable_window(split, shape: tuple[int, ...], first: int, par: int | None) -> bool:
    """Whether the box's last two dimensions (i, j) run as the split's separable window's two
    passes: it has one, the box's loops start at or before i (`first`), neither i nor j is the
    parallel dimension `par` (each thread would need a ring of its own), and the ring of rows
    fits MAX_SEPARABLE_TEMP; not where HALIDE_AD_SKIP names separable_window."""
    if config.skipped("separable_window"):
        return False
    i, j = len(shape) - 2, len(shape) - 1
    return (split.separable is not None and first <= i and par not in (i, j)
            and ring_rows(split.separable) * shape[j] <= MAX_SEPARABLE_TEMP)


def separable(s: Stmt, sep, window: str) -> Stmt:
    """`s`, a gather loop nest's box, with its innermost two loops (over i, then j, serial,
    around a Point of the box's gathers) as the two passes of the Separable window `sep`: each
    source row it reads, filtered along j into a ring of rows (a local array named `window`),
    then, per output row, the ring's rows summed along i, each point a Point of those terms.
    Each output row filters only the source rows the previous one did not read, so the ring
    stays in L1 and each source row is read from memory once (one temporary for the whole plane,
    then a second pass over it, ran bilinear's gradient 15% slower)."""
    match s:
        case For(body=Block((For(body=Block((Point(),))) as inner,))):
            return _two_passes(s, inner, sep, window)
        case For(body=Block((only,))):
            return replace(s, body=block(separable(only, sep, window)))
    return s


def _two_passes(rows: For, cols: For, sep, window: str) -> Stmt:
    i, j, dtype = rows.var, cols.var, sep.src.dtype
    first_row = min(r for r, _ in sep.rows)
    span = max(r for r, _ in sep.rows) - first_row + 1
    fresh = min(sep.row_stride, span)  # the rows an output row reads that the one before did not
    mask = ring_rows(sep) - 1
    k = Var("row")

    def affine(coeffs: dict[Var, int], c: int = 0) -> Expr:
        return Affine.of(coeffs, c).to_expr()

    def ring(row: Expr) -> Element:
        """The ring's slot for source row `row` (of the ring's numbering), at column j."""
        return Element(window, (Chain(Op.AND, (row, Const(mask, INDEX_DTYPE))), affine({j: 1}, -cols.lo)), dtype)

    lead = sep.src.index[:-2]
    source_row = affine({k: 1}, sep.row_stride * rows.lo + first_row)  # row k of the ring's numbering
    taps = [(replace(sep.src, index=lead + (source_row, affine({j: sep.col_stride}, c))), weight)
            for c, weight in sep.cols]
    first = -sep.row_stride * rows.lo  # output row i reads ring rows row_stride * i + first ... + span - 1
    start, stop = (affine({i: sep.row_stride}, first + n) for n in (span - fresh, span))
    if span > fresh:  # the first output row filters all its rows (one loop: numba compiles the body once)
        start = IfElse(Chain(Op.EQ, (i, Const(rows.lo, INDEX_DTYPE))), Const(0, INDEX_DTYPE), start)
    filtered = For(k, start, stop, Kind.SERIAL, block(replace(cols, body=block(
        Let(ring(k), Chain(Op.ADD, tuple(weighted_sums(taps, dtype))))))))
    point = Point((), tuple((ring(affine({i: sep.row_stride}, first + r - first_row)), weight) for r, weight in sep.rows),
                  dtype)
    summed = replace(cols, body=block(point))
    return block(Comment(f"separable window: {len(sep.rows)} rows x {len(sep.cols)} columns, rows first"),
                 Allocate(window, (mask + 1, cols.hi - cols.lo), dtype),
                 replace(rows, body=block(filtered, summed)))
