"""Forward mode through update definitions: the tangent of an update is an update of the
tangent tensor at the same index, run in the same order (Halide's and JAX's semantics).

For `t1 = t0, then t1[e(p)] = value(p)` over the points p (pure x rdom), with t0's tangent
t0_dot (zeros where it has none), the tangent t1_dot is t0_dot updated at e(p) by value's
derivative. That derivative reads the tensor as the point saw it, before its own write, so:

* an accumulation `t[e] += v` (or -=) where neither e nor v reads t (a histogram, colliding or
  not): `t1_dot[e] += v_dot`, a stage that runs at the same rungs as the primal;
* writes that z3 proved to touch no element another point reads or writes (`independent`), or
  one-to-one writes whose other reads see final values (`reversible`, a scan such as
  `y[r] = a[r] * y[r - 1] + b[r]`): a separate tangent update (a scan stays a scan, in the same
  order), whose reads of the element being written are of t0 and t0_dot, and whose other reads
  are of the final stages t1 and t1_dot (the tangent stage itself, as the scan goes);
* anything else (colliding writes: an in-place max, `t[0] *= x[r]`, a last-write-wins
  assignment, an index that reads t): one update of a dual tensor D = stack(t, t_dot) whose
  points each write the tangent first, from the old primal, then the primal: D[1, e] = value_dot,
  D[0, e] = value. It recomputes the primal, serially as the primal runs.

An in-place max or min carries the tangent of the first extremum (a tie keeps the old value's),
as reverse mode routes it. The index and the predicate are not differentiated: they are piecewise
constant.
"""
from __future__ import annotations

from collections.abc import Callable

from halide_ad import ir
from halide_ad.ir import Bin, Expr, Func, Load, Op, Range, Reduce, Select, Update, Var
from halide_ad.stages import add_func
from halide_ad.update_ad import first_extremum, combine, combine_kind, is_own_read, runs_backwards
from halide_ad.updates import finished
from halide_ad.traverse import rewrite, substitute, walk

Tangent = Callable  # forward._tangent: (expr, tangents, stage) -> its derivative, or None for zero


def update_tangent(u: Update, tangent_of: dict[str, str], state, tangent: Tangent) -> str | None:
    """The name of the stage holding u's tangent (added to `state`), or None where it is zero."""
    if not ir.is_float(u.dtype):
        return None
    reads = [n for n in walk(u.value) if isinstance(n, Load) and n.buffer != u.name and n.buffer in tangent_of]
    if u.prev not in tangent_of and not reads:
        return None
    prev_dot = _start(u, tangent_of, state)
    if combine_kind(u) == "accumulation":
        op, operand = combine(u)
        dot = tangent(operand, tangent_of, u)
        if dot is None:  # only the start carries a tangent, and nothing is added to it
            return prev_dot
        name = state.fresh_name(f"{u.prev}_dot")
        value = Bin(op, Load(name, u.index, u.dtype), ir.cast(u.dtype, dot))
        return _append(state, Update(name, prev_dot, u.shape, u.dtype, u.pure, u.pure_dims, u.rdom, u.index,
                                     value, u.where, u.loc))
    if u.independent or u.reversible:
        return _separate(u, prev_dot, tangent_of, state, tangent)
    return _dual(u, prev_dot, tangent_of, state, tangent)


def _start(u: Update, tangent_of: dict[str, str], state) -> str:
    """t0_dot as a stage of the trace: zeros where t0 has no tangent, and a copy of an argument
    (arguments are never updated)."""
    name = tangent_of.get(u.prev)
    if name is not None and any(f.name == name for f in state.funcs):
        return name
    vars_ = tuple(Var(state.fresh_name(f"i{d}", loop_var=True)) for d in range(len(u.shape)))
    body = ir.const(0, u.dtype) if name is None else Load(name, vars_, u.dtype)
    return add_func(state, Func(state.fresh_name(f"{u.prev}_dot"), vars_, u.shape, body, u.dtype, u.loc)).name


def _derivative(u: Update, name: str, tangent_of: dict[str, str], tangent: Tangent) -> Expr:
    """The derivative of u's value, its reads of the tensor's tangent as reads of `name`."""
    dot = tangent(first_extremum(u, combine(u)), {**tangent_of, u.name: name}, u)
    return ir.const(0, u.dtype) if dot is None else ir.cast(u.dtype, dot)


def _old(u: Update, state) -> Callable[[tuple[Expr, ...]], Expr]:
    """index -> u.prev's element there. A scan's start is computed where it is read, if it can be:
    read, it would get an adjoint besides the scan's when this tangent is differentiated
    (update_ad.runs_backwards)."""
    start = next(f for f in state.funcs if f.name == u.prev)
    if runs_backwards(u) and isinstance(start, Func) and not isinstance(start.body, Reduce):
        return lambda index: substitute(start.body, dict(zip(start.vars, index, strict=True)))
    return lambda index: Load(u.prev, index, u.dtype)


def _separate(u: Update, prev_dot: str, tangent_of: dict[str, str], state, tangent: Tangent) -> str:
    name = state.fresh_name(f"{u.prev}_dot")
    old = _old(u, state)

    def seen(n: Expr) -> Expr | None:  # a read of the tensor as this point saw it
        if not isinstance(n, Load) or n.buffer not in (u.name, name):
            return None
        if not (u.independent or is_own_read(u, Load(u.name, n.index, n.dtype))):
            return None  # its final value (z3 proved it: ir.Update.reversible)
        return old(n.index) if n.buffer == u.name else Load(prev_dot, n.index, n.dtype, n.loc)

    value = rewrite(_derivative(u, name, tangent_of, tangent), seen)
    return _append(state, Update(name, prev_dot, u.shape, u.dtype, u.pure, u.pure_dims, u.rdom, u.index,
                                 value, u.where, u.loc))


def _dual(u: Update, prev_dot: str, tangent_of: dict[str, str], state, tangent: Tangent) -> str:
    name = state.fresh_name(f"{u.prev}_dot")
    dual = state.fresh_name(f"{u.prev}_dual")
    k, *vars_ = (Var(state.fresh_name(f"i{d}", loop_var=True)) for d in range(len(u.shape) + 1))
    start = Select(Bin(Op.EQ, k, ir.const(0)), _old(u, state)(tuple(vars_)), Load(prev_dot, tuple(vars_), u.dtype))
    start = add_func(state, Func(state.fresh_name(f"{u.prev}_dual"), (k, *vars_), (2, *u.shape), start, u.dtype, u.loc))

    def in_dual(n: Expr) -> Expr | None:
        if not isinstance(n, Load) or n.buffer not in (u.name, name):
            return None
        return Load(dual, (ir.const(int(n.buffer == name)), *n.index), n.dtype, n.loc)

    s = Var(state.fresh_name("s", loop_var=True))
    first = Bin(Op.EQ, s, ir.const(0))  # the tangent first: it reads the primal before this point writes
    index = (Bin(Op.SUB, ir.const(1), s), *(rewrite(e, in_dual) for e in u.index))
    value = Select(first, rewrite(_derivative(u, name, tangent_of, tangent), in_dual), rewrite(u.value, in_dual))
    where = None if u.where is None else rewrite(u.where, in_dual)
    _append(state, Update(dual, start.name, (2, *u.shape), u.dtype, u.pure, tuple(d + 1 for d in u.pure_dims),
                          u.rdom + (Range(s, 0, 2),), index, value, where, u.loc))
    return add_func(state, Func(name, tuple(vars_), u.shape, Load(dual, (ir.const(1), *vars_), u.dtype),
                                u.dtype, u.loc)).name


def _append(state, u: Update) -> str:
    state.funcs.append(finished(u))
    return u.name

