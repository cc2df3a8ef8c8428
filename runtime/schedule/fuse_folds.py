"""fuse_folds: consecutive nests' lane folds over the same rows run as one pass over the rows.

A row group runs its adjoints one after another, each in its own nest over the row. Where two
of them each fold a row sum of the same rows and length (layer norm's gradient: adj_var's
ct * g * (x - m) and adj_mean's ct * g, both over the cotangent's and the gain's rows), the
second fold moves into the first nest, beside the first fold: one `lanes.sums_of_all` call reads
the rows once a round for both, and the product they share is computed once. The second nest
then takes its lanes from the first's pass. Each fold adds the same terms in the same order:
the same bits.

It applies where both folds sit in their nests under the same one-iteration loops and tests (no
else), have the same op, length and lanes type, read rows of one type in place (no row of terms
written first), and the second reads nothing that the first nest writes, nor anything its own
nest writes before it, and starts from constant lanes. Comments and allocations (a staged
pair's plane) may stand between the two nests: the moved fold reads no local array.
"""
from __future__ import annotations

from dataclasses import replace

from halide_ad.ir import Const
from halide_ad.runtime.loops import Block, Element, Fold, Folds, For, If, Lanes, LanesOf, Let, Local, Row, Spans, Stmt, Term
from halide_ad.runtime.schedule.row_sums import fuse_consecutive, read_names, single_sites, written_names
from halide_ad.traverse import rewrite, walk as walk_expr

MAX_ROWS = 6  # rows of one pass: each a vector load a round, in registers beside the folds' lanes


def fuse_folds(s: Stmt) -> Stmt:
    """`s` with each lane fold that the module's conditions allow moved into the nest before it."""
    def fuse(first, second, _, tag):
        fused = _fused(first, second, tag)
        if fused is None:
            return None
        first, lets, second = fused
        return [*lets, first], second  # the moved fold's lanes, set before its new nest
    return fuse_consecutive(s, fuse)


def _fold_site(body: tuple[Stmt, ...], k: int) -> bool:
    """Whether body[k] is a Let of a Fold or Folds."""
    return isinstance(body[k], Let) and isinstance(body[k].value, (Fold, Folds))


def _folds(value) -> tuple[Fold, ...]:
    return value.folds if isinstance(value, Folds) else (value,)


def _reads(fold: Fold) -> set[str] | None:
    """What a fold reads (`row_sums.read_names`), or None where it reads a local (a row of terms,
    a hoisted value), which the nest it leaves may have set."""
    exprs = (*fold.rows, *(() if fold.terms is None else (fold.terms,)))
    if any(isinstance(n, (Local, Element)) for e in exprs for n in walk_expr(e)):
        return None
    return set().union(*map(read_names, exprs))


def _fused(first: Stmt, second: Stmt, tag: int) -> tuple[Stmt, list[Stmt], Stmt] | None:
    """(first with second's first fold beside its last one, the Lets of the moved fold's lanes,
    second taking those lanes), or None where the module's conditions fail."""
    mine, theirs = list(single_sites(first, _fold_site)), list(single_sites(second, _fold_site))
    if not mine or not theirs:
        return None
    (where, home, k), (their_where, there, j) = mine[-1], theirs[0]
    let, their_let = home.body[k], there.body[j]
    if where != their_where or not isinstance(their_let.value, Fold):
        return None
    folds, fold = _folds(let.value), their_let.value
    rows = list(folds[0].rows)
    reads = _reads(fold)
    if (reads is None or fold.op != folds[0].op or (fold.lo, fold.hi) != (folds[0].lo, folds[0].hi)
            or fold.lanes.dtype != folds[0].lanes.dtype or not all(isinstance(r, Row) for r in (*rows, *fold.rows))
            or len({r.dtype for r in (*rows, *fold.rows)}) != 1):
        return None
    inits = {n.var: n.value for n in there.body[:j] if isinstance(n, Let) and isinstance(n.var, Local)}
    if (reads & (written_names(first) | written_names(Block(there.body[:j])))
            or not all(isinstance(inits.get(q), Const) for q in fold.lanes.locals)):
        return None
    position = {}
    for r in fold.rows:
        if r not in rows:
            rows.append(r)
        position[fold.rows.index(r)] = rows.index(r)
    if len(rows) > MAX_ROWS:
        return None
    terms = Term(position[0], fold.rows[0].dtype) if fold.terms is None else \
        rewrite(fold.terms, lambda n: Term(position[n.k], n.dtype) if isinstance(n, Term) else None)
    moved = Lanes(tuple(Local(f"{q.name}_with{tag}", q.dtype) for q in fold.lanes.locals))
    pass_ = Folds(tuple(replace(f, rows=tuple(rows), terms=f.terms if f.terms is not None else Term(0, f.rows[0].dtype))
                        for f in folds) + (Fold(fold.op, tuple(rows), fold.lo, fold.hi, moved, terms),))
    targets = let.var.lanes if isinstance(let.var, LanesOf) else (let.var,)
    first = _replace(first, home, k, [Let(LanesOf((*targets, moved)), pass_)])
    lets = [Let(q, inits[p]) for q, p in zip(moved.locals, fold.lanes.locals, strict=True)]
    dead = set(fold.lanes.locals)
    kept = [n for n in there.body[:j] if not (isinstance(n, Let) and n.var in dead)]
    second = _replace(second, there, j, [Let(fold.lanes, moved)], kept)
    return first, lets, second


def _replace(s: Stmt, target: Block, k: int, stmts: list[Stmt], before: list[Stmt] | None = None) -> Stmt:
    """`s` with `target.body[k]` (target: a Block inside s, by identity) replaced by `stmts`, and
    with `before` in place of the statements before it, where given."""
    if s is target:
        head = list(s.body[:k]) if before is None else before
        return Block((*head, *stmts, *s.body[k + 1:]))
    match s:
        case Block(body):
            return Block(tuple(_replace(c, target, k, stmts, before) for c in body))
        case For(body=body) | Spans(body=body):
            return replace(s, body=_replace(body, target, k, stmts, before))
        case If(_, then, otherwise):
            return replace(s, then=_replace(then, target, k, stmts, before),
                           otherwise=otherwise and _replace(otherwise, target, k, stmts, before))
    return s
