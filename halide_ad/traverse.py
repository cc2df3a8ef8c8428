"""One traversal for every pass: `map_children`, then `rewrite`, `substitute`, `simplify`."""
from __future__ import annotations

import functools
import itertools
import operator
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import fields, replace

from halide_ad.ir import Bin, Call, Const, Expr, Load, Op, Range, Reduce, Select, Var, cast, const, dtype_of, is_float


@functools.cache
def _field_names(kind: type) -> tuple[str, ...]:
    """A node type's fields (dataclasses.fields builds them anew per call: a third of the time
    that scheduling the bilinear gradient's boundary regions spent in traversals)."""
    return tuple(f.name for f in fields(kind))


def map_children(e: Expr, fn: Callable[[Expr], Expr]) -> Expr:
    """Rebuild `e` with `fn` applied to each child. Returns `e` itself if no child changed."""
    kind = type(e)
    if kind is Bin:  # most nodes are leaves and binary operations: these skip the generic walk
        lhs, rhs = fn(e.lhs), fn(e.rhs)
        return e if lhs is e.lhs and rhs is e.rhs else Bin(e.op, lhs, rhs)
    if kind is Var or kind is Const:
        return e
    updates = {}
    for name in _field_names(kind):
        old = getattr(e, name)
        if isinstance(old, Expr):
            new = fn(old)
            if new is not old:
                updates[name] = new
        elif isinstance(old, tuple) and any(isinstance(v, (Expr, Range)) for v in old):
            new = tuple(_map_item(v, fn) for v in old)
            if any(a is not b for a, b in zip(new, old, strict=True)):
                updates[name] = new
    return replace(e, **updates) if updates else e


def _map_item(v, fn):
    if isinstance(v, Expr):
        return fn(v)
    if isinstance(v, Range):  # reduction bounds are ints, but solver loops may carry Exprs
        lo = fn(v.lo) if isinstance(v.lo, Expr) else v.lo
        hi = fn(v.hi) if isinstance(v.hi, Expr) else v.hi
        return v if lo is v.lo and hi is v.hi else Range(v.var, lo, hi)
    return v


def children(e: Expr) -> Iterator[Expr]:
    for name in _field_names(type(e)):
        v = getattr(e, name)
        if isinstance(v, Expr):
            yield v
        elif isinstance(v, tuple):
            for item in v:
                if isinstance(item, Expr):
                    yield item
                elif isinstance(item, Range):
                    yield item.var
                    yield from (b for b in (item.lo, item.hi) if isinstance(b, Expr))


def walk(e: Expr) -> Iterator[Expr]:
    """Every node of `e`, parents before children."""
    stack = [e]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(children(node))


def larger_than(exprs: Iterable[Expr], nodes: int) -> bool:
    """More than `nodes` nodes in all of `exprs` together (the count stops there)."""
    every = (n for e in exprs for n in walk(e))
    return next(itertools.islice(every, nodes, None), None) is not None


def rewrite(e: Expr, rule: Callable[[Expr], Expr | None]) -> Expr:
    """Bottom-up: rewrite the children, then offer the rebuilt node to `rule` (None = keep)."""
    e = map_children(e, lambda child: rewrite(child, rule))
    replacement = rule(e)
    return e if replacement is None else replacement


def substitute(e: Expr, env: Mapping[Expr, Expr]) -> Expr:
    """Replace every node that is a key of `env` (usually Vars) by its value."""
    if not env:
        return e
    if all(type(k) is Var for k in env):  # look up the variables only: a lookup hashes a whole subtree
        return rewrite(e, lambda n: env.get(n) if type(n) is Var else None)
    return rewrite(e, env.get)


def free_vars(e: Expr) -> set[Var]:
    """Vars that `e` reads, less the reduction variables that its Reduce nodes bind."""
    bound: set[Var] = set()
    used: set[Var] = set()
    for node in walk(e):
        if isinstance(node, Var):
            used.add(node)
        elif isinstance(node, Reduce):
            bound.update(r.var for r in node.rvars)
    return used - bound


def loads(e: Expr) -> list[Load]:
    return [n for n in walk(e) if isinstance(n, Load)]


def conjuncts(e: Expr | None) -> list[Expr]:
    """The terms of a conjunction (the inverse of `conjunction`); none for no predicate."""
    if e is None:
        return []
    if isinstance(e, Bin) and e.op is Op.AND:
        return conjuncts(e.lhs) + conjuncts(e.rhs)
    return [e]


def conjunction(terms: list[Expr]) -> Expr | None:
    terms = [t for t in terms if not (isinstance(t, Const) and t.value is True)]
    if not terms:
        return None
    out = terms[0]
    for t in terms[1:]:
        out = Bin(Op.AND, out, t)
    return out


PY_OPS: dict[Op, Callable] = {
    Op.ADD: operator.add, Op.SUB: operator.sub, Op.MUL: operator.mul,
    Op.FLOORDIV: operator.floordiv, Op.MOD: operator.mod, Op.MIN: min, Op.MAX: max,
    Op.EQ: operator.eq, Op.NE: operator.ne, Op.LT: operator.lt, Op.LE: operator.le,
    Op.GT: operator.gt, Op.GE: operator.ge, Op.AND: operator.and_, Op.OR: operator.or_,
}


def simplify_rule(n: Expr) -> Expr | None:
    # most nodes match no case below: tell them by their type and a constant operand, before the
    # match statement tries each case in turn
    kind = type(n)
    if kind is Bin:  # every rule for a Bin needs two constants, or one that is 0, 1 or -1 (or a bool)
        a, b = n.lhs, n.rhs
        if type(a) is Const:
            if type(b) is not Const and a.value not in (0, 1, -1):
                return None
        elif type(b) is not Const or b.value not in (0, 1, -1):
            return None
    elif kind is Call:
        if n.fn != "neg":
            return None
    elif kind is not Select:
        return None
    match n:
        case Bin(op, Const(a), Const(b)) if op in PY_OPS and not (
                op in (Op.FLOORDIV, Op.MOD) and b == 0):
            return const(PY_OPS[op](a, b), dtype_of(n))
        case Bin(Op.ADD, x, Const(0)) | Bin(Op.ADD, Const(0), x) | Bin(Op.SUB, x, Const(0)):
            return cast(dtype_of(n), x)
        case Bin(Op.MUL, x, Const(1)) | Bin(Op.MUL, Const(1), x) | Bin(Op.DIV, x, Const(1)):
            return cast(dtype_of(n), x)
        case Bin(Op.POW, x, Const(1)):
            return cast(dtype_of(n), x)
        case Bin(Op.MUL, _, Const(0)) | Bin(Op.MUL, Const(0), _):
            return const(0, dtype_of(n))
        case Bin(Op.AND, x, Const(True)) | Bin(Op.AND, Const(True), x):
            return x
        case Bin(Op.AND, _, Const(False)) | Bin(Op.AND, Const(False), _):
            return const(False)
        case Bin(Op.MUL, Const(-1), x) | Bin(Op.MUL, x, Const(-1)) if not is_float(dtype_of(x)):
            return Call("neg", (x,))
        case Call("neg", (Const(a),)):
            return const(-a, dtype_of(n))
        case Call("neg", (Call("neg", (x,)),)):
            return x
        case Select(Const(c), t, f):
            return cast(dtype_of(n), t if c else f)
        case Select(_, t, f) if t == f:
            return cast(dtype_of(n), t)
    return None


def simplify(e: Expr) -> Expr:
    return rewrite(e, simplify_rule)


def is_zero(e: Expr) -> bool:
    return isinstance(e, Const) and e.value == 0 and not isinstance(e.value, bool)


def flat_index(rvars: tuple[Range, ...]) -> Expr:
    """The position of a point in reduction order (row-major, first variable outermost)."""
    out: Expr = const(0)
    for r in rvars:
        out = Bin(Op.ADD, Bin(Op.MUL, out, const(r.extent)), Bin(Op.SUB, r.var, const(r.lo)))
    return simplify(out)


def live_funcs(funcs, outputs, overrides=()) -> tuple:
    """The Funcs that an output reads, or a custom rule's reverse mode (`overrides`) of one. A
    plain call's forward passes no overrides: it skips what only a gradient reads."""
    rules = {name: o for o in overrides for name in o.outputs}
    live = set(outputs)
    for f in reversed(funcs):
        if f.name in live:
            live.update(n.buffer for n in walk(f.body) if isinstance(n, Load))
            if f.name in rules:
                live.update(n.buffer for s in rules[f.name].scatters for n in walk(s.value) if isinstance(n, Load))
    return tuple(f for f in funcs if f.name in live)
