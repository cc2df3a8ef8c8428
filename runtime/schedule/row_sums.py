"""fuse_row_sums: the rows of terms of consecutive lane folds written by one loop over the row.

`split_accumulators` writes a long sum's terms that a fold cannot compute itself (a math
function's, as tanh's) to a row on the stack in a loop of their own, then folds the row
(`lane_rounds`: an Allocate, the loop, a Fold). In a row group, consecutive adjoints that each
sum such a row (of y = (x - mean) * tanh(x) * s, adj_s's and adj_mean's, both reading the
cotangent's row and tanh(x)) made one such loop over the row each. Where the second's terms
read nothing that the first nest writes, nor anything its own nest writes before them, and both
loops run under the same enclosing loops (each of one iteration) and tests, the second's terms
join the first's loop: one pass over the row writes both rows, and each is folded where it
was. Every term is computed and folded as before: the same bits.
"""
from __future__ import annotations

from dataclasses import replace

from halide_ad.ir import Expr, Load, Var
from halide_ad.runtime.loops import (Accumulate, Allocate, Block, Comment, Element, For, If, Kind, Lanes, Let, Local, Spans,
                                     Stmt, Store, children, map_exprs, walk)
from halide_ad.traverse import map_children, substitute, walk as walk_expr


def fuse_row_sums(s: Stmt) -> Stmt:
    """`s` with the terms loop of each lane fold (`lane_rounds`) moved into the terms loop of the
    nest before it where the module says it may: one loop writing both rows."""
    def fuse(first, second, between, _):
        fused = _fused(first, second, between)
        return None if fused is None else ([fused[0]], fused[1])
    return fuse_consecutive(s, fuse)


def fuse_consecutive(s: Stmt, fuse) -> Stmt:
    """`s` with each statement offered, with the nest before it (past comments and allocations),
    to `fuse(first, second, between, tag)`: None, or (the statements that take first's place,
    second's new form). `between`: the local arrays allocated between the two; `tag`: a number no
    other call of this pass gets, for new names. (`fuse_folds` runs on this too.)"""
    match s:
        case Block(body):
            out: list[Stmt] = []
            for stmt in (fuse_consecutive(c, fuse) for c in body):
                before = [k for k, c in enumerate(out) if not isinstance(c, (Comment, Allocate))]
                if before:
                    k = before[-1]
                    between = {c.array for c in out[k + 1:] if isinstance(c, Allocate)}
                    if (fused := fuse(out[k], stmt, between, len(out))) is not None:
                        out[k:k + 1], stmt = fused
                out.append(stmt)
            return Block(tuple(out))
        case For(body=body) | Spans(body=body):
            return replace(s, body=fuse_consecutive(body, fuse))
        case If(_, then, otherwise):
            return replace(s, then=fuse_consecutive(then, fuse), otherwise=otherwise and fuse_consecutive(otherwise, fuse))
    return s


def single_sites(s: Stmt, pick, where: tuple = ()):
    """(where, block, k) for each `block.body[k]` in `s` that pick(block.body, k) takes, reached
    through loops of one iteration and tests without an else: `where` those loops' ranges and the
    tests, outermost first. (`fuse_folds` finds its folds with this too.)"""
    match s:
        case Block(body):
            for k, c in enumerate(body):
                if pick(body, k):
                    yield where, s, k
                else:
                    yield from single_sites(c, pick, where)
        case For(var, lo, hi, kind, body, step) if isinstance(lo, int) and isinstance(hi, int) and hi - lo == 1:
            yield from single_sites(body, pick, (*where, ("for", _name(var), lo, hi, kind, step)))
        case If(cond, then, None):
            yield from single_sites(then, pick, (*where, ("if", cond)))


def _terms_loop(body: tuple[Stmt, ...], k: int) -> bool:
    """Whether body[k] is a serial loop that only writes its iteration's element of rows on the
    stack that body allocates before it."""
    loop = body[k]
    rows = {a.array for a in body[:k] if isinstance(a, Allocate) and a.stack}
    return (isinstance(loop, For) and loop.kind is Kind.SERIAL and loop.step == 1 and bool(loop.body.body)
            and all(isinstance(n, Let) and isinstance(n.var, Element) and n.var.array in rows
                    and len(n.var.index) == 1 for n in loop.body.body))


def _fused(first: Stmt, second: Stmt, between: set[str]) -> tuple[Stmt, Stmt] | None:
    """(first, second) with second's first terms loop moved into first's last one, or None where
    the module's conditions fail; `between`: the local arrays allocated between the two."""
    mine, theirs = list(single_sites(first, _terms_loop)), list(single_sites(second, _terms_loop))
    if not mine or not theirs:
        return None
    (where, home, k), (their_where, there, j) = mine[-1], theirs[0]
    loop, their_loop = home.body[k], there.body[j]
    if where != their_where or (loop.lo, loop.hi) != (their_loop.lo, their_loop.hi):
        return None
    opened = {w[1] for w in where if w[0] == "for"} | {_name(loop.var), _name(their_loop.var)}
    lets = their_loop.body.body
    read = {name for n in lets for name in read_names(n.value)} - opened
    if read & (written_names(first) | between | written_names(second, skip=their_loop)):
        return None
    taken = {a.array for a in (*walk(first), *walk(second)) if isinstance(a, Allocate)}
    rename: dict[str, str] = {}
    for n in lets:  # (each row a name of its own: both nests call theirs acc_terms32)
        k = 2
        while f"{n.var.array}_{k}" in taken:
            k += 1
        rename[n.var.array] = f"{n.var.array}_{k}"
        taken.add(rename[n.var.array])
    var = loop.var if isinstance(loop.var, Var) else Var(loop.var)
    their_var = their_loop.var if isinstance(their_loop.var, Var) else Var(their_loop.var)
    moved = [Let(replace(n.var, array=rename[n.var.array], index=tuple(substitute(e, {their_var: var}) for e in n.var.index)),
                 substitute(n.value, {their_var: var})) for n in lets]
    allocs = {a.array: a for a in walk(second) if isinstance(a, Allocate) and a.array in rename}
    new_allocs = tuple(replace(allocs[old], array=new) for old, new in rename.items())
    joined = replace(loop, body=Block((*loop.body.body, *moved)))

    def grow(s: Stmt) -> Stmt:  # first, the new rows allocated before its loop, which writes them too
        match s:
            case Block(body):
                return Block(tuple(x for c in body for x in ((*new_allocs, joined) if c is loop else (grow(c),))))
            case For(body=body):
                return replace(s, body=grow(body))
            case If(_, then, None):
                return replace(s, then=grow(then))
        return s

    def renamed(e):
        match e:
            case Local(name, dtype) if name in rename:
                return Local(rename[name], dtype)
            case Element(array) if array in rename:
                return replace(e, array=rename[array], index=tuple(map(renamed, e.index)))
        return map_children(e, renamed) if isinstance(e, Expr) else e

    def shrink(s: Stmt) -> Stmt:
        match s:
            case Block(body):
                return Block(tuple(shrink(c) for c in body
                                   if c is not their_loop and not (isinstance(c, Allocate) and c.array in rename)))
            case For(body=body):
                return replace(s, body=shrink(body))
            case If(_, then, otherwise):
                return replace(s, then=shrink(then), otherwise=otherwise and shrink(otherwise))
        return map_exprs(s, renamed)

    return grow(first), shrink(second)


def _name(v) -> str:
    return v if isinstance(v, str) else v.name


def read_names(e: Expr) -> set[str]:
    """The buffers, locals, local arrays and variables `e` reads."""
    out = set()
    for n in walk_expr(e):
        match n:
            case Load(buffer):
                out.add(buffer)
            case Local(name) | Var(name):
                out.add(name)
            case Element(array) if isinstance(array, str):
                out.add(array)
    return out


def _target(t) -> set[str]:
    match t:
        case Load(buffer):
            return {buffer}
        case Element(array):
            return {array} if isinstance(array, str) else set()
        case Lanes(locals_):
            return {v.name for v in locals_}
        case Local(name) | Var(name):
            return {name}
    return set()


def written_names(s: Stmt, skip: Stmt | None = None) -> set[str]:
    """What the statements of `s` (but `skip`) write: buffers, locals, local arrays, loop variables."""
    out: set[str] = set()
    for n in _walk_but(s, skip):
        match n:
            case Store(buffer):
                out.add(buffer)
            case Accumulate(target) | Let(target):
                out |= _target(target)
            case Allocate(array):
                out.add(array)
            case For(var) | Spans(var):
                out.add(_name(var))
    return out


def _walk_but(s: Stmt, skip: Stmt | None):
    """`walk(s)` without `skip` and the statements inside it."""
    if s is not skip:
        yield s
        for c in children(s):
            yield from _walk_but(c, skip)
