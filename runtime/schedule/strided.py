"""phases: a gather loop nest's box over a strided dimension (boundary.py's `Split.phased`) run
in phases: the loop over j as a loop over q, j = stride*q + p, whose iteration runs each phase p
with its own gathers (`Split.phases`, written in the q's), the loads the phases share read once
at its top (`loads_to_hoist`: none that a loop inside the phases changes; not where
HALIDE_AD_SKIP names hoist_loads).

j is not assigned (a variable set twice per iteration slows numba): a phase's Point stores at
`at` (j's value), and the edge columns inside its row (`edge_columns`) read j under a name of
their own per phase (`j_p`), set at the top of the row.

Skipped (HALIDE_AD_SKIP=phases), the box runs its general gathers at every j: the same results.
"""
from __future__ import annotations

from dataclasses import replace

from halide_ad import config
from halide_ad.ir import INDEX_DTYPE, Bin, Const, Expr, Op, Var
from halide_ad.runtime.loops import Block, Comment, For, Let, Point, Stmt, block, walk
from halide_ad.runtime.schedule.hoist import hoist, loads_to_hoist


def phases(s: Stmt, split, names: dict[Var, str], ranges: dict[Var, tuple[int, int]],
           shapes: dict[str, tuple[int, ...]], written: str) -> Stmt:
    """`s`, a gather loop nest's box (its plain loops around a Point of the box's gathers, the
    edge columns beside its last loop) with each loop over a phased dimension of `split` run in
    phases, each phase's Point of that phase's gathers stored at its j (`Point.at`), reading the
    loads its phases share (`Point.reads`: not those of a loop inside the phases), and each
    column's Points reading the phased rows' aliases. `names`: the loops' names of the box's
    variables and of the phase variables; `ranges`: the box's inclusive ranges of them
    (`box_ranges`); the phases write `written`."""
    loop = {names[v]: k for k, v in enumerate(split.phased)}

    def phased(s: Stmt, combo: tuple[int, ...], at: dict[Var, Expr], env: dict) -> Stmt:
        match s:
            case Point(region=()):
                return replace(s, gathers=tuple(split.phases[combo]), at=tuple(at.items()),
                               reads=tuple(env.items()))
            case For(var=v) if v in loop:
                k = loop[v]
                j, stride, q = split.phased[k], split.strides[k], split.phase_vars[k]
                q_name = names[q]
                out: list[Stmt] = []
                if k == len(loop) - 1 and not config.skipped("hoist_loads"):
                    inside = {n.var for n in walk(s.body) if isinstance(n, For)}  # (loops that change the loads)
                    bound = {v: r for v, r in ranges.items() if names.get(v) not in inside}
                    lets, env = hoist(*loads_to_hoist([g for p in range(stride) for g in split.phases[combo + (p,)]],
                                                      bound, shapes, written))
                    out += lets
                for p in range(stride):
                    out.append(Comment(f"phase {p} of {stride}: {v} = {stride} * {q_name} + {p}"))
                    j_at = Bin(Op.ADD, Bin(Op.MUL, Const(stride, INDEX_DTYPE), q), Const(p, INDEX_DTYPE))
                    out.append(phased(s.body, combo + (p,), at | {j: j_at}, env))
                return For(q_name, s.lo // stride, s.hi // stride, s.kind, block(*out))
            case For(body=body):
                return replace(s, body=phased(body, combo, at, env))
            case Block(body) if at and any(map(_column, body)):
                aliases = {v: Var(f"{v.name}_{e.rhs.value}") for v, e in at.items()}
                lets = [Let(aliases[v], e) for v, e in at.items()]
                return Block((*lets, *(_reading(c, aliases) if _column(c) else phased(c, combo, at, env)
                                       for c in body)))
            case Block(body):
                return Block(tuple(c if _column(c) else phased(c, combo, at, env) for c in body))
        return s

    return phased(s, (), {}, {})


def _column(s: Stmt) -> bool:
    """Whether `s` is an edge column's nest: Points of a region only."""
    points = [p for p in walk(s) if isinstance(p, Point)]
    return bool(points) and all(p.region for p in points)


def _reading(s: Stmt, aliases: dict[Var, Var]) -> Stmt:
    """Column `s` with its Points reading each phased row as its alias."""
    match s:
        case Point():
            return replace(s, reads=tuple(aliases.items()))
        case For(body=body):
            return replace(s, body=_reading(body, aliases))
        case Block(body):
            return Block(tuple(_reading(c, aliases) for c in body))
    return s
