"""Bounds inference (intervals) and proofs that every read of a bounded tensor stays in range."""
from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Iterator

from halide_ad.errors import BoundsError, HalideADWarning
from halide_ad.ir import (RUN_TIME_CHECKED, Bin, Buffer, Call, Cast, Const, Expr, Func, Load, Op, Range,
                          Reduce, Select, Var, const)
from halide_ad.solver import z3_bridge
from halide_ad.solver.z3_bridge import Query, Unsupported
from halide_ad.traverse import children, rewrite, simplify, substitute, walk

from halide_ad.affine import Interval


def interval(e: Expr, ranges: dict[Var, Interval]) -> Interval | None:
    """Bounds of an integer expression over boxes of its Vars; None if unknown."""
    lo, hi = _bounds(e, ranges)
    return None if lo is None or hi is None else (lo, hi)


Bound = tuple[int | None, int | None]  # inclusive; None where a side is unknown
_UNKNOWN: Bound = (None, None)


def _bounds(e: Expr, ranges: dict[Var, Interval]) -> Bound:
    """Each side of an integer expression's range on its own, so that a clamp bounds what it clamps:
    `min(max(int(floor(f(i))), 0), 6)` lies in [0, 6] whatever f does, without asking z3."""
    match e:
        case Const(v, dtype) if not dtype.startswith("float"):
            return int(v), int(v)
        case Var():
            return ranges.get(e, _UNKNOWN)
        case Cast(_, v):
            return _bounds(v, ranges)
        case Call(fn, (v,)) if fn == RUN_TIME_CHECKED:
            return _bounds(v, ranges)
        case Call("neg", (a,)):
            lo, hi = _bounds(a, ranges)
            return _negated(hi), _negated(lo)
        case Call("abs", (a,)):
            lo, hi = _bounds(a, ranges)
            if lo is None or hi is None:
                return (0 if lo is None or lo <= 0 else lo), None
            return (0 if lo <= 0 <= hi else min(abs(lo), abs(hi))), max(abs(lo), abs(hi))
        case Bin(Op.MOD, a, Const(k)) if isinstance(k, int) and k > 0:
            lo, hi = _bounds(a, ranges)
            if lo is not None and hi is not None and lo // k == hi // k:
                return lo % k, hi % k
            return 0, k - 1
        case Bin(Op.FLOORDIV, a, Const(k)) if isinstance(k, int) and k > 0:
            lo, hi = _bounds(a, ranges)
            return _divided(lo, k), _divided(hi, k)
        case Select(_, t, f):
            (tlo, thi), (flo, fhi) = _bounds(t, ranges), _bounds(f, ranges)
            return _both(min, tlo, flo), _both(max, thi, fhi)
        case Bin(Op.MIN, a, b):
            (alo, ahi), (blo, bhi) = _bounds(a, ranges), _bounds(b, ranges)
            return _both(min, alo, blo), _either(min, ahi, bhi)
        case Bin(Op.MAX, a, b):
            (alo, ahi), (blo, bhi) = _bounds(a, ranges), _bounds(b, ranges)
            return _either(max, alo, blo), _both(max, ahi, bhi)
        case Bin(Op.ADD, a, b):
            (alo, ahi), (blo, bhi) = _bounds(a, ranges), _bounds(b, ranges)
            return _both(int.__add__, alo, blo), _both(int.__add__, ahi, bhi)
        case Bin(Op.SUB, a, b):
            (alo, ahi), (blo, bhi) = _bounds(a, ranges), _bounds(b, ranges)
            return _both(int.__sub__, alo, bhi), _both(int.__sub__, ahi, blo)
        case Bin(Op.MUL, a, b):
            (alo, ahi), (blo, bhi) = _bounds(a, ranges), _bounds(b, ranges)
            if None in (alo, ahi, blo, bhi):
                return _UNKNOWN
            corners = [x * y for x in (alo, ahi) for y in (blo, bhi)]
            return min(corners), max(corners)
    return _UNKNOWN


def _both(op, a: int | None, b: int | None) -> int | None:
    """op(a, b) when both sides are known."""
    return None if a is None or b is None else op(a, b)


def _either(op, a: int | None, b: int | None) -> int | None:
    """op over the known sides: the bound that min's upper or max's lower side keeps."""
    known = [x for x in (a, b) if x is not None]
    return op(known) if known else None


def _negated(x: int | None) -> int | None:
    return None if x is None else -x


def _divided(x: int | None, k: int) -> int | None:
    return None if x is None else x // k


def box(domain: tuple[Range, ...]) -> dict[Var, Interval]:
    return {r.var: (r.lo, r.hi - 1) for r in domain}


def func_domain(func: Func) -> tuple[tuple[Range, ...], Expr | None]:
    """All loop variables of `func` (pure, then reduction) and the reduction's predicate."""
    if isinstance(func.body, Reduce):
        return func.domain + func.body.rvars, func.body.where
    return func.domain, None


def guarded_loads(e: Expr, conds: tuple[Expr, ...] = ()) -> Iterator[tuple[Load, tuple[Expr, ...]]]:
    """Each Load in `e` with the conditions under which it is evaluated (select branches)."""
    if isinstance(e, Load):
        yield e, conds
    if isinstance(e, Select):
        yield from guarded_loads(e.cond, conds)
        yield from guarded_loads(e.true, conds + (e.cond,))
        yield from guarded_loads(e.false, conds + (Call("not", (e.cond,)),))
        return
    for c in children(e):
        yield from guarded_loads(c, conds)


def is_data_dependent(e: Expr) -> bool:
    return any(isinstance(n, Load) for n in walk(e))


def checked_at_run_time(e: Expr) -> bool:
    """Whether the kernels check this index when they run: it reads data, or no proof settled it."""
    return any(isinstance(n, Load) or (isinstance(n, Call) and n.fn == RUN_TIME_CHECKED) for n in walk(e))


def check_bounds(func: Func, buffer_of: Callable[[str], Buffer]) -> Func:
    """`func`, once every read in it is proved in range for every point; else BoundsError.

    Reads whose index depends on data are left to the kernel's run-time check, and so are the
    indices z3 could not settle within its time limit (with a warning): they come back wrapped
    in Call(RUN_TIME_CHECKED, ...).
    """
    domain, where = func_domain(func)
    body = func.body.body if isinstance(func.body, Reduce) else func.body
    base = (where,) if where is not None else ()
    ranges = box(domain)
    unsettled: dict[Load, set[int]] = {}
    for load, conds in guarded_loads(body, base):
        shape = buffer_of(load.buffer).shape
        for d, (e, n) in enumerate(zip(load.index, shape, strict=True)):
            example = out_of_range(e, n, domain, conds, ranges)
            if example is None:
                continue
            if example is UNSETTLED:
                unsettled.setdefault(load, set()).add(d)
                continue
            raise BoundsError(_bounds_message(load, d, n, example, func), load.loc or func.loc)
    if not unsettled:
        return func
    for load, dims in unsettled.items():
        warnings.warn(f"{load} ({load.loc or func.loc}): z3 could not prove that dimension(s) "
                      f"{sorted(dims)} stay inside {load.buffer} within its time limit "
                      f"({z3_bridge.DEFAULT_TIMEOUT_MS} ms); the kernels check them when they run "
                      "(raise the limit with HALIDE_AD_Z3_TIMEOUT_MS to prove them instead)", HalideADWarning, stacklevel=2)

    def mark(n: Expr) -> Expr:
        if isinstance(n, Load) and n in unsettled:
            index = tuple(Call(RUN_TIME_CHECKED, (e,)) if d in unsettled[n] else e
                          for d, e in enumerate(n.index))
            return dataclasses.replace(n, index=index)
        return n
    return dataclasses.replace(func, body=rewrite(func.body, mark))


UNSETTLED = object()  # z3 answered unknown (its time limit) or cannot express the index


def out_of_range(e: Expr, n: int, domain, conds, ranges: dict[Var, Interval]) -> dict[str, int] | object | None:
    """A point of `domain` (under `conds`) where index `e` leaves [0, n); None where it cannot, or
    where the kernels check it when they run (it reads data); UNSETTLED where z3 cannot decide.
    Interval analysis over `ranges` (the domain's box) settles most indices before z3 is asked."""
    if checked_at_run_time(e):
        return None
    iv = interval(e, ranges)
    if iv is not None and 0 <= iv[0] and iv[1] < n:
        return None
    return _counterexample(e, n, domain, conds)


def _counterexample(e: Expr, n: int, domain, conds) -> dict[str, int] | object | None:
    """A point of the domain where `e` leaves [0, n); None once z3 proves there is none;
    UNSETTLED when z3 cannot decide."""
    q = Query()
    try:
        for r in domain:
            x = q.var(r.var)
            q.add(r.lo <= x, x < r.hi)
        for c in conds:
            q.add(q.to_z3(c))
        value = q.to_z3(e)
    except Unsupported:
        return UNSETTLED
    q.add(q.either(value < 0, value >= n))
    result = q.check()
    if result == "unsat":
        return None
    return q.model_values([r.var for r in domain]) if result == "sat" else UNSETTLED


def _bounds_message(load: Load, dim: int, n: int, example: dict[str, int], func: Func) -> str:
    env = {Var(k): const(v) for k, v in example.items()}
    bad = simplify(substitute(load.index[dim], env))
    at = ", ".join(f"{k} = {v}" for k, v in example.items())
    where = f" reads index {bad} of dimension {dim} of {load.buffer} (valid: 0..{n - 1}) when {at}"
    out_shape = func.shape
    return (f"{load}{where}.\n"
            f"    Read through a boundary view, e.g. c = hd.repeat_edge({load.buffer}) and index c "
            f"instead, or hd.constant_exterior / hd.mirror; or shrink the output (now {out_shape}) "
            "so that every read stays inside.")
