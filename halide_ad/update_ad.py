"""Reverse mode through update definitions, by Halide's rules, as scatter contributions that the
inverter then turns into gathers like any others.

For an update `t1 = t0, then t1[e(p)] = value(p)` over its domain p (pure x rdom), with g = adj_t1:

* an accumulation `t[e] += v` (or -=) where neither e nor v reads t, writes colliding or not (a
  histogram): adj_t0 = g, and v receives g[e(p)] (`adj_v(p) = adj_t[e(p)]`, a gather for v);
* writes that z3 proves one-to-one, and reads of t that see no other point's write: t1 is then
  a function of t0, so adj_t0 = g except at the written elements, and value's reads (of t0, and
  of other tensors) receive g[e(p)] through value's derivative. An overwritten element's old
  value gets no gradient; an in-place max or min gives a tie to the old value, the first.

Anything else (a scan that reads its own earlier writes, an in-place max over colliding writes,
an assignment whose writes may collide) is refused with NotDifferentiableError, never guessed.
"""
from __future__ import annotations

from collections.abc import Callable

from halide_ad.errors import NotDifferentiableError
from halide_ad.ir import (RUN_TIME_CHECKED, Bin, Call, Cast, Const, Expr, Load, Op, Range, ReverseScan, Scatter,
                          Select, Update, Var, adjoint_name, dtype_of, is_float)
from halide_ad.traverse import conjunction, rewrite, simplify, walk

_COMBINING = (Op.ADD, Op.SUB, Op.MUL, Op.MAX, Op.MIN)


def update_adjoint(u: Update, needs: set[str], backprop: Callable) -> tuple[list[Scatter], ReverseScan | None]:
    """The scatter contributions of update `u`, and for a scan, the `ReverseScan` that computes
    adj_<u.prev> and the adjoint of each written value (which those scatters read)."""
    if runs_backwards(u):
        return _reverse_scan(u, needs, backprop)
    return update_scatters(u, needs, backprop), None


def runs_backwards(u: Update) -> bool:
    """Whether u's adjoint is a `ReverseScan`, which fills adj_<u.prev> alone: then no other stage
    may read u.prev where a gradient flows."""
    return (u.reversible or u.taped) and not u.independent and combine_kind(u) != "accumulation"


def combine_kind(u: Update) -> str | None:
    c = combine(u)
    if (c is not None and c[0] in (Op.ADD, Op.SUB) and not any(reads_self(u, e) for e in u.index)
            and not reads_self(u, u.where)):
        return "accumulation"
    return None


def _reverse_scan(u: Update, needs: set[str], backprop: Callable) -> tuple[list[Scatter], ReverseScan]:
    """Untaped (`u.reversible`): reads of the tensor at the element being written see its old
    value, which is `prev`'s (the writes are one-to-one); other reads see final values (z3 proved
    it). Taped: every read sees the working copy, rolled back to the point's state. The
    derivative's contributions to the tensor go into adj_<prev>, the adjoint of the tensor as the
    backward run goes."""
    writes = f"{u.name}_writes"
    domain = u.pure + u.rdom
    point = tuple(r.var if not r.lo else Bin(Op.SUB, r.var, Const(r.lo, "int64")) for r in domain)
    g = Load(adjoint_name(writes), point, u.dtype)
    conds = [u.where] if u.where is not None else []
    state = f"{u.name}_state" if u.taped else None
    tensor = {u.prev} if state is None else {adjoint_name(state)}

    def as_read(n: Expr) -> Expr | None:
        if not (isinstance(n, Load) and n.buffer == u.name):
            return None
        if state is not None:
            return Load(adjoint_name(state), n.index, n.dtype, n.loc)
        return Load(u.prev, n.index, n.dtype, n.loc) if is_own_read(u, n) else None

    value = rewrite(first_extremum(u, combine(u)), as_read)
    terms: list[Scatter] = []
    out: list[Scatter] = []
    stored: list[tuple[str, Expr]] = []

    def emit(load: Load, contribution: Expr, path: tuple[Expr, ...]) -> None:
        contribution = simplify(contribution)
        if isinstance(contribution, Const) and contribution.value == 0:
            return
        if load.buffer in tensor or load.buffer == u.name:
            terms.append(Scatter(u.prev, load.index, contribution, domain, conjunction(conds + list(path)), load.loc))
        elif state is None:
            out.append(Scatter(load.buffer, load.index, contribution, domain, conjunction(conds + list(path)),
                               load.loc))
        else:  # it reads the rolled-back tensor: computed during the backward run, kept per point
            name = f"{u.name}_d{len(stored)}"
            test = conjunction(list(path))
            stored.append((name, contribution if test is None else
                           Select(test, contribution, Const(0.0, dtype_of(contribution)))))
            out.append(Scatter(load.buffer, load.index, Load(adjoint_name(name), point, u.dtype), domain,
                               u.where, load.loc))

    backprop(value, g, (), emit, needs | {u.name} | tensor, u)
    return out, ReverseScan(u, writes, tuple(terms), state, tuple(stored))


def is_own_read(u: Update, n: Expr) -> bool:
    """A read of the tensor at exactly the element this point writes."""
    return (isinstance(n, Load) and n.buffer == u.name
            and tuple(map(_bare, n.index)) == tuple(map(_bare, u.index)))


def update_scatters(u: Update, needs: set[str], backprop: Callable) -> list[Scatter]:
    domain = u.pure + u.rdom
    conds = [u.where] if u.where is not None else []
    at_write = Load(adjoint_name(u.name), u.index, u.dtype)
    out: list[Scatter] = []

    def emit(load: Load, value: Expr, path: tuple[Expr, ...]) -> None:
        value = simplify(value)
        if isinstance(value, Const) and value.value == 0:
            return
        out.append(Scatter(load.buffer, load.index, value, domain, conjunction(conds + list(path)), load.loc))

    c = combine(u)
    if combine_kind(u) == "accumulation":
        _pass_through(u, needs, out)
        g = at_write if c[0] is Op.ADD else Call("neg", (at_write,))
        backprop(c[1], g, (), emit, needs, u)
        return out
    if not u.independent:  # (z3's answer, found at trace time: solver/updates.py)
        raise NotDifferentiableError(_refusal(u), u.loc)
    def old(n: Expr) -> Expr | None:  # no point reads another's write: its reads of t1 are of t0
        return Load(u.prev, n.index, n.dtype, n.loc) if isinstance(n, Load) and n.buffer == u.name else None

    value = rewrite(first_extremum(u, c), old)
    _pass_through(u, needs, out)
    if u.prev in needs:
        emit(Load(u.prev, u.index, u.dtype, u.loc), Call("neg", (at_write,)), ())  # overwritten
    backprop(value, at_write, (), emit, needs, u)
    return out


def reads_self(u: Update, e: Expr | None) -> bool:
    return e is not None and any(isinstance(n, Load) and n.buffer == u.name for n in walk(e))


def combine(u: Update) -> tuple[Op, Expr] | None:
    """(op, operand) when the update is `t[index] = t[index] <op> operand` and the operand does not
    read t: `t[i] += v` is (ADD, v). None for a plain assignment or a scan."""
    value, cast_to = u.value, None
    if isinstance(value, Cast) and not is_float(value.dtype):  # an int32 tensor plus an int64 literal
        value, cast_to = value.value, value.dtype
    if not isinstance(value, Bin) or value.op not in _COMBINING:
        return None
    own = Load(u.name, u.index, u.dtype)
    sides = [(value.lhs, value.rhs)] + ([(value.rhs, value.lhs)] if value.op is not Op.SUB else [])
    for mine, operand in sides:
        if _same_load(mine, own) and not reads_self(u, operand):
            if cast_to is not None:
                operand = Cast(cast_to, operand) if operand.__class__ is not Cast else operand
            return value.op, operand
    return None


def _same_load(e: Expr, own: Load) -> bool:
    if isinstance(e, Cast) and not is_float(e.dtype):
        e = e.value
    return isinstance(e, Load) and e.buffer == own.buffer and tuple(map(_bare, e.index)) == tuple(map(_bare, own.index))


def _bare(e: Expr) -> Expr:
    return e.args[0] if isinstance(e, Call) and e.fn == RUN_TIME_CHECKED else e


def _pass_through(u: Update, needs: set[str], out: list[Scatter]) -> None:
    """adj_t0 += adj_t1 at every element."""
    if u.prev not in needs:
        return
    vars_ = tuple(Var(f"{u.name}_e{d}") for d in range(len(u.shape)))
    out.append(Scatter(u.prev, vars_, Load(adjoint_name(u.name), vars_, u.dtype),
                       tuple(Range(v, 0, n) for v, n in zip(vars_, u.shape, strict=True)), None, u.loc))


def first_extremum(u: Update, c) -> Expr:
    """An in-place max/min as a select that keeps the old value on a tie: the first extremum."""
    if c is None or c[0] not in (Op.MAX, Op.MIN):
        return u.value
    own = Load(u.name, u.index, u.dtype)
    keeps = Bin(Op.GE if c[0] is Op.MAX else Op.LE, own, c[1])
    return Select(keeps, own, c[1])


def _refusal(u: Update) -> str:
    return (f"no gradient through the update of {u.prev}: its index or predicate reads {u.prev} itself, so "
            "where each point writes depends on earlier writes; compute the index into a tensor of its own "
            "first (hd.compute), then update with it")


def tapes(u: Update) -> bool:
    """Whether the forward must record what `u` overwrites, for a gradient that rolls it back: a
    float update that is neither independent, an accumulation, nor provably reversible without."""
    return (is_float(u.dtype) and not u.independent and not u.reversible and combine_kind(u) != "accumulation"
            and not any(reads_self(u, e) for e in u.index) and not reads_self(u, u.where))
