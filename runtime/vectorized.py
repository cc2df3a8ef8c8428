"""The interpreter tier's evaluator: the IR run by numpy at numpy's speed, for first calls.

`reference.py` evaluates every expression at every point of its whole domain, reads by fancy
indexing over index grids and scatters with `np.add.at`: obvious, and 10-100x slower than numpy
can be on a benchmark-sized program. This evaluator computes the same values, to the rounding of
sums, in three other ways:

* A value carries the variables its axes stand for (`Value`): it costs the size of the variables
  it depends on, not of the domain. An index that depends on one variable is a vector: read as a
  strided view where it is an arithmetic progression, else with `np.take` along its axis.
* A variable that shares an index with another (`i + r`) runs as a Python loop over its values
  (the smaller one: a window's), which leaves every index a function of one variable. A variable
  under `// k` or `% k` runs as k phases, i = k q + p, where `(i - 1) // 2` is a progression in
  q and `i % 2` a constant.
* A sum of products (a convolution, a matrix product, their adjoints) is one `np.einsum` per
  loop point, which calls BLAS. A scatter adds into a view where its index is one-to-one, sums
  the runs of a clamped index first (`np.add.reduceat`), and else groups with `np.add.at`.

Update definitions and their reverse scans stay with the reference interpreter, which runs
everything else through `func` and `scatter` here. `vectorized_plans.py` makes the plans (which
variables loop, which split into phases, the pieces); `vectorized_cost.passes` estimates what a
program costs here from the same plans, for `halide_ad.tiered` to choose a tier by.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from halide_ad.errors import InternalError
from halide_ad.ir import (COMPARISONS, Bin, Call, Cast, Const, Expr, Func, Load, Op, Reduce, Scatter, Select,
                          Var, dtype_of)
from halide_ad.runtime import bitselect, buffers as memory, reference, vectorized_plans as plans
from halide_ad.traverse import free_vars, walk

LOOP_MAX = 1024  # Python-loop points of one Func or scatter, beyond which it runs as the reference does


class Value(NamedTuple):
    """An array whose axis k stands for the variable `axes[k]` (in the Env's order)."""
    array: np.ndarray
    axes: tuple[Var, ...]


@dataclass(frozen=True, slots=True)
class Env:
    axes: dict[Var, plans.Axis]   # the variables that vary, in the order of every Value's axes
    fixed: dict[Var, int]   # the variables a Python loop holds at one value
    buffers: dict[str, np.ndarray]
    padded: dict = field(default_factory=dict)  # buffer name -> (its index ranges, an edge-padded copy): a piece's
    invariant: frozenset = frozenset()  # ids of the nodes that no loop variable reaches ...
    memo: dict = field(default_factory=dict)  # ... and their values, computed at the first loop point

    def at(self, point: dict[Var, int]) -> Env:
        return Env({v: a for v, a in self.axes.items() if v not in point}, self.fixed | point, self.buffers,
                   self.padded, self.invariant, self.memo)

    def looping(self, exprs, looped) -> Env:
        """This Env, remembering the values of the nodes of `exprs` that the `looped` variables
        do not reach (a window's adjoint divided by 9 once, not at each of its 9 taps)."""
        invariant = frozenset(id(n) for e in exprs if e is not None for n in walk(e)
                              if isinstance(n, (Load, Bin, Call, Select, Cast)) and not free_vars(n) & looped)
        return Env(self.axes, self.fixed, self.buffers, self.padded, invariant, {})

    def pad(self, name: str, box: tuple[tuple[int, int], ...], margins: tuple[int, ...]) \
            -> tuple[tuple[int, ...], np.ndarray]:
        """(lows, buffer `name` over index ranges from lows[d] holding `box`'s (lo, hi), `margins`
        wider at first, edge copies past its ends): a piece's taps read one copy of the piece's
        part, in cache (a whole buffer's copy was 64 MiB of fresh pages a pass on the pipeline)."""
        held, array = self.padded.get(name, (None, None))
        if held is not None and all(l <= lo and hi <= h for (l, h), (lo, hi) in zip(held, box, strict=True)):
            return tuple(l for l, _ in held), array
        # grown past the request as far as it passed the part held: a window's next tap goes as far again
        box = tuple((lo - m, hi + m) for (lo, hi), m in zip(box, margins, strict=True)) if held is None else \
            tuple((min(l, 2 * lo - l), max(h, 2 * hi - h)) for (l, h), (lo, hi) in zip(held, box, strict=True))
        buf = self.buffers[name]
        part = tuple(slice(min(max(lo, 0), n - 1), max(min(hi, n), 1)) for (lo, hi), n in zip(box, buf.shape))
        widths = [(max(0, p.start - lo), max(0, hi - p.stop)) for p, (lo, hi) in zip(part, box)]
        held = tuple((p.start - w0, p.stop + w1) for p, (w0, w1) in zip(part, widths))
        self.padded[name] = held, np.pad(buf[part], widths, mode="edge")
        return tuple(l for l, _ in held), self.padded[name][1]


def _expand(v: Value, axes: tuple[Var, ...]) -> np.ndarray:
    """v's array with a unit axis for each of `axes` it lacks (v.axes is a subsequence of axes)."""
    missing = tuple(k for k, a in enumerate(axes) if a not in v.axes)
    return np.expand_dims(v.array, missing) if missing else v.array


def _union(env: Env, values) -> tuple[Var, ...]:
    seen = {a for v in values for a in v.axes}
    return tuple(a for a in env.axes if a in seen)


def _apply(fn, values: list[Value], env: Env) -> Value:
    axes = _union(env, values)
    return Value(np.asarray(fn(*(_expand(v, axes) for v in values))), axes)


def _eval(e: Expr, env: Env) -> Value:
    """The value of `e` over env's axes, as reference._eval computes it at each point."""
    if id(e) in env.invariant:
        value = env.memo.get(id(e))
        if value is None:
            value = env.memo[id(e)] = _compute(e, env)
        return value
    return _compute(e, env)


def _compute(e: Expr, env: Env) -> Value:
    dtype = dtype_of(e)
    match e:
        case Const(value, _):
            out = Value(np.asarray(value), ())
        case Var():
            out = Value(np.asarray(env.fixed[e]), ()) if e in env.fixed else Value(env.axes[e].values(), (e,))
        case Load():
            out = _load(e, env)
        case Bin(Op.MUL, _, _) if len(factors := plans.product_factors(e, dtype)) > 2:
            out = _product([_eval(f, env) for f in factors], dtype, env)
        case Bin(op, lhs, rhs):
            a, b = _eval(lhs, env), _eval(rhs, env)
            if op not in COMPARISONS:  # compute in the result dtype, as the reference does
                a, b = (Value(v.array.astype(dtype, copy=False), v.axes) for v in (a, b))
            out = _apply(reference._BIN[op], [a, b], env)
        case Call(fn, args):
            out = _apply(reference._CALLS[fn], [_eval(a, env) for a in args], env)
        case Select(cond, true, false):
            out = _apply(bitselect.where, [_eval(cond, env), _eval(true, env), _eval(false, env)], env)
        case Cast(_, value):
            out = _eval(value, env)
        case Reduce():
            out = _reduce(e, env)[0]
        case _:
            raise InternalError(f"the vectorized interpreter cannot evaluate {e!r}")
    return Value(out.array.astype(dtype, copy=False), out.axes)


def _product(values: list[Value], dtype: str, env: Env) -> Value:
    """The product of `values` in `dtype`, the smaller ones first: a scatter's weights along i and
    along j multiply each other, then the image once (one full-size product, not two). It rounds
    as the reassociated product does, within an ulp or two of the reference's order."""
    ordered = sorted((Value(v.array.astype(dtype, copy=False), v.axes) for v in values), key=lambda v: v.array.size)
    total = ordered[0]
    for v in ordered[1:]:
        total = _apply(np.multiply, [total, v], env)
    return total


PAD_MAX = 64  # the most entries a clamped read may clip at one end, to read from an edge-padded copy
RUNS_MAX = 16  # pieces of an index vector read or written piece by piece (a clamped index has 3)


def _runs(vector: np.ndarray) -> list[tuple[int, int, int]] | None:
    """[(first, stop, step)]: `vector` cut, from the left, into arithmetic progressions
    vector[first:stop] of difference `step` (0 for a repeated entry), or None for more than
    RUNS_MAX. A clamped index (repeat_edge) is three: [0, 0, 1, ..., n-1, n-1]."""
    if len(vector) < 2:
        return [(0, len(vector), 1)]
    steps = np.diff(vector)
    cuts = np.flatnonzero(steps[1:] != steps[:-1]) + 1
    if len(cuts) > 2 * RUNS_MAX:
        return None
    runs, first = [], 0
    while first < len(vector):
        if first == len(vector) - 1:
            runs.append((first, first + 1, 1))
            break
        later = cuts[cuts > first]
        last = int(later[0]) if len(later) else len(vector) - 1
        runs.append((first, last + 1, int(steps[first])))
        first = last + 1
    return runs if len(runs) <= RUNS_MAX else None


def _piece(vector: np.ndarray, first: int, stop: int, step: int) -> slice | int:
    """What selects vector[first:stop] of a run: a slice, or the one entry a repeated run holds."""
    if step == 0:
        return int(vector[first])
    end = int(vector[stop - 1]) + (1 if step > 0 else -1)
    return slice(int(vector[first]), None if end < 0 else end, step)


def _read(array: np.ndarray, vector: np.ndarray, axis: int) -> np.ndarray:
    """np.take(array, vector, axis): a view where `vector` is one progression, else copies of
    its runs' views."""
    runs = _runs(vector)
    if runs is None:
        return np.take(array, vector, axis=axis)
    lead = (slice(None),) * axis
    pieces = []
    for first, stop, step in runs:
        key = _piece(vector, first, stop, step)
        if isinstance(key, int):  # a repeated entry
            view = np.expand_dims(array[lead + (key,)], axis)
            pieces.append(np.broadcast_to(view, view.shape[:axis] + (stop - first,) + view.shape[axis + 1:]))
        else:
            pieces.append(array[lead + (key,)])
    return pieces[0] if len(pieces) == 1 else np.concatenate(pieces, axis=axis)


def _clamped(vector: np.ndarray, n: int) -> int | None:
    """a where `vector` is clip(a + arange(len(vector)), 0, n - 1) and clips at most PAD_MAX
    entries at an end (a repeat_edge read), else None."""
    m = len(vector)
    if m < 2 or (vector[0] > 0 and vector[-1] < n - 1):
        return None
    a = int(vector[m // 2]) - m // 2
    if not 0 < max(-a, a + m - n) <= PAD_MAX or not np.array_equal(vector, np.clip(a + np.arange(m), 0, n - 1)):
        return None
    return a


def _load(e: Load, env: Env) -> Value:
    buf = env.buffers[e.buffer]
    index = [_eval(i, env) for i in e.index]
    named = [v.axes[0] for v in index if v.axes]
    if buf.size == 0 or any(len(v.axes) > 1 for v in index) or len(set(named)) < len(named):
        return _gather(buf, index, env)
    vectors = [np.clip(v.array, 0, n - 1) for v, n in zip(index, buf.shape, strict=True)]  # as the reference:
    starts = [_clamped(x, n) if v.axes else None for x, v, n in zip(vectors, index, buf.shape, strict=True)]
    lows, array = (0,) * buf.ndim, buf
    # a copy past the ranges by twice what the clamped ones clip, both sides, along each index a loop
    # variable moves: a window's other taps read within
    margin = 2 * max(max(-a, a + len(x) - n) for a, x, n in zip(starts, vectors, buf.shape) if a is not None) \
        if any(a is not None for a in starts) else 0
    margins = tuple(margin if free_vars(i) & env.fixed.keys() else 0 for i in e.index)
    if any(a is not None for a in starts):  # the ranges read, from a copy with edges (an untaken branch reads anywhere)
        lows, array = env.pad(e.buffer, tuple((int(x), int(x) + 1) if not v.axes else (int(x.min()), int(x.max()) + 1)
                                              if a is None else (a, a + len(x))
                                              for x, v, a in zip(vectors, index, starts, strict=True)), margins)
    array = np.asarray(array[tuple(int(x) - lo if not v.axes else slice(None)
                                   for x, v, lo in zip(vectors, index, lows, strict=True))])
    axis = 0
    for x, v, a, lo in zip(vectors, index, starts, lows, strict=True):
        if not v.axes:
            continue
        if a is None:
            array = _read(array, x - lo, axis)
        else:  # a clamped read: a view of the padded copy
            array = array[(slice(None),) * axis + (slice(a - lo, a - lo + len(x)),)]
        axis += 1
    position = {a: k for k, a in enumerate(env.axes)}
    order = sorted(range(len(named)), key=lambda k: position[named[k]])
    return Value(array.transpose(order), tuple(named[k] for k in order))


def _gather(buf: np.ndarray, index: list[Value], env: Env) -> Value:
    """buf[index] by fancy indexing over the index vectors' common axes, as the reference reads."""
    axes = _union(env, index)
    grids = [_expand(v, axes) for v in index]
    return Value(np.asarray(reference._load(buf, grids)), axes)


# --- Funcs --------------------------------------------------------------------------------------------


def func(f: Func, buffers: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray | None]:
    """(f's buffer, its argindex or None), as `reference.evaluate` computes them."""
    body = f.body
    parts = (body.body, body.where) if isinstance(body, Reduce) else (body,)
    # recycled arrays where free (runtime/buffers.py): the pages of a forward's freed buffers, not new ones
    out = memory.pool.empty(f.shape, f.dtype)
    arg = memory.pool.empty(f.shape, f.argindex_dtype) if f.keeps_argindex else None  # (narrow: one pass less)
    def piece(axes: dict[Var, plans.Axis]) -> None:
        env = Env(axes, {}, buffers, {})
        key = tuple(slice(a.start, a.start + a.step * a.count, a.step) for a in axes.values())
        if not isinstance(body, Reduce):
            _store(body, env, out[key + (Ellipsis,)])  # (a view, 0-d too)
            return
        value, where = _reduce(body, env)
        shape = tuple(a.count for a in axes.values())
        out[key] = np.broadcast_to(_expand(value, tuple(axes)), shape)
        if arg is not None:
            arg[key] = np.broadcast_to(_expand(where, tuple(axes)), shape)

    pieces = [c for axes in plans.split(f.domain, plans.phases(parts, set(f.vars)))
              for c in plans.chunks(axes, f.vars, f.vars)]
    plans.each(piece, pieces, parallel=True)
    return out, arg


def _store(e: Expr, env: Env, target: np.ndarray) -> None:
    """target[...] = e's value over env's axes (target: a piece of a Func's buffer). Where e's
    last operation is a binary one over all the axes, it writes into target itself: the piece is
    not made, then copied."""
    axes = tuple(env.axes)
    if isinstance(e, Bin) and e.op not in COMPARISONS and dtype_of(e) == target.dtype \
            and len(plans.product_factors(e, target.dtype.name)) <= 2:
        a, b = (_eval(x, env) for x in (e.lhs, e.rhs))
        a, b = (Value(v.array.astype(target.dtype, copy=False), v.axes) for v in (a, b))
        if _union(env, [a, b]) == axes:
            reference._BIN[e.op](_expand(a, axes), _expand(b, axes), out=target)
            return
        value = _apply(reference._BIN[e.op], [a, b], env)
    elif isinstance(e, Select) and all(dtype_of(x) == target.dtype for x in (e, e.true, e.false)):
        bitselect.where(*(_expand(_eval(x, env), axes) for x in (e.cond, e.true, e.false)), out=target)  # (a relu)
        return
    else:
        value = _eval(e, env)
    target[...] = np.broadcast_to(_expand(value, axes), target.shape)


def _reduce(r: Reduce, env: Env) -> tuple[Value, Value | None]:
    """(r's value, argindex) over env's axes, as reference._reduce computes them."""
    inner = Env(env.axes | {v.var: plans.Axis(v.lo, 1, reference._extent(v)) for v in r.rvars}, env.fixed, env.buffers,
                env.padded)
    rvars = {v.var for v in r.rvars}
    looped = plans.looped_vars(plans.index_dims((r.body, r.where)), {v: a.count for v, a in inner.axes.items()}, rvars)
    loop = [v for v in r.rvars if v.var in looped]
    if loop and r.op not in ("sum", "prod"):
        loop = list(r.rvars)  # an extremum's position is kept across loop points only when all loop
    if math.prod(reference._extent(v) for v in loop) > LOOP_MAX:
        loop = []
    dtype = dtype_of(r) if r.op in ("sum", "prod") else dtype_of(r.body)
    if r.op in ("sum", "prod"):
        summed = tuple(v.var for v in r.rvars if v not in loop)
        total, owned = None, False  # owned: total is an array made here, which later points add into
        ufunc = np.add if r.op == "sum" else np.multiply
        inner = inner.looping((r.body, r.where), {v.var for v in loop})
        for point in plans.points(loop):
            part = _summed(r.body, r.where, inner.at(point), summed, dtype, r.op)
            if total is None:
                total = part
            elif owned and set(part.axes) <= set(total.axes):
                ufunc(total.array, _expand(part, total.axes), out=total.array)
            else:
                total, owned = _apply(ufunc, [total, part], env), True
        if total is None:  # an empty loop
            total = Value(np.asarray(reference._identity(r.op, dtype), dtype), ())
        return Value(total.array.astype(dtype, copy=False), total.axes), None
    if not loop:
        return _extremum_whole(r, inner, dtype)
    return _extremum_loop(r, inner, env, dtype)


def _summed(body: Expr, where: Expr | None, env: Env, summed: tuple[Var, ...], dtype: str, op: str = "sum") -> Value:
    """The sum (or product) of `body` where `where` holds, over the `summed` variables of env."""
    factors = plans.product_factors(body, dtype) if op == "sum" and where is None and summed else [body]
    values = [_eval(f, env) for f in factors]
    values = [Value(v.array.astype(dtype, copy=False), v.axes) for v in values]
    if where is not None:
        mask = _eval(where, env)
        axes = _union(env, [values[0], mask])
        values = [Value(bitselect.where(_expand(mask, axes), _expand(values[0], axes), np.asarray(int(op == "prod"), dtype)),
                        axes)]
    axes = _union(env, values)
    kept = tuple(a for a in axes if a not in summed)
    if len(values) > 1:
        labels = {a: k for k, a in enumerate(axes)}
        operands = [x for v in values for x in (v.array, [labels[a] for a in v.axes])]
        array = np.einsum(*operands, [labels[a] for a in kept], optimize=True)
    elif len(kept) < len(axes):
        reduce = np.sum if op == "sum" else np.prod
        array = reduce(values[0].array, axis=tuple(k for k, a in enumerate(axes) if a in summed), dtype=dtype)
    else:
        array = values[0].array
    absent = math.prod(env.axes[v].count for v in summed if v not in axes)  # the body does not vary with these
    if absent > 1:
        array = array * np.asarray(absent, dtype) if op == "sum" else array ** absent
    return Value(np.asarray(array, dtype), kept)


def _extremum_whole(r: Reduce, inner: Env, dtype: str) -> tuple[Value, Value]:
    """max/min/argmax/argmin with the reduction variables as axes: the reference's way."""
    value = _eval(r.body, inner)
    mask = _eval(r.where, inner) if r.where is not None else Value(np.ones((), bool), ())
    rvars = tuple(v.var for v in r.rvars)
    axes = tuple(a for a in inner.axes if a in value.axes or a in mask.axes or a in rvars)
    outer = tuple(a for a in axes if a not in rvars)
    shape = tuple(inner.axes[a].count for a in axes)
    flat = tuple(inner.axes[a].count for a in outer) + (math.prod(shape[len(outer):]),)
    values = np.broadcast_to(_expand(value, axes), shape).reshape(flat).astype(dtype)
    masks = np.broadcast_to(_expand(mask, axes), shape).reshape(flat).astype(bool)
    best, arg = reference.extremum(r.op, bitselect.where(masks, values, np.asarray(reference._identity(r.op, dtype), dtype)),
                                   masks, dtype)
    return Value(arg if r.op.startswith("arg") else best, outer), Value(arg, outer)


def _extremum_loop(r: Reduce, inner: Env, env: Env, dtype: str, exact: bool = False) -> tuple[Value, Value]:
    """max/min/argmax/argmin one reduction point at a time, in reduction order: a point replaces
    the best so far where it is the first unmasked one, strictly better, or the first NaN.

    Without a mask, and until a NaN turns up, a point takes four passes, not fourteen: the best
    is np.maximum(v, best) (np.minimum), which keeps `best` on ties and -0.0 against 0.0, as the
    strict test does; the position is the greater of the one so far and `position * (v > best)`,
    positions growing from 0. A NaN there (a NaN reaches the best) runs the piece again `exact`ly:
    there the first NaN wins. A 2x2 max pool with its argmax over (16, 64, 128, 128) on the
    interpreter, pages mapped: a forward 80 ms before, 51-61 after (at 93b9e0f)."""
    high = r.op in ("max", "argmax")
    quick = not exact and r.where is None and np.dtype(dtype).kind in "fiu"
    best = Value(np.asarray(reference._identity(r.op, dtype), dtype), ())
    position_dtype = np.int16  # (fewer than LOOP_MAX positions: a quarter of int64's traffic)
    arg = Value(np.asarray(-1, position_dtype), ())
    inner = inner.looping((r.body, r.where), {v.var for v in r.rvars})
    for position, point in enumerate(plans.points(list(r.rvars))):
        at = inner.at(point)
        value = _eval(r.body, at)
        if r.where is None and position == 0:  # every point is unmasked: the first one is the best so far
            best = Value(value.array.astype(dtype, copy=False), value.axes)
            arg = Value(np.zeros((), position_dtype), ())
            continue
        mask = _eval(r.where, at) if r.where is not None else Value(np.ones((), bool), ())
        axes = _union(env, [best, arg, value, mask])
        b, a, v, m = (_expand(x, axes) for x in (best, arg, value, mask))
        if quick:
            v = v.astype(dtype, copy=False)
            taken = (np.greater if high else np.less)(v, b) * position_dtype(position)
            best = Value((np.maximum if high else np.minimum)(v, b), axes)
            arg = Value(np.maximum(a, taken), axes)
            continue
        # not (v <= b) holds where v > b and where either is NaN: a NaN replaces a number, never a NaN
        take = (np.less_equal if high else np.greater_equal)(v, b)
        np.logical_not(np.logical_or(take, np.isnan(b), out=take), out=take)
        if r.where is not None:
            take = m & (take | (a < 0))
        best = Value(bitselect.where(take, v, b).astype(dtype, copy=False), axes)
        arg = Value(bitselect.where(take, np.asarray(position, position_dtype), a), axes)
    if quick and best.array.dtype.kind == "f" and np.isnan(np.sum(best.array)) and np.isnan(best.array).any():
        return _extremum_loop(r, inner, env, dtype, exact=True)
    return (arg if r.op.startswith("arg") else best), arg


# --- scatters -----------------------------------------------------------------------------------------


def scatter(s: Scatter, adj: np.ndarray, buffers: dict[str, np.ndarray]) -> None:
    """For every point of s.domain where s.where holds: adj[s.index] += s.value, as reference._scatter."""
    counts = {r.var: reference._extent(r) for r in s.domain}
    dims = list(s.index) + plans.index_dims((s.value, s.where, *s.index))
    looped = plans.looped_vars(dims, counts, set(counts))
    loop = [r for r in s.domain if r.var in looped]
    free = [r for r in s.domain if r.var not in looped]
    named = [free_vars(i) & {r.var for r in free} for i in s.index]
    if math.prod(counts[r.var] for r in loop) > LOOP_MAX or any(len(n) > 1 for n in named) \
            or sum(map(len, named)) > len(set().union(*named)):
        reference._scatter(s, adj, buffers)  # an index of two varying variables, or two indices of one
        return
    # a phase's pieces along a variable that is a whole index of its own write disjoint elements
    own = tuple(i for i in s.index if isinstance(i, Var) and i in counts and i not in looped)
    along = own or tuple(r.var for r in free)
    def piece(axes: dict[Var, plans.Axis]) -> None:
        env = Env(axes, {}, buffers, {}).looping((s.value, s.where, *s.index), looped)
        for point in plans.points(loop):
            _scatter_at(s, adj, env.at(point))

    phases = plans.phases((s.value, s.where, *s.index), {r.var for r in free})
    for axes in plans.split(tuple(free), phases):  # phases one after another: they may write the same elements
        plans.each(piece, plans.chunks(axes, along, set().union(*named)), parallel=bool(own))


def _scatter_at(s: Scatter, adj: np.ndarray, env: Env) -> None:
    """One loop point of `scatter`, each index a function of one varying variable at most."""
    index = [_eval(i, env) for i in s.index]
    named = [v.axes[0] for v in index if v.axes]
    summed = tuple(a for a in env.axes if a not in named)
    value = _summed(s.value, s.where, env, summed, adj.dtype.name)
    ordered = tuple(a for a in env.axes if a in named)
    target = np.broadcast_to(_expand(value, ordered), tuple(env.axes[a].count for a in ordered))
    target = target.transpose([ordered.index(a) for a in named])  # into the target's dimension order
    for k, (v, n) in enumerate(zip(index, adj.shape, strict=True)):
        if s.where is not None:  # masked points may lie outside; they add zeros, at a clipped index
            index[k] = Value(np.clip(v.array, 0, n - 1), v.axes)
        elif v.array.size and (v.array.min() < 0 or v.array.max() >= n):
            raise InternalError(f"a scatter into adj_{s.buffer} writes at {v.array.min()}..{v.array.max()}, "
                                f"outside 0..{n - 1}")
    view = adj[tuple(int(v.array) if not v.axes else slice(None) for v in index) + (Ellipsis,)]  # (a view, 0-d too)
    vectors = [v.array for v in index if v.axes]
    runs = [_runs(vector) for vector in vectors]
    if any(r is None for r in runs):
        _add_grouped(view, target, vectors)
        return
    for combo in itertools.product(*runs):  # each run of each index: a view, or one entry summed into
        part = target[tuple(slice(first, stop) for first, stop, _ in combo)]
        keys = tuple(_piece(vector, *run) for vector, run in zip(vectors, combo, strict=True))
        repeated = tuple(k for k, key in enumerate(keys) if isinstance(key, int))
        view[keys] += part.sum(axis=repeated) if repeated else part


def _add_grouped(view: np.ndarray, target: np.ndarray, vectors: list[np.ndarray]) -> None:
    """view[vectors, as np.ix_ takes them] += target, equal entries of a vector summed first."""
    keys = []
    for axis, vector in enumerate(vectors):
        distinct, inverse = np.unique(vector, return_inverse=True)
        if len(distinct) < len(vector):
            moved = np.moveaxis(target, axis, 0)
            sums = np.zeros((len(distinct),) + moved.shape[1:], target.dtype)
            np.add.at(sums, inverse, moved)
            target = np.moveaxis(sums, 0, axis)
        keys.append(distinct)
    view[np.ix_(*keys)] += target


__all__ = ["func", "scatter"]
