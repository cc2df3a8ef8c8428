"""fuse_rows: consecutive forward nests that each compute a row from rows at the same index run as
one loop over the rows, each iteration computing the row's stages in order (Halide's compute_at
at row granularity).

softmax over the rows of (4096, 1024) is four nests (max, exp, sum, divide), each a parallel loop
over the 4096 rows and a pass over 16 MiB; fused, a row's 4 KiB stays in cache from the max to
the divide. Every element is computed by the same operations in the same order as before: the
results are the same bits.

A nest joins the group before it where
* its outermost loop has the group's bounds and step, and its kind (parallel, or serial), or
  where the kinds differ, every nest writes only at its own row (the fused loop is parallel);
* every buffer that it and a nest of the group share, one of them writing it, is read and
  written at an index whose leading component is the outer loop's variable: iteration i then
  reads only what iteration i wrote (or what no nest of the group writes).
The nests are runtime/lower.py's; a nest whose loop variable is text (named by runtime/gathers.py)
never joins. Comments between two nests of a group go inside the fused loop, before the later
nest's body.

`rows_local` then keeps a Func that nothing outside its group reads (softmax's exp(x - max) in a
plain call) one row at a time in a local array on the stack, instead of a buffer written out in
full: the forward of softmax over (4096, 1024) wrote and re-read 16 MiB for nothing.
"""
from __future__ import annotations

from dataclasses import replace

from halide_ad.ir import Expr, Load, Var
from halide_ad.runtime.lanes import SCRATCH_MAX
from halide_ad.runtime.loops import (Accumulate, Allocate, Block, Comment, Element, For, If, Kind, Let, Local, Row, Stmt,
                                     Store, block, walk)
from halide_ad.traverse import substitute, walk as walk_expr


def fuse_rows(s: Block) -> Block:
    """`s`, a kernel's top-level statements, with each run of nests that can share their outer
    loop (see the module's docstring) as one loop whose body is theirs, in order."""
    out: list[Stmt] = []
    group: list[For] = []  # the nests of the open group, their loop variable renamed to the first's
    comments: list[Comment] = []  # comments after the group's last nest
    for stmt in s.body:
        if _comment(stmt):
            comments.append(stmt)
            continue
        if group and isinstance(stmt, For) and (joined := _join(group, stmt)) is not None:
            group.append(replace(joined, body=block(*comments, joined.body)))
        else:
            out.extend(_fused(group))
            group = [stmt] if _candidate(stmt) else []
            out.extend(comments)
            if not group:
                out.append(stmt)
        comments = []
    return Block(tuple(out + _fused(group) + comments))


def _comment(s: Stmt) -> bool:
    return isinstance(s, Comment)


def _candidate(s: Stmt) -> bool:
    return (isinstance(s, For) and isinstance(s.var, Var) and s.kind in (Kind.PARALLEL, Kind.SERIAL)
            and s.step == 1 and isinstance(s.lo, int) and isinstance(s.hi, int))


def _fused(group: list[For]) -> list[Stmt]:
    if len(group) < 2:
        return list(group)
    kind = Kind.PARALLEL if any(nest.kind is Kind.PARALLEL for nest in group) else group[0].kind
    return [replace(group[0], kind=kind, body=block(*(nest.body for nest in group)))]


def _join(group: list[For], nest: For) -> For | None:
    """`nest` with its outer loop variable renamed to the group's, where it may join the group."""
    first = group[0]
    if not _candidate(nest) or (nest.lo, nest.hi) != (first.lo, first.hi):
        return None
    if len({nest.kind} | {m.kind for m in group}) > 1 and not all(map(_by_rows, [*group, nest])):
        return None
    if nest.var != first.var:
        if first.var in _vars(nest):  # an inner loop or a read of the group's name: no renaming
            return None
        nest = _rename(nest, {nest.var: first.var})
    mine = accesses(nest)
    theirs = [a for member in group for a in accesses(member)]
    written = {b for b, _, w in mine if w} | {b for b, _, w in theirs if w}
    shared = written & {b for b, _, _ in mine} & {b for b, _, _ in theirs}
    if any(b in shared and (not index or index[0] != first.var) for b, index, _ in mine + theirs):
        return None
    return nest


def _by_rows(nest: For) -> bool:
    """Whether `nest` reads and writes what it writes only at its own row (index[0] its loop
    variable), so that a serial nest may run in a parallel group: softmax's reciprocal per row,
    4096 points, too few to run in parallel alone, would otherwise split the forward's row
    group in two."""
    found = accesses(nest)
    written = {b for b, _, w in found if w}
    return all(b not in written or index[:1] == (nest.var,) for b, index, _ in found)


def accesses(s: Stmt) -> list[tuple[str, tuple[Expr, ...], bool]]:
    """(buffer, index, whether written) for every read and write of a buffer in `s`."""
    out: list[tuple[str, tuple[Expr, ...], bool]] = []
    for n in walk(s):
        if isinstance(n, Store):
            out.append((n.buffer, n.index, True))
        elif isinstance(n, Accumulate) and isinstance(n.target, Load):
            out.append((n.target.buffer, n.target.index, True))
        out += [(e.buffer, e.index, False) for x in own_exprs(n) for e in walk_expr(x) if isinstance(e, Load)]
    return out


def own_exprs(s: Stmt) -> tuple[Expr, ...]:
    """The expressions of statement `s` itself (not of the statements inside it)."""
    match s:
        case For(var, lo, hi):
            return tuple(e for e in (var, lo, hi) if isinstance(e, Expr))
        case Store(_, index, value):
            return (*index, value)
        case Accumulate(target, value):
            return (target, value)
        case Let(var, value):
            return (var, value)
        case If(cond):
            return cond if isinstance(cond, tuple) else (cond,)
    return ()


def _vars(s: Stmt) -> set[Var]:
    return {v for n in walk(s) for x in own_exprs(n) for v in walk_expr(x) if isinstance(v, Var)}


def _rename(s: Stmt, env: dict[Var, Var]) -> Stmt:
    """`s` with the variables of `env` replaced."""
    match s:
        case Block(body):
            return Block(tuple(_rename(c, env) for c in body))
        case For(var, lo, hi, _, body):
            lo, hi = (substitute(b, env) if isinstance(b, Expr) else b for b in (lo, hi))
            return replace(s, var=env.get(var, var), lo=lo, hi=hi, body=_rename(body, env))
        case Store(_, index, value):
            return replace(s, index=tuple(substitute(e, env) for e in index), value=substitute(value, env))
        case Accumulate(target, value):
            return replace(s, target=substitute(target, env), value=substitute(value, env))
        case Let(var, value):
            return replace(s, var=substitute(var, env), value=substitute(value, env))
        case If(cond, then, otherwise):
            cond = tuple(substitute(c, env) for c in cond) if isinstance(cond, tuple) else substitute(cond, env)
            return replace(s, cond=cond, then=_rename(then, env), otherwise=otherwise and _rename(otherwise, env))
        case Allocate() | Comment():
            return s
    raise TypeError(f"not a statement: {s!r}")


def rows_local(s: Block, candidates: dict[str, tuple[tuple[int, ...], str]], temp) -> Block:
    """`s`, fused (`fuse_rows`), with each buffer of `candidates` (name -> (shape, dtype): Funcs
    that no other kernel, step or output reads) that one row group alone reads and writes, each
    access at the group's row, kept one row at a time in a stack array named by `temp("row")`:
    the row's stores become the array's elements, its loads read them (a lane fold's Row reads the
    array). A 2-D buffer with rows of at most lanes.SCRATCH_MAX elements only. The same
    operations in the same order: the same bits."""
    users: dict[str, list[int]] = {}
    for k, stmt in enumerate(s.body):
        for b in {b for b, _, _ in accesses(stmt)}:
            users.setdefault(b, []).append(k)
    out = list(s.body)
    for name, (shape, dtype) in candidates.items():
        if len(users.get(name, ())) != 1 or len(shape) != 2 or shape[1] > SCRATCH_MAX:
            continue
        k = users[name][0]
        group = out[k]
        if (not isinstance(group, For) or group.kind is not Kind.PARALLEL and group.kind is not Kind.SERIAL
                or any(isinstance(n, For) and n.kind is Kind.PARALLEL for n in walk(group.body))  # (outlined)
                or any(b == name and index[:1] != (group.var,) for b, index, _ in accesses(group))
                or any(isinstance(n, Accumulate) and isinstance(n.target, Load) and n.target.buffer == name
                       for n in walk(group))):
            continue
        local = temp("row")
        loads = {e for n in walk(group) for x in own_exprs(n) for e in walk_expr(x) if isinstance(e, Load) and e.buffer == name}
        rows = {Row(e): Local(local, dtype) for e in loads}  # (first: the rewrite goes bottom-up)
        elements = {e: Element(local, e.index[1:], dtype) for e in loads}
        body = _local_rows(group.body, name, Element(local, (), dtype),
                           lambda e: substitute(substitute(e, rows), elements))
        out[k] = replace(group, body=block(Allocate(local, (shape[1],), dtype, stack=True), body))
    return Block(tuple(out))


def _local_rows(s: Stmt, name: str, row: Element, sub) -> Stmt:
    """`s` with buffer `name`'s stores as stores to the local `row`, every expression `sub`'s."""
    match s:
        case Block(body):
            return Block(tuple(_local_rows(c, name, row, sub) for c in body))
        case For(body=body):
            return replace(s, body=_local_rows(body, name, row, sub))
        case Store(buffer, index, value) if buffer == name:
            return Let(replace(row, index=index[1:]), sub(value))
        case Store(_, index, value):
            return replace(s, index=tuple(map(sub, index)), value=sub(value))
        case Accumulate(target, value):
            return replace(s, target=sub(target), value=sub(value))
        case Let(var, value):
            return replace(s, var=sub(var), value=sub(value))
        case If(cond, then, otherwise):
            return replace(s, cond=tuple(map(sub, cond)) if isinstance(cond, tuple) else sub(cond),
                           then=_local_rows(then, name, row, sub),
                           otherwise=otherwise and _local_rows(otherwise, name, row, sub))
    return s
