"""Custom derivative rules: `@hd.custom_jvp` with `.defjvp(rule)`, `@hd.custom_vjp` with
`.defvjp(fwd, bwd)`. Each rule is traced into the program that calls the function.

Both become, for reverse mode, an `ir.Override`: the Funcs the call made get no adjoint
contributions of their own; each differentiable argument's contribution is a cotangent traced
against the adjoint of each output (`adj_<out>`), written out in place. What that trace computes
from the forward pass alone (a rule's factors) joins the program as Funcs, with the custom rules
it calls.

custom_vjp. `f(x)` runs `fwd(x)`; the cotangents are what `bwd(residuals, adj_<out>)` returns.

custom_jvp. `f(x)` runs `fn(x)`. Forward mode (halide_ad/forward.py) calls the rule on the
tangents. Reverse mode transposes it (JAX's linearize-then-transpose): the cotangents are the
reverse mode, taken while tracing (halide_ad/retrace.py), of `t -> rule((x,), (t,))[1]` with
respect to t at t = 0, seeded with `adj_<out>`. The rule is linear in t, so that is its transpose;
it reads the real x, so a derivative of the gradient differentiates the rule's dependence on x as
any program's, and every order is exact. Where the rule reads its tangent at a data-dependent
index, the transpose scatters there: an update of the cotangent (halide_ad/retrace.py), which the
Override holds as that scatter again.
"""
from __future__ import annotations

import functools
import inspect
import threading
from dataclasses import dataclass

import numpy as np

from halide_ad import ir, retrace
from halide_ad.api import as_function
from halide_ad.trees import flatten
from halide_ad.errors import DTypeError, NotDifferentiableError, ShapeError, TraceError, user_loc
from halide_ad.ir import Bin, Call, Cast, Expr, Load, Op, Range, Reduce, Scatter, Select
from halide_ad.tensor import BoundaryView, Tensor, captured, compute, full
from halide_ad.trace import TraceState, current, require, tracing
from halide_ad.traverse import children, is_zero, substitute, walk


class _Custom:
    """A function with a rule: as an @hd.func outside a trace, inlined with its rule inside one."""

    wraps_python_function = True  # capture.py looks through it to `fn`

    def __init__(self, fn):
        functools.update_wrapper(self, fn)
        self.fn = fn
        self._running = threading.local()  # inside its own rule, a call is a plain call of fn

    @property
    def what(self) -> str:
        return f"{type(self).__name__} function {getattr(self.fn, '__name__', 'fn')}"

    def __call__(self, *args):
        if current() is None:
            return as_function(self)(*args)
        if getattr(self._running, "rule", False):
            return self.fn(*args)
        return self._traced(tuple(_tensor_or_static(a) for a in args))

    def _rule(self, rule, *args):
        """rule(*args), inside which this function is plain fn (a rule may call it for its primal)."""
        self._running.rule = True
        try:
            return rule(*args)
        finally:
            self._running.rule = False

    def _check_returns(self, rule: str, got, count: int):
        if not isinstance(got, (tuple, list)) or len(got) != count:
            shown = f"{type(got).__name__} of length {len(got)}" if isinstance(got, (tuple, list)) else \
                type(got).__name__
            raise TraceError(f"{rule} of the {self.what} returned a {shown}; it must return a tuple of "
                             f"{count}", user_loc())

    def _override(self, state, start: int, args: tuple, outputs: list, backward) -> None:
        """Reverse mode of this call: the Funcs made since `start` get no contributions of their
        own; each differentiable argument's is its cotangent in `backward(adjoints)`, traced where
        each output's cotangent is its adjoint buffer (one Tensor per output)."""
        region, names = tuple(f.name for f in state.funcs[start:]), tuple(o.name for o in outputs)
        cotangents, funcs = _trace_backward(state, outputs, backward)
        scatters = []
        for k, (a, ct) in enumerate(zip(args, cotangents, strict=True)):
            if ct is None or not _differentiable(a):
                continue
            ct = _check_like(f"cotangent {k} returned by bwd of the {self.what}", ct, a)
            scatters += _contributions(a, ct, funcs, state, self.what)
        state.overrides.append(ir.Override(self.what, region, names, tuple(scatters)))


class custom_jvp(_Custom):
    """`fn` with a forward-mode rule `rule(primals, tangents) -> (out, tangent_out)`, linear in
    the tangents, used in every mode (see the module's docstring)."""

    rule = None

    def defjvp(self, rule):
        _check_arity(rule, 2, f"the rule of the {self.what}", "(primals, tangents)")
        self.rule = rule
        return rule

    def _traced(self, args: tuple):
        if self.rule is None:
            raise TraceError(f"the {self.what} has no rule: define one with @{self.fn.__name__}.defjvp",
                             user_loc())
        state = require(self.what)
        start = len(state.funcs)
        leaves, rebuild = flatten(self.fn(*args), f"the result of {self.fn.__name__}")
        outputs = [compute(p.shape, lambda *i, p=p: p[i], name=f"{p.name}_custom") for p in leaves]
        call = CustomJvpCall(self, args, tuple(leaves), tuple(o.name for o in outputs))
        state.custom_jvps.update({f.name: call for f in state.funcs[start:]})
        self._override(state, start, args, outputs, lambda adjoints: self._transpose(args, leaves, adjoints))
        return rebuild([Tensor(o.buffer) for o in outputs])

    def _transpose(self, args: tuple, leaves: list, cotangents: list) -> tuple:
        """The rule's tangent map at `args`, transposed and applied to `cotangents` (one per
        output): one cotangent per argument, None where it is not differentiable. Reverse mode of
        a map linear in t is its transpose at any t; it is taken at t = 0."""
        diff = [k for k, a in enumerate(args) if _differentiable(a)]

        def tangent_map(*ts):
            begin = len(current().funcs)
            given = dict(zip(diff, ts, strict=True))
            t_leaves = self.tangents(args, tuple(given.get(k) for k in range(len(args))), leaves)
            _check_linear(current().funcs[begin:], {t.name for t in ts}, self.what)
            return t_leaves

        zeros = tuple(full(args[k].shape, 0, args[k].buffer.dtype, name=f"{args[k].name}_t") for k in diff)
        _, pullback = retrace.vjp(tangent_map, zeros, {})
        grads = dict(zip(diff, pullback(cotangents), strict=True))
        return tuple(grads.get(k) for k in range(len(args)))

    def tangents(self, primals: tuple, tangents: tuple, outputs: list) -> list:
        """The leaves of the rule's tangent, checked against the `outputs` they belong to."""
        result = self._rule(self.rule, primals, tangents)
        self._check_returns("the rule", result, 2)
        t_leaves, _ = flatten(result[1], f"the tangent that the rule of {self.fn.__name__} returns")
        if len(t_leaves) != len(outputs):
            raise ShapeError(f"the rule of the {self.what} returned {len(t_leaves)} tangent(s) for "
                             f"{len(outputs)} output(s); return one per output", user_loc())
        return [_check_like(f"tangent {k} returned by the rule of the {self.what}", t, p)
                for k, (p, t) in enumerate(zip(outputs, t_leaves, strict=True))]


@dataclass(frozen=True, eq=False)
class CustomJvpCall:
    """One call of a custom_jvp function while tracing: forward mode applies its rule to the
    tangents of `args` for the tangents of `outputs` (the Funcs the call returned)."""
    custom: custom_jvp
    args: tuple
    leaves: tuple  # fn's results, which the rule's tangents must match
    outputs: tuple[str, ...]


class custom_vjp(_Custom):
    """`fn` with a reverse-mode rule: `fwd(*args) -> (out, residuals)` and
    `bwd(residuals, cotangent) -> one cotangent per positional argument (None where none)`."""

    fwd = bwd = None

    def defvjp(self, fwd, bwd):
        _check_arity(bwd, 2, f"bwd of the {self.what}", "(residuals, cotangent)")
        self.fwd, self.bwd = fwd, bwd

    def _traced(self, args: tuple):
        if self.fwd is None:
            raise TraceError(f"the {self.what} has no rule: define one with "
                             f"{self.fn.__name__}.defvjp(fwd, bwd)", user_loc())
        state = require(self.what)
        start = len(state.funcs)
        _check_arity(self.fwd, len(args), f"fwd of the {self.what}", f"the {len(args)} argument(s) it was called with")
        result = self._rule(self.fwd, *args)
        self._check_returns("fwd", result, 2)
        out, residuals = result
        leaves, rebuild = flatten(out, f"the output that fwd of the {self.what} returns")
        outputs = [compute(p.shape, lambda *i, p=p: p[i], name=f"{p.name}_custom") for p in leaves]

        def backward(adjoints):
            cotangents = self._rule(self.bwd, residuals, rebuild(adjoints))
            self._check_returns("bwd", cotangents, len(args))
            return cotangents

        self._override(state, start, args, outputs, backward)
        return rebuild([Tensor(o.buffer) for o in outputs])


def _trace_backward(state, outputs, backward) -> tuple[object, dict]:
    """(backward(the outputs' adjoints), the Funcs it made that read them, by name), traced where
    the cotangent of each output is its adjoint buffer. Those Funcs stay out of the program: the
    contributions that read them write them out in place. The rest, functions of the forward pass
    (the rule's factors), join the program before the outputs, with the custom rules called in
    them, so that a derivative of the gradient uses those rules too."""
    sub = TraceState(state.name, root=state.root, captured=state.captured)
    sub.names = set(state.names)
    sub.var_ranges = dict(state.var_ranges)
    sub.inputs = list(state.inputs) + [f.buffer for f in state.funcs]
    adjoints = [ir.Buffer(ir.adjoint_name(o.name), o.buffer.shape, o.buffer.dtype) for o in outputs]
    sub.inputs += adjoints
    known = {b.name for b in sub.inputs}
    with tracing(sub):
        cotangents = backward([Tensor(b) for b in adjoints])
    state.names |= sub.names
    state.inputs += [b for b in sub.inputs if b.name not in known]  # arrays bwd captured
    backward_only = {b.name for b in adjoints}
    for f in sub.funcs:
        if _reads(f) & backward_only:
            backward_only.add(f.name)
    for f in reversed(sub.funcs):  # what an update of a cotangent starts from (zeros) is backward's too
        if isinstance(f, ir.Update) and f.name in backward_only:
            backward_only.add(f.prev)
    forward = [f for f in sub.funcs if f.name not in backward_only]
    at = len(state.funcs) - len(outputs)
    state.funcs[at:at] = forward
    names = {f.name for f in forward}
    state.overrides += [o for o in sub.overrides if set(o.region) <= names]
    state.custom_jvps.update({name: call for name, call in sub.custom_jvps.items() if name in names})
    return cotangents, {f.name: f for f in sub.funcs if f.name in backward_only}


def _reads(f) -> set[str]:
    exprs = [f.body] if isinstance(f, ir.Func) else [f.value, *f.index, *([f.where] if f.where is not None else [])]
    return {n.buffer for e in exprs for n in walk(e) if isinstance(n, Load)} | (
        {f.prev} if isinstance(f, ir.Update) else set())


def _contributions(arg, ct, funcs: dict, state, what: str) -> list[Scatter]:
    """adj_<arg>[i] += ct[i], with bwd's Funcs (`funcs`) written out in place. A cotangent that
    is updates of a start (`ct[e(r)] += v(r)`: a transpose that scatters to data-dependent places,
    or a bwd that accumulates) is the start's scatter and one scatter per update."""
    def inline(e: Expr | None) -> Expr | None:
        if e is None:
            return None
        return substitute(e, {n: inline(substitute(funcs[n.buffer].body, dict(zip(funcs[n.buffer].vars, n.index,
                                                                                strict=True))))
                              for n in walk(e) if isinstance(n, Load) and n.buffer in funcs})

    scatters, name = [], ct.name
    while isinstance(u := funcs.get(name), ir.Update):
        addend = _addend(u)
        if addend is None:
            raise NotDifferentiableError(f"the cotangent that the {what} gives {arg.name} is computed by an "
                                         f"update of {u.prev} that is not an accumulation (t[e] += v, with "
                                         "neither e nor v reading t); accumulate into hd.zeros instead", u.loc)
        scatters.append(Scatter(arg.name, tuple(map(inline, u.index)), inline(addend), u.pure + u.rdom,
                                inline(u.where), u.loc))
        name = u.prev
    index = tuple(ir.Var(state.fresh_name(f"{arg.name}_i{d}")) for d in range(arg.ndim))
    value = inline(Load(name, index, ct.buffer.dtype))
    if not is_zero(value):
        scatters.append(Scatter(arg.name, index, value, tuple(Range(v, 0, n) for v, n in zip(index, arg.shape,
                                                                                              strict=True))))
    return scatters


def _addend(u: ir.Update) -> Expr | None:
    """v, where u is `t[e] += v` (or `-= -v`) with neither e, v nor the predicate reading t; else None."""
    value = u.value
    if not (isinstance(value, Bin) and value.op in (Op.ADD, Op.SUB) and value.lhs == Load(u.name, u.index, u.dtype)):
        return None
    parts = (*u.index, value.rhs) + ((u.where,) if u.where is not None else ())
    if any(isinstance(n, Load) and n.buffer == u.name for e in parts for n in walk(e)):
        return None
    return value.rhs if value.op is Op.ADD else Call("neg", (value.rhs,))


def _check_arity(fn, count: int, what: str, takes: str) -> None:
    if not callable(fn):
        raise TraceError(f"{what} must be a function, got {type(fn).__name__}", user_loc())
    try:
        inspect.signature(fn).bind(*range(count))
    except TypeError:
        raise TraceError(f"{what}, {getattr(fn, '__name__', fn)}{inspect.signature(fn)}, must take "
                         f"{takes}", user_loc()) from None
    except ValueError:  # no signature to check (a builtin): the call will tell
        pass


def _tensor_or_static(a):
    if isinstance(a, np.ndarray):
        return captured(a)
    return a.tensor if isinstance(a, BoundaryView) else a


def _differentiable(a) -> bool:
    return isinstance(a, Tensor) and ir.is_float(a.buffer.dtype)


def _check_like(what: str, got, like):
    """`got` as a Tensor of `like`'s shape and dtype, or a clear error."""
    got = got.tensor if isinstance(got, BoundaryView) else got
    if not isinstance(got, Tensor):
        raise TraceError(f"{what} is a {type(got).__name__}; it must be an hd.Tensor of shape "
                         f"{tuple(like.shape)}", user_loc())
    if tuple(got.shape) != tuple(like.shape):
        raise ShapeError(f"{what} has shape {tuple(got.shape)}; it must have shape {tuple(like.shape)}, "
                         f"that of {like.name}", user_loc())
    if got.buffer.dtype != like.buffer.dtype:
        raise DTypeError(f"{what} is {got.buffer.dtype}; it must be {like.buffer.dtype}, as "
                         f"{like.name} is (cast it with hd.cast)", user_loc())
    return got


# ---- is a rule's tangent linear in its tangents? ------------------------------------------------

_LINEAR_CALLS = {"neg", "stop_gradient", "checked"}


def _check_linear(funcs, sources: set[str], what: str) -> None:
    """Raise where a Func that the rule made is visibly not linear in the tangents (`sources`):
    a product or power of tangents, a function of one, a test on one, or a tangent plus a term
    that is not."""
    degree = {name: 1 for name in sources}
    for f in funcs:
        if f.name in sources:
            continue
        try:
            d = _degree(f.body, degree)
        except _Nonlinear as e:
            raise NotDifferentiableError(
                f"the rule of the {what} is not linear in the tangents: in {f.name}, `{e.args[0]}` "
                "(a tangent must be a sum of tangents times factors that do not depend on them)",
                f.loc) from None
        if d:
            degree[f.name] = d


class _Nonlinear(Exception):
    pass


def _degree(e: Expr, degree: dict[str, int]) -> int:
    """0 (no tangent in it) or 1 (linear in them); `_Nonlinear(node)` otherwise."""
    match e:
        case Load(buffer, index):
            if any(_degree(i, degree) for i in index):
                raise _Nonlinear(str(e))
            return degree.get(buffer, 0)
        case Bin(Op.ADD | Op.SUB, a, b) | Select(_, a, b):
            if isinstance(e, Select) and _degree(e.cond, degree):
                raise _Nonlinear(str(e))
            da, db = _degree(a, degree), _degree(b, degree)
            if da != db and not is_zero(a if da == 0 else b):
                raise _Nonlinear(str(e))
            return max(da, db)
        case Bin(Op.MUL, a, b):
            d = _degree(a, degree) + _degree(b, degree)
            if d > 1:
                raise _Nonlinear(str(e))
            return d
        case Bin(Op.DIV, a, b):
            if _degree(b, degree):
                raise _Nonlinear(str(e))
            return _degree(a, degree)
        case Cast(_, v):
            return _degree(v, degree)
        case Call(fn, args) if fn in _LINEAR_CALLS:
            return _degree(args[0], degree)
        case Reduce(op, body, _, where):
            d = _degree(body, degree)
            if (d and op != "sum") or (where is not None and _degree(where, degree)):
                raise _Nonlinear(str(e))
            return d
    if any(_degree(c, degree) for c in _children(e)):
        raise _Nonlinear(str(e))
    return 0


def _children(e: Expr):
    return children(e)
