"""The executable spec: the IR interpreted with numpy, slowly and obviously.

`evaluate` computes every Func of a Program; `scatter_adjoints` computes gradients by running the
Scatters of reverse mode as written (adj_B[index] += value, serially, with `np.add.at`), with no
solver involved: it is the oracle that compiled gather kernels are tested against.

Each expression is evaluated at every point of a domain at once. The domain lives in an `Env` as
open-mesh index grids, one broadcastable int64 array per variable, so for `y[i, j] = x[j, i]` the
grids are i: shape (n, 1) and j: shape (1, m), and `x[j, i]` is one fancy-indexing read. A Reduce
appends one axis per reduction variable and then reduces those axes away.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

from halide_ad.errors import BoundsError, InternalError
from halide_ad.ir import (COMPARISONS, RUN_TIME_CHECKED, Bin, Call, Cast, Const, Expr, Load, Op, Program, Range, Reduce,
                          ReverseScan, Scatter, Select, Update, Var, adjoint_name, argindex_name, dtype_of, is_float,
                          tape_name)
from halide_ad.traverse import walk


@dataclass(frozen=True)
class Env:
    """Where expressions are evaluated: every point of a box of `shape`.

    `grids[v]` holds the value of `v` at each point, as an int64 array broadcastable to `shape`
    with the same number of axes; `buffers` maps buffer names to arrays of their declared shape.
    """
    grids: dict[Var, np.ndarray]
    buffers: dict[str, np.ndarray]
    shape: tuple[int, ...]

    def extend(self, ranges: tuple[Range, ...]) -> Env:
        """This box times `ranges`, one new trailing axis per range (first range outermost)."""
        extents = tuple(_extent(r) for r in ranges)
        lead = (1,) * len(self.shape)
        inner = np.indices(extents, dtype=np.int64, sparse=True)
        grids = {v: g.reshape(g.shape + (1,) * len(ranges)) for v, g in self.grids.items()}
        grids |= {r.var: g.reshape(lead + g.shape) + r.lo for r, g in zip(ranges, inner, strict=True)}
        return Env(grids, self.buffers, self.shape + extents)


def _extent(r: Range) -> int:
    if not (isinstance(r.lo, int) and isinstance(r.hi, int)):
        raise InternalError(f"the reference interpreter needs int bounds, got {r.lo}..{r.hi}")
    return max(r.hi - r.lo, 0)


_BIN = {Op.ADD: np.add, Op.SUB: np.subtract, Op.MUL: np.multiply, Op.DIV: np.true_divide,
        Op.FLOORDIV: np.floor_divide, Op.MOD: np.mod, Op.POW: np.power,  # floor semantics, as Python
        Op.MIN: np.minimum, Op.MAX: np.maximum, Op.EQ: np.equal, Op.NE: np.not_equal,
        Op.LT: np.less, Op.LE: np.less_equal, Op.GT: np.greater, Op.GE: np.greater_equal,
        Op.AND: np.bitwise_and, Op.OR: np.bitwise_or}  # logical on bools, bitwise on ints

_CALLS = {RUN_TIME_CHECKED: lambda i: i, "neg": np.negative, "not": np.logical_not, "exp": np.exp, "log": np.log, "log1p": np.log1p,
          "sqrt": np.sqrt, "rsqrt": lambda x: np.reciprocal(np.sqrt(x)), "sin": np.sin, "cos": np.cos,
          "tan": np.tan, "tanh": np.tanh,
          "sigmoid": lambda x: 1 / (1 + np.exp(-x)), "erf": np.vectorize(math.erf, otypes=[np.float64]),
          "abs": np.abs, "sign": np.sign, "floor": np.floor, "ceil": np.ceil,
          "round": np.rint, "atan2": np.arctan2, "stop_gradient": lambda x: x}  # round: half to even


def _eval(e: Expr, env: Env) -> np.ndarray:
    """The value of `e` at every point of `env`: an array of dtype_of(e), broadcastable to env.shape."""
    dtype = dtype_of(e)
    match e:
        case Const(value, _):
            out = np.asarray(value)
        case Var():
            out = env.grids[e]
        case Load(buffer, index, _):
            out = _load(env.buffers[buffer], [_eval(i, env) for i in index])
        case Bin(op, lhs, rhs):
            a, b = _eval(lhs, env), _eval(rhs, env)
            if op not in COMPARISONS:  # compute in the result dtype: bool + bool and int / int
                a, b = a.astype(dtype), b.astype(dtype)
            out = _BIN[op](a, b)
        case Call(fn, args):
            out = _CALLS[fn](*(_eval(a, env) for a in args))
        case Select(cond, true, false):  # both branches are evaluated, hence the clipped reads
            out = np.where(_eval(cond, env), _eval(true, env), _eval(false, env))
        case Cast(_, value):
            out = _eval(value, env)
        case Reduce():
            out = _reduce(e, env)[0]
        case _:
            raise InternalError(f"the reference interpreter cannot evaluate {e!r}")
    return np.asarray(out).astype(dtype, copy=False)


def _load(buf: np.ndarray, index: list[np.ndarray]) -> np.ndarray:
    """buf[index], each index clipped into range: an untaken Select branch may read anywhere."""
    if buf.size == 0:
        return np.zeros(np.broadcast_shapes(*(i.shape for i in index)), buf.dtype)
    return buf[tuple(np.clip(i, 0, n - 1) for i, n in zip(index, buf.shape, strict=True))]


def _identity(op: str, dtype: str) -> int | float | bool:
    """The value of `op` over no elements."""
    if op in ("sum", "prod"):
        return int(op == "prod")
    high = op in ("min", "argmin")
    if dtype == "bool":
        return high
    if is_float(dtype):
        return math.inf if high else -math.inf
    return int(np.iinfo(dtype).max if high else np.iinfo(dtype).min)


def _reduce(r: Reduce, env: Env) -> tuple[np.ndarray, np.ndarray | None]:
    """(r's value, argindex) at every point of `env`.

    The argindex (max/min/argmax/argmin only, else None) is the flat position, row-major over
    `r.rvars`, of the first unmasked element equal to the result (the first NaN if the result is
    NaN), or -1 if every element is masked.
    """
    inner = env.extend(r.rvars)
    flat = env.shape + (math.prod(inner.shape[len(env.shape):]),)
    dtype = dtype_of(r) if r.op in ("sum", "prod") else dtype_of(r.body)
    body = np.broadcast_to(_eval(r.body, inner), inner.shape).reshape(flat).astype(dtype)
    mask = np.ones(flat, bool) if r.where is None else \
        np.broadcast_to(_eval(r.where, inner), inner.shape).reshape(flat).astype(bool)
    init = np.asarray(_identity(r.op, dtype), dtype)
    values = np.where(mask, body, init)
    if r.op == "sum":
        return values.sum(axis=-1, dtype=dtype), None
    if r.op == "prod":
        return values.prod(axis=-1, dtype=dtype), None
    best, arg = extremum(r.op, values, mask, dtype)
    return (arg if r.op.startswith("arg") else best), arg


def extremum(op: str, values: np.ndarray, mask: np.ndarray, dtype: str) -> tuple[np.ndarray, np.ndarray]:
    """(the extremum over the last axis, its argindex) of `values`, whose masked elements hold
    op's identity: see `_reduce`."""
    best = (np.max if op in ("max", "argmax") else np.min)(values, axis=-1, initial=np.asarray(_identity(op, dtype), dtype))
    b = best[..., None]
    hit = mask & ((values == b) | (np.isnan(values) & np.isnan(b)))
    first = hit.argmax(axis=-1) if hit.shape[-1] else 0  # argmax refuses an empty axis
    return best, np.where(hit.any(axis=-1), first, -1).astype(np.int64)


def _domain(ranges: tuple[Range, ...], buffers: dict[str, np.ndarray]) -> Env:
    return Env({}, buffers, ()).extend(ranges)


def evaluate(program: Program, inputs: dict[str, np.ndarray], *, func=None, keep=None) -> dict[str, np.ndarray]:
    """Every Func's buffer by name, in its declared shape and dtype, computed in program order.

    A Func whose `keeps_argindex` also gives `argindex_name(f.name)`: an integer array (of
    `f.argindex_dtype`) of the flat reduction position of the first extremal element, -1 where the reduction is empty. `inputs`
    holds an array per program input, converted to the declared dtype. `func(f, buffers)`, if
    given, computes each Func's (value, argindex) in place of `_func` (runtime/vectorized.py's);
    updates run here. `keep`, if given, names the buffers wanted: the others are let go once the
    last Func that reads them has run (a recycled buffer for a later one, runtime/buffers.py).
    """
    buffers = {b.name: np.asarray(inputs[b.name], b.dtype) for b in program.inputs}
    for b in program.inputs:
        if buffers[b.name].shape != b.shape:
            raise ValueError(f"input {b.name} has shape {buffers[b.name].shape}, expected {b.shape}")
    out: dict[str, np.ndarray] = {}
    done = _done_after(program, keep)
    with np.errstate(all="ignore"):  # untaken branches may divide by zero, take log(-1), ...
        for k, f in enumerate(program.funcs):
            if isinstance(f, Update):
                out[f.name] = buffers[f.name] = _update(f, buffers, out)
                continue
            value, arg = (func or _func)(f, buffers)
            if f.keeps_argindex:
                out[argindex_name(f.name)] = arg if arg.shape == f.shape and arg.dtype == f.argindex_dtype \
                    else np.broadcast_to(arg, f.shape).astype(f.argindex_dtype)
            fresh = value.shape == f.shape and value.dtype == f.dtype and value.base is None
            out[f.name] = buffers[f.name] = value if fresh else np.broadcast_to(value, f.shape).astype(f.dtype)
            del value, arg
            for name in done.get(k, ()):
                out.pop(name)
                buffers.pop(name, None)  # (an argindex buffer is only in out)
    return out


def _done_after(program: Program, keep) -> dict[int, list[str]]:
    """{k: the Funcs' buffers (argindex ones too) outside `keep` that program.funcs[k] reads last,
    or makes where nothing reads them}: none where `keep` is None or an update runs."""
    if keep is None or any(isinstance(f, Update) for f in program.funcs):
        return {}
    last: dict[str, int] = {}
    for k, f in enumerate(program.funcs):
        last |= {n.buffer: k for n in walk(f.body) if isinstance(n, Load) and n.buffer in last}
        last |= {name: k for name in (f.name, argindex_name(f.name) if f.keeps_argindex else f.name)}
    out: dict[int, list[str]] = {}
    for name, k in last.items():
        if name not in keep:
            out.setdefault(k, []).append(name)
    return out


def _func(f, buffers: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray | None]:
    env = _domain(f.domain, buffers)
    if isinstance(f.body, Reduce):
        return _reduce(f.body, env)
    return _eval(f.body, env), None


def _update(u: Update, buffers: dict[str, np.ndarray], out: dict[str, np.ndarray]) -> np.ndarray:
    """The update run as written: the rdom's points one at a time in lexicographic order, each at
    every pure point at once (pure points never touch each other's elements). A taped one
    records what each point overwrites in out[tape_name(u.name)]."""
    t = np.array(buffers[u.prev], u.dtype).reshape(u.shape)
    flat = t.reshape(u.shape or (1,))  # (a view: a 0-d tensor is written as shape (1,))
    tape = out[tape_name(u.name)] = np.zeros(tuple(r.hi - r.lo for r in u.pure + u.rdom), u.dtype) if u.taped else None
    here = dict(buffers) | {u.name: t}  # reads of u.name see the writes so far
    pure = _domain(u.pure, here)
    lead = (1,) * len(pure.shape)
    at = tuple(np.broadcast_to(pure.grids[r.var], pure.shape) for r in u.pure)
    for point in itertools.product(*(range(r.lo, r.hi) for r in u.rdom)):
        grids = pure.grids | {r.var: np.full(lead, x, np.int64) for r, x in zip(u.rdom, point, strict=True)}
        env = Env(grids, here, pure.shape)
        mask = np.ones(pure.shape, bool) if u.where is None else np.broadcast_to(_eval(u.where, env), pure.shape)
        index = _at(u.index, env, mask)
        value = np.broadcast_to(_eval(u.value, env), pure.shape)[mask]
        for d, (i, n) in enumerate(zip(index, u.shape or (1,), strict=True)):
            if i.size and (i.min() < 0 or i.max() >= n):
                bad = i[(i < 0) | (i >= n)][0]
                raise BoundsError(f"a data-dependent index was {bad}, outside dimension {d} of {u.prev} "
                                  f"(valid: 0..{n - 1}), written at {u.loc}. Clamp the index (hd.clamp) "
                                  "or fix the index data.")
        if tape is not None:
            tape[_slot(u, at, mask, point)] = flat[index]
        flat[index] = value
    return t


def _at(index: tuple[Expr, ...], env: Env, mask: np.ndarray) -> tuple[np.ndarray, ...]:
    """The elements `index` names at the unmasked points, for a buffer of shape (1,) when 0-d."""
    if not index:
        return (np.zeros(int(mask.sum()), np.intp),)
    return tuple(np.broadcast_to(_eval(e, env), env.shape)[mask] for e in index)


def _slot(u: Update, at: tuple[np.ndarray, ...], mask: np.ndarray, point: tuple[int, ...]) -> tuple[np.ndarray, ...]:
    """Where the unmasked pure points at rdom `point` sit in a buffer over the update's domain."""
    return tuple(a[mask] for a in at) + tuple(np.full(mask.sum(), x - r.lo) for r, x in zip(u.rdom, point, strict=True))


def _reverse_scan(scan: ReverseScan, buffers: dict[str, np.ndarray]) -> None:
    """The update run backwards, as `ReverseScan` says: adj_<prev> and adj_<writes> into `buffers`."""
    u = scan.update
    adj = buffers[adjoint_name(u.prev)] = np.array(buffers[adjoint_name(u.name)], u.dtype).reshape(u.shape)
    flat = adj.reshape(u.shape or (1,))
    writes = buffers[adjoint_name(scan.writes)] = np.zeros(scan.writes_shape, u.dtype)
    for name, _ in scan.stored:
        buffers[adjoint_name(name)] = np.zeros(scan.writes_shape, u.dtype)
    state = None if scan.state is None else np.array(buffers[u.name], u.dtype).reshape(u.shape)
    if state is not None:
        buffers[adjoint_name(scan.state)] = state
    pure = _domain(u.pure, buffers)
    lead = (1,) * len(pure.shape)
    at = tuple(np.broadcast_to(pure.grids[r.var], pure.shape) for r in u.pure)
    for point in reversed(list(itertools.product(*(range(r.lo, r.hi) for r in u.rdom)))):
        grids = pure.grids | {r.var: np.full(lead, x, np.int64) for r, x in zip(u.rdom, point, strict=True)}
        env = Env(grids, buffers, pure.shape)
        mask = np.ones(pure.shape, bool) if u.where is None else np.broadcast_to(_eval(u.where, env), pure.shape)
        index = _at(u.index, env, mask)
        slot = _slot(u, at, mask, point)
        if state is not None:
            state.reshape(u.shape or (1,))[index] = buffers[tape_name(u.name)][slot]
        writes[slot] = flat[index]
        flat[index] = 0
        for name, value in scan.stored:
            buffers[adjoint_name(name)][slot] = np.broadcast_to(_eval(value, env), pure.shape)[mask]
        for term in scan.terms:
            keep = mask if term.where is None else mask & np.broadcast_to(_eval(term.where, env), pure.shape)
            value = np.broadcast_to(_eval(term.value, env), pure.shape)[keep]
            np.add.at(flat, _at(term.index, env, keep), value)


def _scatter(s: Scatter, adj: np.ndarray, buffers: dict[str, np.ndarray]) -> None:
    """For every point of s.domain where s.where holds: adj[s.index] += s.value, serially."""
    env = _domain(s.domain, buffers)
    mask = np.ones(env.shape, bool) if s.where is None else \
        np.broadcast_to(_eval(s.where, env), env.shape).astype(bool)
    value = np.broadcast_to(_eval(s.value, env), env.shape)[mask].astype(adj.dtype)
    index = [np.broadcast_to(_eval(i, env), env.shape)[mask] for i in s.index]
    for d, (i, n) in enumerate(zip(index, adj.shape, strict=True)):
        if i.size and (i.min() < 0 or i.max() >= n):
            raise InternalError(f"a scatter into adj_{s.buffer} writes dimension {d} at "
                                f"{i.min()}..{i.max()}, outside 0..{n - 1}")
    position = np.ravel_multi_index(index, adj.shape) if index else np.zeros(value.shape, np.intp)
    np.add.at(adj.reshape(-1), position, value)


def scatter_adjoints(program: Program, adjoints: list, wrt: tuple[str, ...], buffers: dict[str, np.ndarray],
                     cotangents: dict[str, np.ndarray], *, scatters=None, zeros=np.zeros) -> dict[str, np.ndarray]:
    """{name: gradient} for each name in `wrt`, in that buffer's dtype, by running reverse mode's
    Scatters as written (`adjoints`: `ad.reverse_mode(program, wrt)`, outputs first):
    adj_B = (cotangent of B if B is an output) + sum of B's scatters.

    `buffers` holds the forward pass: the inputs and what `evaluate` returns (argindex buffers
    included), e.g. `inputs | evaluate(program, inputs)`; 0-d buffers may come as shape (1,).
    `cotangents` holds an array per output that `wrt` reaches, keyed by output name. A name in
    `wrt` that reaches no output gets zeros. `scatters(adjoint.scatters, adj, buffers)`, if
    given, runs each adjoint's Scatters in place of `_scatter`; reverse scans run here.
    `zeros(shape, dtype)` makes the adjoints that start at zero. An adjoint is let go once the
    last scatter that reads it has run (a recycled buffer for the next, runtime/buffers.py).
    """
    shapes = {b.name: b.shape for b in program.inputs} | {f.name: f.shape for f in program.funcs}
    shapes |= {argindex_name(f.name): f.shape for f in program.funcs if f.keeps_argindex}
    env_buffers = {k: np.asarray(a).reshape(shapes[k]) if k in shapes else np.asarray(a)
                   for k, a in buffers.items()}
    last = _last_readers(adjoints, {adjoint_name(name) for name in wrt})
    with np.errstate(all="ignore"):
        for k, adjoint in enumerate(adjoints):  # outputs first: a scatter reads earlier adjoints
            if adjoint.scan is not None:
                _reverse_scan(adjoint.scan, env_buffers)
                continue
            adj = env_buffers.get(adjoint_name(adjoint.buffer))  # (an update's reverse scan may have filled it)
            if adjoint.seeded:
                if adjoint.buffer not in cotangents:
                    raise ValueError(f"no cotangent for output {adjoint.buffer}")
                seed = np.asarray(cotangents[adjoint.buffer]).reshape(adjoint.shape)
                if adj is None:  # (read only where nothing scatters into it: a copy of a big cotangent
                    # is a first call's cost)
                    adj = np.array(seed, adjoint.dtype, copy=None if not adjoint.scatters else True)
                else:
                    adj += seed
            elif adj is None:
                adj = zeros(adjoint.shape, adjoint.dtype)
            (scatters or _scatters)(adjoint.scatters, adj, env_buffers)
            env_buffers[adjoint_name(adjoint.buffer)] = adj
            del adj
            for name in last.get(k, ()):
                del env_buffers[name]
    return {name: env_buffers[adjoint_name(name)].astype(program.buffer(name).dtype, copy=False) for name in wrt}


def _scatters(group: tuple[Scatter, ...], adj: np.ndarray, buffers: dict[str, np.ndarray]) -> None:
    for s in group:
        _scatter(s, adj, buffers)


def _last_readers(adjoints, kept: set[str]) -> dict[int, list[str]]:
    """{k: the adjoints that adjoints[k]'s scatters read last}, but those in `kept`: none where a
    reverse scan runs (it reads and writes adjoints of its own)."""
    if any(a.scan is not None for a in adjoints):
        return {}
    names = {adjoint_name(a.buffer) for a in adjoints} - kept
    last = {n.buffer: k for k, a in enumerate(adjoints) for s in a.scatters
            for e in (s.value, s.where, *s.index) if e is not None for n in walk(e)
            if isinstance(n, Load) and n.buffer in names}
    out: dict[int, list[str]] = {}
    for name, k in last.items():
        out.setdefault(k, []).append(name)
    return out


__all__ = ["evaluate", "scatter_adjoints"]
