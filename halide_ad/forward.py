"""Forward mode: each Func's body is differentiated along the tangents, pointwise,

    F_dot[i] = sum over the reads B[idx] in F's body of dF/dB * B_dot[idx]

into a tangent Func that reads what F reads, so nothing is inverted. `jvp_traced` runs inside a
trace: it calls the function on copies of the primal Tensors, then adds a tangent Func after each
Func that the call made, in the same program. `jvp` traces that once per signature and compiles
primal and tangent in one program.

The rules are reverse mode's (`ad.BIN_RULES`, `ad.CALL_RULES`): for scalar math the adjoint
rule `g -> g * dF/da_k` is linear in g, so with the tangent of a_k in place of g it gives that
argument's part of the tangent. Ties therefore follow reverse mode: `hd.maximum` splits them
evenly, `hd.relu` and `hd.abs` have derivative 0 at 0, and a max or min reduction carries the
tangent of its first extremal element.
"""
from __future__ import annotations

import numpy as np

from halide_ad import ir
from halide_ad.ad import BIN_RULES, CALL_RULES, _exclusive_product
from halide_ad.api import as_function
from halide_ad.trees import flatten, flatten_values, restructure
from halide_ad.errors import DTypeError, NotDifferentiableError, ShapeError, TraceError, user_loc
from halide_ad.expr import Expr as FrontExpr, is_tensorlike
from halide_ad.ir import Bin, Call, Cast, Const, Expr, Func, Load, Op, Reduce, Select, Var
from halide_ad.stages import add_func
from halide_ad.tensor import BoundaryView, Tensor, captured, compute
from halide_ad.trace import current, require
from halide_ad.update_ad import runs_backwards
from halide_ad.update_jvp import update_tangent
from halide_ad.traverse import flat_index, simplify, substitute, walk

Tangents = dict[str, str]  # primal buffer -> its tangent buffer; a buffer not in it has tangent 0


def jvp(fn, primals, tangents):
    """(fn(*primals), the derivative of fn at primals along tangents), as jax.jvp. Called while
    tracing (on Tensors) it returns Tensors and becomes part of the traced program."""
    primals, tangents = _tuples(primals, tangents)
    if current() is not None or any(is_tensorlike(p) for p in primals):
        return jvp_traced(fn, primals, tangents)
    positions = tuple(k for k, p in enumerate(primals) if _is_float_array(p))
    arrays = [_tangent_array(k, primals[k], tangents[k]) for k in positions]
    return as_function(_program_of(fn, len(primals), positions))(*primals, *arrays)


def _program_of(fn, count: int, positions: tuple[int, ...]):
    """The function that `jvp` traces: primals, then the tangents of the float ones."""
    def jvp_of(*args):
        by_position = dict(zip(positions, args[count:], strict=True))
        return jvp_traced(fn, args[:count], tuple(by_position.get(k) for k in range(count)))
    jvp_of.__name__ = f"jvp_{getattr(fn, '__name__', 'fn').replace('<lambda>', 'f')}"
    return jvp_of


def _tuples(primals, tangents) -> tuple[tuple, tuple]:
    if not isinstance(primals, (tuple, list)) or not isinstance(tangents, (tuple, list)):
        raise TraceError(f"hd.jvp(fn, primals, tangents) takes tuples, one entry per positional argument "
                         f"(e.g. hd.jvp(f, (x,), (t,))); got {type(primals).__name__} and "
                         f"{type(tangents).__name__}", user_loc())
    if len(primals) != len(tangents):
        raise ShapeError(f"hd.jvp got {len(primals)} primal(s) but {len(tangents)} tangent(s); give one "
                         "tangent per primal (None for static and integer arguments)", user_loc())
    return tuple(primals), tuple(tangents)


def _is_float_array(x) -> bool:
    return isinstance(x, np.ndarray) and x.dtype.name in ir.FLOAT_DTYPES


def _tangent_array(k: int, primal: np.ndarray, tangent) -> np.ndarray:
    if tangent is None:
        return np.zeros_like(primal)
    t = np.asarray(tangent)
    if t.shape != primal.shape:
        raise ShapeError(f"hd.jvp: tangent {k} has shape {t.shape}, but primal {k} has shape "
                         f"{primal.shape}; a tangent has its primal's shape", user_loc())
    if t.dtype.kind not in "fiu":
        raise DTypeError(f"hd.jvp: tangent {k} has dtype {t.dtype}; use a float array", user_loc())
    return np.asarray(t, dtype=primal.dtype, order="C")  # (ascontiguousarray makes 0-d arrays 1-d)


# ---- inside a trace -----------------------------------------------------------------------------

def jvp_traced(fn, primals: tuple, tangents: tuple):
    """(out, tangent_out) as Tensors in the trace under way."""
    state = require("hd.jvp")
    primals, tangents = _tuples(primals, tangents)
    start = len(state.funcs)
    tangent_of: Tangents = {}
    args = []
    for k, (p, t) in enumerate(zip(primals, tangents, strict=True)):
        p = captured(p) if isinstance(p, np.ndarray) else p
        p = p.tensor if isinstance(p, BoundaryView) else p
        if not isinstance(p, Tensor):
            args.append(p)  # a static option: no tangent
            continue
        # fn reads a copy of its own, so that only what fn computes from it carries t
        copy = compute(p.shape, lambda *i, p=p: p[i], name=f"{p.name}_primal")
        args.append(copy)
        if t is not None and ir.is_float(p.buffer.dtype):
            tangent_of[copy.name] = _tangent_tensor(k, p, t).name
    leaves, rebuild = flatten(fn(*args), "the result of the function given to hd.jvp")
    overrides = {name: o for o in state.overrides for name in o.outputs}
    # a scan's start, read by its tangent, would have a reader besides the scan (update_ad.runs_backwards)
    starts = {f.prev for f in state.funcs[start:] if isinstance(f, ir.Update) and runs_backwards(f)}
    applied: set[int] = set()
    for f in state.funcs[start:]:
        if f.name in tangent_of:
            continue
        call = state.custom_jvps.get(f.name)
        if call is not None:  # a Func of a custom_jvp call: its rule gives the outputs' tangents
            if id(call) not in applied:
                applied.add(id(call))
                _apply_rule(call, tangent_of, state)
            continue
        if f.name in overrides and _reaches(f, tangent_of):
            raise NotDifferentiableError(
                f"hd.jvp reached {overrides[f.name].what}, which has a reverse-mode rule only "
                "(@hd.custom_vjp): forward mode cannot use it. Define its derivative with "
                "@hd.custom_jvp and .defjvp(rule) instead; reverse mode then transposes that rule.", f.loc)
        if isinstance(f, ir.Update):  # an update of the tangent (halide_ad/update_jvp.py)
            if (name := update_tangent(f, tangent_of, state, _tangent)) is not None:
                tangent_of[f.name] = name
            continue
        body = tangent_body(f, tangent_of, state, reuse=f.name not in starts)
        if body is not None:
            name = state.fresh_name(f"{f.name}_dot")
            tangent_of[f.name] = add_func(state, Func(name, f.vars, f.shape, body, f.dtype, f.loc)).name
    tangent_leaves = [Tensor(state.buffer(tangent_of[leaf.name])) if leaf.name in tangent_of else _zeros(leaf)
                      for leaf in leaves]
    return rebuild(leaves), rebuild(tangent_leaves)


def _apply_rule(call, tangent_of: Tangents, state) -> None:
    """Record in `tangent_of` the tangents of a custom_jvp call's outputs: its rule's, applied to
    the tangents of its arguments (zeros where they have none)."""
    if not any(_is_float_tensor(a) and a.name in tangent_of for a in call.args):
        return  # no tangent reaches it
    tangents = tuple(None if not _is_float_tensor(a) else
                     Tensor(state.buffer(tangent_of[a.name])) if a.name in tangent_of else _zeros(a)
                     for a in call.args)
    for out, t in zip(call.outputs, call.custom.tangents(call.args, tangents, list(call.leaves)), strict=True):
        tangent_of[out] = t.name


def _is_float_tensor(a) -> bool:
    return isinstance(a, Tensor) and ir.is_float(a.buffer.dtype)


def _tangent_tensor(k: int, primal, tangent):
    tangent = captured(tangent) if isinstance(tangent, np.ndarray) else tangent
    tangent = tangent.tensor if isinstance(tangent, BoundaryView) else tangent
    if not isinstance(tangent, Tensor):
        raise TraceError(f"hd.jvp: tangent {k} is a {type(tangent).__name__}; a tangent is an array or "
                         "a Tensor of its primal's shape", user_loc())
    if tuple(tangent.shape) != tuple(primal.shape):
        raise ShapeError(f"hd.jvp: tangent {k} has shape {tuple(tangent.shape)}, but primal {k} has shape "
                         f"{tuple(primal.shape)}; a tangent has its primal's shape", user_loc())
    if tangent.buffer.dtype != primal.buffer.dtype:
        raise DTypeError(f"hd.jvp: tangent {k} is {tangent.buffer.dtype} but primal {k} is "
                         f"{primal.buffer.dtype}; cast the tangent to its primal's dtype", user_loc())
    return tangent


def _zeros(leaf):
    return compute(leaf.shape, lambda *i: _as_expr(ir.const(0, leaf.buffer.dtype)), name=f"{leaf.name}_dot")


def _as_expr(node: Expr):
    return FrontExpr(node)


def _reaches(f, tangent_of: Tangents) -> bool:
    """Whether a tangent reaches float stage f (its body reads a buffer that has one)."""
    return ir.is_float(f.dtype) and any(isinstance(n, Load) and n.buffer in tangent_of for n in walk(f.body))


# ---- the tangent of one Func --------------------------------------------------------------------

def tangent_body(f: Func, tangent_of: Tangents, state, reuse: bool = True) -> Expr | None:
    """The body of F_dot, or None where it is zero (an integer Func, or one that reads no buffer
    with a tangent). With `reuse`, F's value in it (tanh's derivative holds tanh) reads F."""
    if not ir.is_float(f.dtype):
        return None
    body = f.body
    if not isinstance(body, Reduce):
        dot = _tangent(body, tangent_of, f)
        if dot is None:
            return None
        return simplify(substitute(dot, {body: Load(f.name, f.vars, f.dtype)}) if reuse else dot)
    dot = _tangent(body.body, tangent_of, f)
    if dot is None:
        return None
    match body.op:
        case "sum":
            inner = dot
        case "prod":  # d(prod x_r) = sum over r of x_r_dot * (the product of the others)
            inner = Bin(Op.MUL, dot, _others_product(f, state))
        case "max" | "min":  # the tangent of the first extremal element
            at = _extremum_position(f, state)
            inner = Select(Bin(Op.EQ, flat_index(body.rvars), at), dot, ir.const(0, f.dtype))
        case _:
            return None
    return Reduce("sum", ir.cast(f.dtype, simplify(inner)), body.rvars, body.where, body.loc)


def _others_product(f: Func, state) -> Load:
    """For a prod reduction, a Func `others[i, r]` of the product of every element but r's (a
    Reduce is a Func's whole body), read at r."""
    rvars = f.body.rvars
    at = tuple(Var(state.fresh_name(f"{r.var.name}_at")) for r in rvars)  # r - lo, as a pure variable
    shifted = {r.var: Bin(Op.ADD, v, ir.const(r.lo)) if r.lo else v for r, v in zip(rvars, at, strict=True)}
    name = state.fresh_name(f"{f.name}_others")
    add_func(state, Func(name, f.vars + at, f.shape + tuple(r.extent for r in rvars),
                         substitute(_exclusive_product(f.body), shifted), f.dtype, f.loc))
    index = tuple(Bin(Op.SUB, r.var, ir.const(r.lo)) if r.lo else r.var for r in rvars)
    return Load(name, f.vars + index, f.dtype)


def _extremum_position(f: Func, state) -> Load:
    """A Func of the position (in reduction order) of each output's first extremal element."""
    r = f.body
    name = state.fresh_name(f"{f.name}_at")
    arg = Reduce("arg" + r.op, r.body, r.rvars, r.where, r.loc)
    add_func(state, Func(name, f.vars, f.shape, arg, ir.INDEX_DTYPE, f.loc))
    return Load(name, f.vars, ir.INDEX_DTYPE)


def _tangent(e: Expr, tangent_of: Tangents, f: Func) -> Expr | None:
    """d e along the tangents, with None for 0; of e's dtype."""
    memo: dict[Expr, Expr | None] = {}

    def dot(e: Expr) -> Expr | None:
        if e in memo:
            return memo[e]
        out = _rule(e, dot, tangent_of, f)
        memo[e] = out = None if out is None else ir.cast(ir.dtype_of(e), out)
        return out

    return dot(e)


def _rule(e: Expr, dot, tangent_of: Tangents, f: Func) -> Expr | None:
    match e:
        case Load(buffer, index, dtype):
            name = tangent_of.get(buffer)
            return None if name is None or not ir.is_float(dtype) else Load(name, index, dtype, e.loc)
        case Const() | Var():
            return None
        case Bin(op, lhs, rhs):
            if op not in BIN_RULES or not ir.is_float(ir.dtype_of(e)):
                return None  # comparisons, logic and integer arithmetic are piecewise constant
            parts = []
            for k, child in enumerate((lhs, rhs)):
                t = dot(child)
                if t is not None:
                    parts.append(BIN_RULES[op](e, t)[k])
            return _sum(parts)
        case Call(fn, args):
            if not ir.is_float(ir.dtype_of(e)):
                return None
            tangents = [dot(a) for a in args]
            if all(t is None for t in tangents):
                return None
            if fn not in CALL_RULES:
                raise NotDifferentiableError(f"halide_ad has no derivative for {fn}(...) in {f.name}", f.loc)
            return _sum([CALL_RULES[fn](e, t)[k] for k, t in enumerate(tangents) if t is not None])
        case Select(c, t, fl):
            dt, df = dot(t), dot(fl)
            if dt is None and df is None:
                return None
            zero = ir.const(0, ir.dtype_of(e))
            return Select(c, zero if dt is None else dt, zero if df is None else df)
        case Cast(dtype, v):
            if not (ir.is_float(dtype) and ir.is_float(ir.dtype_of(v))):
                return None
            return dot(v)
        case Reduce():
            raise TraceError(f"a reduction inside {f.name}'s body was not given a Func of its own", f.loc)
    raise TypeError(f"not an expression: {e!r}")


def _sum(parts: list) -> Expr | None:
    parts = [p for p in parts if p is not None]
    if not parts:
        return None
    out = parts[0]
    for p in parts[1:]:
        out = Bin(Op.ADD, out, p)
    return out


# ---- dense Jacobians ----------------------------------------------------------------------------

def jacfwd(fn, argnums=0):
    """A function returning the Jacobian of `fn`, shape out.shape + in.shape, as jax.jacfwd: one
    `jvp` per element of the input, along each basis vector in turn. Every column runs the same
    compiled program, looked up once (only the tangent's values change), so it suits small inputs."""
    single = isinstance(argnums, int)
    nums = (argnums,) if single else tuple(argnums)

    def jacobian(*args):
        for k in nums:
            if not isinstance(k, int) or not -len(args) <= k < len(args):
                raise NotDifferentiableError(f"hd.jacfwd: argnums={k!r} does not name one of the "
                                             f"{len(args)} positional argument(s)")
            if not _is_float_array(args[k]):
                raise NotDifferentiableError(f"hd.jacfwd: argument {k} is not a float32 or float64 array; "
                                             "only those have derivatives")
        positions = tuple(k for k, a in enumerate(args) if _is_float_array(a))
        program = as_function(_program_of(fn, len(args), positions))
        jacobians, out = [], None
        for k in nums:
            x = args[k]
            columns = []
            for j in range(x.size):
                basis = np.zeros(x.size, x.dtype)
                basis[j] = 1
                tangents = [basis.reshape(x.shape) if p == k else np.zeros_like(args[p]) for p in positions]
                out, tangent_out = program(*args, *tangents)
                columns.append(flatten_values(tangent_out))
            outs = flatten_values(out)
            jacobians.append(restructure(out, [np.stack([c[m] for c in columns], axis=-1).reshape(o.shape + x.shape)
                                                for m, o in enumerate(outs)]))
        return jacobians[0] if single else tuple(jacobians)

    return jacobian
