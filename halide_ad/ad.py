"""Reverse mode: each Func's body is differentiated into scatter contributions

    adj_B[index] += adj_F[i] * dF/dB        (one Scatter per read of B in F's body)

never into a Jacobian. The solver then turns each Scatter into a gather where it can.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import numpy as np

from halide_ad.affine import linear_form
from halide_ad.errors import HalideADError, InternalError, NotDifferentiableError
from halide_ad.ir import (Adjoint, Bin, Call, Cast, Const, Expr, Func, Load, Op, Program, Range, Reduce,
                          ReverseScan, Scatter, Select, Update, Var, adjoint_name, argindex_name, cast, const,
                          dtype_of, is_float)
from halide_ad.update_ad import update_adjoint
from halide_ad.traverse import (children, conjunction, conjuncts, flat_index, is_zero, loads, simplify,
                                substitute, walk)


def _over(g: Expr, b: Expr) -> Expr:
    """g / b; by a constant, g * (1/b): a product is cheap enough to recompute in every tap of
    a window that reads it (an average's gradient), a division is not."""
    if isinstance(b, Const) and is_float(b.dtype) and b.value != 0:
        with np.errstate(all="ignore"):
            inverse = np.dtype(b.dtype).type(1) / np.dtype(b.dtype).type(b.value)
        if np.isfinite(inverse) and inverse != 0:
            return _mul(g, const(float(inverse), b.dtype))
    return Bin(Op.DIV, g, b)


def _c(value: float, like: Expr) -> Const:
    dtype = dtype_of(like)
    return const(value, dtype if is_float(dtype) else "float64")


def _mul(a: Expr, b: Expr) -> Expr:
    return Bin(Op.MUL, a, b)


def _neg(a: Expr) -> Expr:
    return Call("neg", (a,))


# out = lhs <op> rhs receives adjoint g; each entry returns (adjoint of lhs, adjoint of rhs).
BIN_RULES: dict[Op, Callable[[Bin, Expr], tuple[Expr | None, Expr | None]]] = {
    Op.ADD: lambda n, g: (g, g),                                            # d(a+b)/da = 1
    Op.SUB: lambda n, g: (g, _neg(g)),                                      # d(a-b)/db = -1
    Op.MUL: lambda n, g: (_mul(g, n.rhs), _mul(g, n.lhs)),                  # d(ab)/da = b
    Op.DIV: lambda n, g: (_over(g, n.rhs),                                  # d(a/b)/db = -a/b^2
                          _neg(Bin(Op.DIV, _mul(g, n), n.rhs))),
    Op.POW: lambda n, g: (_mul(g, _mul(n.rhs, Bin(Op.POW, n.lhs, Bin(Op.SUB, n.rhs, _c(1, n.rhs))))),
                          _mul(g, _mul(n, Call("log", (n.lhs,))))),         # d(a^b)/db = a^b log a
    Op.MAX: lambda n, g: _tie_split(Op.GT, n, g),                           # ties split evenly
    Op.MIN: lambda n, g: _tie_split(Op.LT, n, g),
    Op.MOD: lambda n, g: (g, _neg(_mul(g, Call("floor", (Bin(Op.DIV, n.lhs, n.rhs),))))),
    Op.FLOORDIV: lambda n, g: (None, None),                                 # piecewise constant
}


def _tie_split(wins: Op, n: Bin, g: Expr) -> tuple[Expr, Expr]:
    a, b = n.lhs, n.rhs
    half = _mul(g, _c(0.5, g))
    zero = _c(0, g)
    return (Select(Bin(wins, a, b), g, Select(Bin(Op.EQ, a, b), half, zero)),
            Select(Bin(wins, b, a), g, Select(Bin(Op.EQ, a, b), half, zero)))


# out = fn(args) receives adjoint g; each entry returns one adjoint per argument.
CALL_RULES: dict[str, Callable[[Call, Expr], tuple[Expr | None, ...]]] = {
    "neg": lambda n, g: (_neg(g),),
    "exp": lambda n, g: (_mul(g, n),),                                         # d exp(a) = exp(a)
    "log": lambda n, g: (Bin(Op.DIV, g, n.args[0]),),                          # d log(a) = 1/a
    "log1p": lambda n, g: (Bin(Op.DIV, g, Bin(Op.ADD, _c(1, n), n.args[0])),),
    "sqrt": lambda n, g: (Bin(Op.DIV, g, _mul(_c(2, n), n)),),                # 1 / (2 sqrt(a))
    "rsqrt": lambda n, g: (_mul(_neg(_mul(g, _c(0.5, n))), Bin(Op.DIV, n, n.args[0])),),  # -a^-1.5/2
    "sin": lambda n, g: (_mul(g, Call("cos", n.args)),),
    "cos": lambda n, g: (_neg(_mul(g, Call("sin", n.args))),),
    "tan": lambda n, g: (_mul(g, Bin(Op.ADD, _c(1, n), _mul(n, n))),),         # 1 + tan^2
    "tanh": lambda n, g: (_mul(g, Bin(Op.SUB, _c(1, n), _mul(n, n))),),        # 1 - tanh^2
    "sigmoid": lambda n, g: (_mul(g, _mul(n, Bin(Op.SUB, _c(1, n), n))),),     # s (1 - s)
    "erf": lambda n, g: (_mul(g, _mul(_c(1.1283791670955126, n),               # 2/sqrt(pi) e^-a^2
                                      Call("exp", (_neg(_mul(n.args[0], n.args[0])),)))),),
    "abs": lambda n, g: (_mul(g, Call("sign", n.args)),),                      # 0 at 0
    "atan2": lambda n, g: _atan2(n, g),
    "sign": lambda n, g: (None,),
    "stop_gradient": lambda n, g: (None,),
    "floor": lambda n, g: (None,),
    "ceil": lambda n, g: (None,),
    "round": lambda n, g: (None,),
    "not": lambda n, g: (None,),
}


def _atan2(n: Call, g: Expr) -> tuple[Expr, Expr]:
    y, x = n.args                                     # d atan2(y, x) = (x dy - y dx) / (x^2 + y^2)
    r2 = Bin(Op.ADD, _mul(x, x), _mul(y, y))
    return Bin(Op.DIV, _mul(g, x), r2), _neg(Bin(Op.DIV, _mul(g, y), r2))


def differentiable_buffers(program: Program, wrt: tuple[str, ...]) -> set[str]:
    """Buffers on a path from `wrt` to an output: the ones that need adjoints."""
    reach = set(wrt)
    for f in program.funcs:
        if is_float(f.dtype) and any(load.buffer in reach for load in _loads(f)):
            reach.add(f.name)
    live = {o for o in program.outputs if o in reach}
    for f in reversed(program.funcs):
        if f.name in live:
            live.update(load.buffer for load in _loads(f) if load.buffer in reach)
    return live | set(wrt)


def read_by_gradients(program: Program) -> set[str] | None:
    """The Funcs and buffers any gradient of `program` may read; None when reverse mode fails
    (the forward then stores everything, and the gradient reports the error)."""
    wrt = tuple(b.name for b in program.inputs if is_float(b.dtype))
    try:
        adjoints = reverse_mode(program, wrt)
    except HalideADError:
        return None
    exprs = [e for adj in adjoints for s in adj.scatters for e in (s.value, s.where, *s.index) if e is not None]
    exprs += [e for adj in adjoints if adj.scan is not None for e in adj.scan.exprs()]
    return {n.buffer for e in exprs for n in walk(e) if isinstance(n, Load)}


def without_unused_argindex(program: Program) -> Program:
    """`program`, its max and min reductions that no gradient can reach (not an output, read only
    under hd.stop_gradient, as softmax's row maximum) marked so that they keep no argindex: they
    then run as plain maxima, without the branch on every element that records where."""
    read = {load.buffer for f in program.funcs for load in _loads(f)} | set(program.outputs)
    if not any(f.keeps_argindex and f.name not in read for f in program.funcs):
        return program
    return replace(program, funcs=tuple(replace(f, argindex=False) if f.keeps_argindex and f.name not in read
                                        else f for f in program.funcs))


def _loads(f: Func) -> list[Load]:
    """The loads in `f` that a gradient can flow through: not those under hd.stop_gradient."""
    out, stack = [], [f.body]
    while stack:
        e = stack.pop()
        if isinstance(e, Call) and e.fn == "stop_gradient":
            continue
        if isinstance(e, Load):
            out.append(e)
        stack.extend(children(e))
    return out


def reverse_mode(program: Program, wrt: tuple[str, ...]) -> list[Adjoint]:
    """The adjoint of every buffer that needs one, outputs first (reverse topological order)."""
    program, _ = clamps_into_extrema(program)
    needs = differentiable_buffers(program, wrt)
    # a custom rule replaces the contributions of the Funcs it made (halide_ad/custom.py)
    overridden = {name for o in program.overrides for name in o.region}
    needs -= overridden - {name for o in program.overrides for name in o.outputs}
    contributions: dict[str, list[Scatter]] = {b: [] for b in needs}
    scans = {}  # update name -> the ReverseScan that runs it backwards (halide_ad/update_ad.py)
    # A Func that no contribution reaches (read only where nothing is differentiated: a bilateral
    # grid's brightness, only in a floor in the write index) has a zero adjoint: it gets no buffer
    # unless asked for, and gives no contributions, which would read it. Its readers come after it,
    # so its contributions are all known when the loop reaches it, but for a custom_vjp's rules
    # (kept as they were: their targets, and their outputs, whose adjoints the rules read).
    filled = set(program.outputs) | {n for o in program.overrides
                                     for n in (*o.outputs, *(s.buffer for s in o.scatters))}
    zero = set()
    for f in reversed(program.funcs):
        if f.name not in needs or f.name in overridden:
            continue
        if not contributions.get(f.name) and f.name not in filled:
            zero.add(f.name)
            continue
        if isinstance(f, Update):
            scatters, scan = update_adjoint(f, needs, _backprop)
            if scan is not None:
                scans[f.name] = scan
                needs.add(f.prev)  # the backward run keeps the tensor's adjoint there
                filled.add(f.prev)
        else:
            scatters = _func_scatters(f, needs)
        for s in scatters:
            contributions.setdefault(s.buffer, []).append(s)
    for o in program.overrides:
        if needs & set(o.outputs):
            for s in o.scatters:
                if s.buffer in needs:
                    contributions.setdefault(s.buffer, []).append(s)
    adjoints, zero = [], zero - set(wrt)
    for name in [f.name for f in reversed(program.funcs) if f.name in needs and f.name not in zero] + [
            b.name for b in program.inputs if b.name in needs]:
        buffer = program.buffer(name)
        adjoints.append(Adjoint(name, buffer.shape, buffer.dtype, name in program.outputs,
                                _merge(contributions.get(name, []))))
        if name in scans:  # right after the update's own adjoint, which it reads
            adjoints += _scan_adjoints(scans[name], contributions)
    return adjoints


def _scan_adjoints(scan: ReverseScan, contributions: dict[str, list[Scatter]]) -> list[Adjoint]:
    """The buffers a backward run fills: a taped one's working copy and per-point contributions
    (buffers of the gradient's own, allocated as adjoints are), then the one that runs it."""
    u = scan.update
    own = [Adjoint(name, scan.writes_shape, u.dtype, False, ()) for name, _ in scan.stored]
    if scan.state is not None:
        own.append(Adjoint(scan.state, u.shape, u.dtype, False, ()))
    if contributions.get(u.prev):
        raise NotDifferentiableError(f"no gradient through the update of {u.prev}: it is a scan, whose "
                                     f"adjoint runs it backwards, and {u.prev} is also read before the "
                                     "update; read a copy made with hd.compute instead", u.loc)
    return own + [Adjoint(scan.writes, scan.writes_shape, u.dtype, False, (), scan)]


def _func_scatters(f: Func, needs: set[str]) -> list[Scatter]:
    g: Expr = Load(adjoint_name(f.name), f.vars, f.dtype)
    domain, conds, body = f.domain, [], f.body
    if isinstance(body, Reduce):
        domain = domain + body.rvars
        conds = [body.where] if body.where is not None else []
        inner = body.body
        match body.op:
            case "sum":
                pass
            case "max" | "min":  # only the first extremal element receives the gradient
                if not f.keeps_argindex:
                    raise InternalError(f"a gradient reached {f.name}, marked as reached by none")
                conds.append(Bin(Op.EQ, flat_index(body.rvars), Load(argindex_name(f.name), f.vars, f.argindex_dtype)))
                inner = _at_extremum(inner, f)
            case "prod":  # the product of the other elements: no division, so zeros are fine
                g = _mul(g, _exclusive_product(body))
            case _:
                return []
        body = inner
    out: list[Scatter] = []
    self_value = {f.body: Load(f.name, f.vars, f.dtype)} if not isinstance(f.body, Reduce) else {}

    def emit(load: Load, value: Expr, path: tuple[Expr, ...]) -> None:
        value = simplify(substitute(value, self_value) if self_value else value)
        if isinstance(value, Const) and value.value == 0:
            return
        out.append(Scatter(load.buffer, load.index, value, domain, conjunction(conds + list(path)),
                           load.loc))

    _backprop(body, g, (), emit, needs, f)
    return out


def clamps_into_extrema(program: Program) -> tuple[Program, dict[str, str]]:
    """`program` with each clamp (a relu) that a max or min reads where its value is the body's
    (`_on_spine`: the whole body, or a branch of a padded window's select), in windows that do not
    overlap, and that nothing else reads, inlined there (the forward pass inlines it too): a max
    pool of a relu is then differentiated as one Func, whose test of the relu becomes a test of the
    pooled output (`_at_extremum`). Overlapping windows (a 3x3/2 pool) would test each point once
    per window that covers it instead of once: that gradient ran 10-20% slower. Also returns
    which clamps were inlined, each with the max or min it went into (`hd.explain` says so)."""
    funcs = {f.name: f for f in program.funcs}
    inlined: dict[str, str] = {}
    reads: dict[str, int] = {}
    for f in program.funcs:
        for n in loads(f.body):
            reads[n.buffer] = reads.get(n.buffer, 0) + 1

    def inline(e: Expr, f: Func) -> Expr:
        clamp = funcs.get(e.buffer) if isinstance(e, Load) else None
        if (clamp is None or reads[clamp.name] != 1 or clamp.name in program.outputs or clamp.dtype != f.dtype
                or not _is_clamp(clamp.body) or not _read_once(e.index, f.body.rvars)):
            return e
        inlined[clamp.name] = f.name
        return substitute(clamp.body, dict(zip(clamp.vars, e.index, strict=True)))

    funcs_now = tuple(replace(f, body=replace(f.body, body=_on_spine(f.body.body, lambda e: inline(e, f))))
                      if f.keeps_argindex else f for f in program.funcs)
    return replace(program, funcs=funcs_now), inlined


def _read_once(index: tuple[Expr, ...], rvars: tuple[Range, ...]) -> bool:
    """Whether a reduction reads each point of `index`'s buffer at most once over all of its
    outputs: each component affine in at most one output and one reduction variable, none shared
    between components, every reduction variable used, and a window's span along a component
    shorter than its stride (2x2/2, not 3x3/2). A data-dependent index is not affine: its check
    is against the clamp's shape, so the clamp stays a Func of its own."""
    extents = {r.var: r.extent for r in rvars}
    used: set[Var] = set()
    for e in index:
        form = linear_form(e)
        if form is None:
            return False
        coefficients = {v: c for v, c in form[0].items() if c}
        outs = [v for v in coefficients if v not in extents]
        reds = [v for v in coefficients if v in extents]
        if len(outs) > 1 or len(reds) > 1 or used & coefficients.keys():
            return False
        used |= coefficients.keys()
        span = abs(coefficients[reds[0]]) * (extents[reds[0]] - 1) if reds else 0
        if outs and span >= abs(coefficients[outs[0]]):
            return False
    return extents.keys() <= used


def _on_spine(e: Expr, rule: Callable[[Expr], Expr]) -> Expr:
    """`e` with `rule` applied to it and, below it, to the branches of its selects: the nodes whose
    value, on the path that takes them, is the whole of `e`'s."""
    e = rule(e)
    if isinstance(e, Select):
        return Select(e.cond, _on_spine(e.true, rule), _on_spine(e.false, rule))
    return e


def _is_clamp(e: Expr) -> bool:
    """Whether `e` is a select whose strict test of its true value x is answered by its own value:
    a clamp, `select(x > k, x, k)`, or a leaky relu, `select(x > 0, x, x * c)` with c >= 0 (so
    that x <= 0 gives a value <= 0); `<` for either, either side of the test."""
    match e:
        case Select(Bin(Op.GT | Op.LT, a, b), t, fl) if t != fl and t in (a, b):
            k = b if a == t else a
            return fl == k or (is_zero(k) and any(
                factor == t and isinstance(c, Const) and is_float(c.dtype) and c.value >= 0
                for factor, c in _factor_pairs(fl)))
    return False


def _factor_pairs(e: Expr) -> tuple[tuple[Expr, Expr], ...]:
    """`e` = a * b as (a, b) and (b, a); nothing where it is not a product."""
    return ((e.lhs, e.rhs), (e.rhs, e.lhs)) if isinstance(e, Bin) and e.op == Op.MUL else ()


def _at_extremum(body: Expr, f: Func) -> Expr:
    """A max or min reduction's body as its gradient sees it: the gradient flows only at the
    extremal point, where the body's value is the output's, so a clamp's test there (on the
    body's spine), `x > k` in `select(x > k, x, k)`, is `out > k`. A max pool of a relu then
    reads its pooled output instead of every input of each window."""
    out = Load(f.name, f.vars, f.dtype)

    def rule(e: Expr) -> Expr:
        if not _is_clamp(e) or dtype_of(e) != f.dtype:
            return e
        test = e.cond
        lhs, rhs = (out if side == e.true else side for side in (test.lhs, test.rhs))
        return Select(Bin(test.op, lhs, rhs), e.true, e.false)

    return _on_spine(body, rule)


def _exclusive_product(r: Reduce) -> Expr:
    renamed = {x.var: Var(x.var.name + "_other") for x in r.rvars}
    other = tuple(Range(renamed[x.var], x.lo, x.hi) for x in r.rvars)
    same = Bin(Op.EQ, flat_index(other), flat_index(r.rvars))
    body = substitute(r.body, renamed)
    where = substitute(r.where, renamed) if r.where is not None else None
    return Reduce("prod", Select(same, _c(1, body), body), other, where)


def _backprop(e: Expr, g: Expr, path: tuple[Expr, ...], emit, needs: set[str], f: Func) -> None:
    if not any(isinstance(n, Load) and n.buffer in needs for n in walk(e)):
        return
    match e:
        case Load(buffer, _, dtype):
            if buffer in needs and is_float(dtype):
                emit(e, g, path)
        case Bin(op, lhs, rhs):
            if op not in BIN_RULES:
                return  # comparisons and logic have no derivative
            if not is_float(dtype_of(e)):
                return
            for child, adj in zip((lhs, rhs), BIN_RULES[op](e, g), strict=True):
                if adj is not None:
                    _backprop(child, adj, path, emit, needs, f)
        case Call(fn, args):
            if not is_float(dtype_of(e)):
                return
            if fn not in CALL_RULES:
                raise NotDifferentiableError(f"halide_ad has no derivative for {fn}(...) in {f.name}",
                                             f.loc)
            for child, adj in zip(args, CALL_RULES[fn](e, g), strict=True):
                if adj is not None:
                    _backprop(child, adj, path, emit, needs, f)
        case Select(c, t, fl):
            _backprop(t, g, path + (c,), emit, needs, f)
            _backprop(fl, g, path + (Call("not", (c,)),), emit, needs, f)
        case Cast(dtype, v):
            if is_float(dtype) and is_float(dtype_of(v)):
                _backprop(v, cast(dtype_of(v), g), path, emit, needs, f)
        case Reduce():
            raise InternalError(f"a reduction inside {f.name}'s body was not given a Func of its own")


def _merge(scatters: list[Scatter]) -> tuple[Scatter, ...]:
    """Contributions with the same index, domain and predicate become one, values summed. Two whose
    predicates differ only in a test and its negation (a select's two branches reading the same
    point, as in a leaky relu) become one whose value is that select: one guard per point, not two.
    """
    merged: dict[tuple, Scatter] = {}
    for s in scatters:
        key = (s.buffer, s.index, s.domain, s.where)
        if key in merged:
            m = merged[key]
            merged[key] = Scatter(m.buffer, m.index, Bin(Op.ADD, m.value, s.value), m.domain, m.where, m.loc)
        else:
            merged[key] = s
    out: list[Scatter] = []
    for s in merged.values():
        for k, m in enumerate(out):
            same_points = (m.buffer, m.index, m.domain) == (s.buffer, s.index, s.domain)
            split = _branches(m.where, s.where) if same_points else None
            if split is not None:
                common, test, first = split
                values = (m.value, s.value) if first else (s.value, m.value)
                out[k] = Scatter(m.buffer, m.index, Select(test, *values), m.domain, common, m.loc)
                break
        else:
            out.append(s)
    return tuple(out)


def _branches(a: Expr | None, b: Expr | None) -> tuple[Expr | None, Expr, bool] | None:
    """Where predicates `a` and `b` are the same conjunction but for one term, `test` in one and
    `not test` in the other: (the rest, test, whether `a` holds the test); else None."""
    ta, tb = conjuncts(a), conjuncts(b)
    if len(ta) != len(tb):
        return None
    differ = [k for k, (x, y) in enumerate(zip(ta, tb)) if x != y]
    if len(differ) != 1:
        return None
    (k,) = differ
    rest = conjunction(ta[:k] + ta[k + 1:])
    if tb[k] == Call("not", (ta[k],)):
        return rest, ta[k], True
    if ta[k] == Call("not", (tb[k],)):
        return rest, tb[k], False
    return None

