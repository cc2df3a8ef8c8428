"""Reverse mode while tracing: a gradient as Funcs of the program being traced.

Called on symbolic Tensors (inside an `@hd.func`, or inside another transformation), `hd.grad`,
`hd.value_and_grad` and `hd.vjp` trace the function into the enclosing program, run reverse mode
on the Funcs it added, invert each scatter (solver/invert.py) and write each inverse back as a
Func:

* a gather piece without loops is `select(guards, value, 0)` at the point j;
* a gather piece with loops over free variables (a window, a clamp's edge strip) is a sum over an
  rdom spanning the loops' bounds, with a `where` that holds the loops' exact bounds and guards.

The adjoints are then ordinary Funcs: compiled with the rest of the program, and differentiated
again by the same path (a Hessian-vector product, reverse over reverse). A scatter the inverter
could not turn into a gather (a data-dependent index) has no form as a gather Func: it becomes an
update definition of the adjoint, `d_B[idx(i)] += v(i)` over the scatter's loops, after the
gathers' sum; updates run deterministically, and their own gradients and tangents are gathers and
updates again.

Update definitions: an accumulation's or a one-write-per-point update's adjoint is scatters like
any other; a scan's backward run is written back as update definitions of its own
(halide_ad/retrace_scan.py), which refuses the taped ones.

The adjoint of buffer B is the Func `d_B` (never `adj_B`: the compiler names its own adjoint
buffers so, and this program's gradient has one for every Func). Semantics follow JAX: the
function sees copies of the differentiated arguments; a tensor it reads
from the enclosing trace (a closure) is a constant for this gradient.
"""
from __future__ import annotations

import numbers
from dataclasses import replace

import numpy as np

from halide_ad import ir
from halide_ad.ad import reverse_mode
from halide_ad.affine import Affine, linear_form
from halide_ad.api import as_function
from halide_ad.errors import NotDifferentiableError, ShapeError, TraceError, user_loc
from halide_ad.ir import Adjoint, Bin, Expr, Func, Load, Op, Range, Reduce, Select, Var, cast, const
from halide_ad.retrace_scan import scan_as_updates
from halide_ad.runtime.plans import gather_vars
from halide_ad.solver import Fallback, invert
from halide_ad.solver.bounds import interval
from halide_ad.solver.invert import GatherPiece
from halide_ad.solver.updates import check_write_bounds
from halide_ad.stages import add_func, lift_reductions
from halide_ad.tensor import BoundaryView, Tensor, captured, compute
from halide_ad.trace import TraceState, current
from halide_ad.traverse import conjunction, free_vars, rewrite, simplify, substitute, walk
from halide_ad.trees import flatten
from halide_ad.update_ad import runs_backwards
from halide_ad.updates import finished


class _Traced:
    """`fn` traced into the enclosing program on copies of its differentiated arguments."""

    def __init__(self, fn, args: tuple, kwargs: dict, diff: tuple[int, ...], fn_name: str):
        self.state = state = current()
        self.fn_name = fn_name
        self.copies: dict[int, Tensor] = {}
        call_args = list(args)
        for k in diff:
            view = args[k] if isinstance(args[k], BoundaryView) else None
            a = view.tensor if view is not None else args[k]
            if not isinstance(a, Tensor) or not ir.is_float(a.buffer.dtype):
                continue
            copy = self.copies[k] = compute(a.shape, lambda *i, a=a: a[i], name=f"{a.name}_arg")
            call_args[k] = copy if view is None else BoundaryView(copy, view.kind, view.value)
        start = len(state.funcs)
        result = as_function(fn)(*call_args, **kwargs)
        leaves, self.rebuild = flatten(result, f"the result of {fn_name}")
        inputs = {t.name for t in self.copies.values()}
        outputs = []
        for leaf in leaves:  # each output a Func of this trace, once
            if leaf.name in outputs or leaf.name in inputs or not _defined_since(state, start, leaf.name):
                leaf = compute(leaf.shape, lambda *i, t=leaf: t[i], name=f"{leaf.name}_out")
            outputs.append(leaf.name)
        self.outputs = [Tensor(state.buffer(o)) for o in outputs]
        funcs = tuple(state.funcs[start:])
        defined = {f.name for f in funcs}
        # custom rules called within fn hold for this gradient too (halide_ad/custom.py)
        overrides = tuple(o for o in state.overrides if set(o.region) <= defined)
        adjoints = {ir.adjoint_name(name) for o in overrides for name in o.outputs}
        read = dict.fromkeys(n.buffer for f in funcs for n in walk(f.body) if isinstance(n, Load))
        read |= dict.fromkeys(n.buffer for o in overrides for sc in o.scatters
                              for e in (sc.value, sc.where, *sc.index) if e is not None
                              for n in walk(e) if isinstance(n, Load) and n.buffer not in adjoints)
        self.program = ir.Program(fn_name, tuple(state.buffer(n) for n in read if n not in defined),
                                  funcs, tuple(outputs), overrides)

    def result(self):
        return self.rebuild(self.outputs)

    def pullback(self, seeds: dict[str, Expr | Tensor]) -> dict[int, Tensor]:
        """The adjoint of each differentiated argument, as a Tensor, for the cotangents `seeds`
        (by output name: a scalar constant or a Tensor of the output's shape)."""
        wrt = tuple(t.name for t in self.copies.values())
        if not wrt:
            return {}
        built = _adjoint_funcs(self.state, self.program, wrt, seeds, self.fn_name)
        return {k: Tensor(built[t.name].buffer) for k, t in self.copies.items()}


def _defined_since(state: TraceState, start: int, name: str) -> bool:
    return any(f.name == name for f in state.funcs[start:])


def _adjoint_funcs(state: TraceState, program: ir.Program, wrt: tuple[str, ...],
                   seeds: dict[str, Expr | Tensor], fn_name: str) -> dict[str, Func]:
    """{buffer: its adjoint Func}, added to `state`, for every buffer reverse mode reaches."""
    adjoints = reverse_mode(program, wrt)
    reached = {a.buffer for a in adjoints}
    built: dict[str, Func | ir.Update] = {}
    scans: dict[str, tuple[str, ir.Update]] = {}  # adj_<a scan's writes> -> (its backward run, the update)
    # a scan's start (a pointwise Func) is computed where the gradient reads it (tanh's derivative
    # holds tanh): read, it would get a second adjoint besides the scan's (update_ad.runs_backwards)
    starts = {f.prev: program.func(f.prev) for f in program.funcs if isinstance(f, ir.Update) and runs_backwards(f)}
    starts = {name: f for name, f in starts.items() if isinstance(f, Func) and not isinstance(f.body, Reduce)}
    argindex: dict[str, Func] = {}
    broadcasts: set[str] = set()  # adjoints that are a constant or a scalar's value at every point

    def rename(e: Expr) -> Expr:  # adj_F and arg_F as the Funcs of this trace that hold them
        def rule(n: Expr):
            if not isinstance(n, Load):
                return None
            if (scan := scans.get(n.buffer)) is not None:
                return _written(*scan, n.index)
            if (start := starts.get(n.buffer)) is not None:
                return substitute(start.body, dict(zip(start.vars, n.index, strict=True)))
            for name in reached:
                if n.buffer == ir.adjoint_name(name):
                    f = built[name]
                    if f.name in broadcasts:  # computed where it is read, not stored
                        return substitute(f.body, dict(zip(f.vars, n.index, strict=True)))
                    return Load(f.name, n.index, n.dtype, n.loc)
                if n.buffer == ir.argindex_name(name):
                    return Load(_argindex_func(state, program.func(name), argindex).name, n.index,
                                ir.INDEX_DTYPE, n.loc)
            return None
        return rewrite(e, rule)

    for adj in adjoints:
        if adj.buffer in built:  # the adjoint of a scan's start, made with its backward run
            continue
        if adj.scan is not None:  # halide_ad/retrace_scan.py
            v, built[adj.scan.update.prev] = scan_as_updates(state, adj.scan, built[adj.scan.update.name].name,
                                                             rename, fn_name)
            scans[ir.adjoint_name(adj.buffer)] = (v, adj.scan.update)
            continue
        js = gather_vars(adj, frozenset(state.names))  # (a buffer named j0 would shadow a variable)
        terms = [] if not adj.seeded else [_seed(seeds[adj.buffer], js, adj)]
        scattered = []  # no form as a gather (a data-dependent index): updates of the gathers' sum
        for s in adj.scatters:
            inverse = invert(s, adj.shape, js)
            if isinstance(inverse, Fallback):
                scattered.append(s)
                continue
            for piece in inverse.pieces:
                term = _piece_term(state, piece, js, adj, rename)
                if term is not None:
                    terms.append(term)
        body = terms[0] if terms else const(0, adj.dtype)
        for t in terms[1:]:
            body = Bin(Op.ADD, body, t)
        name = state.fresh_name(f"d_{adj.buffer}")
        body = cast(adj.dtype, simplify(body))
        built[adj.buffer] = add_func(state, Func(name, js, adj.shape, body, adj.dtype, user_loc()))
        for s in scattered:
            built[adj.buffer] = _scatter_update(state, built[adj.buffer].name, s, adj, rename)
        if not scattered and not free_vars(body) and not any(isinstance(n, Reduce) for n in walk(body)):
            broadcasts.add(name)  # a sum's adjoint, spread over what it summed
    return built


def _scatter_update(state: TraceState, prev: str, s: ir.Scatter, adj: Adjoint, rename) -> ir.Update:
    """`adj_B[index] += value` over the scatter's domain where its guard holds, as an update of
    `prev` (added to `state`): a scatter's domain variable that stands bare in one position of the
    index, over the whole dimension, is a pure variable (the update runs in parallel over it); the
    others are its rdom, summed in order or in fixed partitions (docs/updates.md), so the bits are
    the same on every run. Its adjoint is a gather, and hd.jvp goes through it."""
    fresh = {r.var: Var(state.fresh_name(r.var.name, loop_var=True)) for r in s.domain}
    local = lambda e: None if e is None else substitute(rename(e), fresh)  # noqa: E731
    index, where = tuple(map(local, s.index)), local(s.where)
    ranges = {fresh[r.var]: Range(fresh[r.var], r.lo, r.hi) for r in s.domain}
    pure, pure_dims = [], []
    for d, e in enumerate(index):
        r = ranges.get(e)
        if r is not None and (r.lo, r.hi) == (0, adj.shape[d]) and sum(e in free_vars(i) for i in index) == 1:
            pure.append(r)
            pure_dims.append(d)
    rdom = tuple(r for r in ranges.values() if r not in pure)
    value = cast(adj.dtype, local(s.value))
    if any(isinstance(n, Reduce) for n in walk(value)):  # a product's gradient: Funcs of their own
        value = _lifted(state, value, [where] if where is not None else [], ranges, tuple(ranges), adj)
    name = state.fresh_name(f"d_{adj.buffer}")
    value = Bin(Op.ADD, Load(name, index, adj.dtype), value)
    update = finished(check_write_bounds(ir.Update(name, prev, adj.shape, adj.dtype, tuple(pure), tuple(pure_dims),
                                                   rdom, index, value, where, s.loc or user_loc())))
    state.funcs.append(update)
    return update


def _written(v: str, u: ir.Update, point: tuple[Expr, ...]) -> Load:
    """The adjoint of the value that u wrote at `point` (pure variables, then rdom variables from 0):
    its backward run's final value at the element that point wrote."""
    at = {r.var: p if not r.lo else Bin(Op.ADD, p, const(r.lo)) for r, p in zip(u.pure + u.rdom, point, strict=True)}
    return Load(v, tuple(substitute(e, at) for e in u.index), u.dtype)


def _seed(seed, js: tuple[Var, ...], adj: Adjoint) -> Expr:
    if isinstance(seed, Tensor):
        return cast(adj.dtype, Load(seed.name, js, seed.buffer.dtype))
    return const(seed, adj.dtype)


def _piece_term(state: TraceState, piece, js: tuple[Var, ...], adj: Adjoint, rename) -> Expr | None:
    """One gather piece as an expression at the point js: a select, or a load of a Func that sums
    over an rdom with a `where` (the piece's loops); None where the piece is empty."""
    piece = _pinned_loops_fixed(piece)
    # The loops' variables become rdom variables, named as the trace names them: a Func inlined
    # into another (runtime/inline.py) must not capture its reader's variables.
    fresh = {loop.var: Var(state.fresh_name("r")) for loop in piece.loops}
    local = lambda e: substitute(rename(e), fresh)  # noqa: E731
    value = cast(adj.dtype, local(piece.value))
    guards = [local(g) for level in piece.guards for g in level]
    ranges = {j: Range(j, 0, n) for j, n in zip(js, adj.shape, strict=True)}
    bounds = []
    for loop in (Range(fresh[r.var], local(r.lo), local(r.hi)) for r in piece.loops):
        boxes = {r.var: (r.lo, r.hi - 1) for r in ranges.values()}
        lo, hi = interval(loop.lo, boxes), interval(loop.hi, boxes)
        if lo is None or hi is None:
            raise NotDifferentiableError(f"the loop {loop.var.name} in [{loop.lo}, {loop.hi}) of a "
                                         f"gather into adj_{adj.buffer} has no bounded range, so it "
                                         "cannot be an rdom", user_loc())
        if lo[0] >= hi[1]:
            return None
        ranges[loop.var] = Range(loop.var, lo[0], hi[1])
        bounds += [simplify(Bin(Op.LE, loop.lo, loop.var)), simplify(Bin(Op.LT, loop.var, loop.hi))]
    if any(isinstance(n, Reduce) for n in walk(value)):  # a product's gradient: Funcs of their own
        value = _lifted(state, value, bounds + guards, ranges, js, adj)
    if not piece.loops:
        cond = conjunction(guards)
        return value if cond is None else Select(cond, value, const(0, adj.dtype))
    body = Reduce("sum", value, tuple(ranges[v] for v in fresh.values()), conjunction(bounds + guards))
    name = state.fresh_name(f"d_{adj.buffer}_window")
    func = add_func(state, Func(name, js, adj.shape, body, adj.dtype, user_loc()))
    return Load(func.name, js, adj.dtype)


def _pinned_loops_fixed(piece: GatherPiece) -> GatherPiece:
    """`piece` with each loop that a guard inside it pins to one value (`x - 63 == 0`: a clamp's
    edge strip, read by every x past the edge) replaced by that value, the loop's bounds kept as
    guards: a loop over the whole axis for one point would cost a pass over the axis per point."""
    k = 0
    while k < len(piece.loops):
        loop = piece.loops[k]
        inner = {r.var for r in piece.loops[k:]}
        value = next((v for g in piece.guards[k + 1] if (v := _pinned(g, loop.var)) is not None
                      and not free_vars(v) & inner), None)
        if value is None:
            k += 1
            continue
        fixed = piece.fixing(k, value)
        bounds = (simplify(Bin(Op.LE, loop.lo, value)), simplify(Bin(Op.LT, value, loop.hi)))
        guards = list(fixed.guards)
        guards[k] = guards[k] + bounds
        piece = replace(fixed, guards=tuple(guards))
    return piece


def _pinned(guard: Expr, var: Var) -> Expr | None:
    """The value of `var` where `guard`, an equation linear in it with coefficient 1 or -1, holds."""
    if not (isinstance(guard, Bin) and guard.op is Op.EQ):
        return None
    form = linear_form(Bin(Op.SUB, guard.lhs, guard.rhs))
    if form is None or form[0].get(var) not in (1, -1):
        return None
    coefficients, constant = form
    c = coefficients[var]  # var = -(rest) / c, and 1 / c == c
    return Affine.of({v: -a * c for v, a in coefficients.items() if v != var and a}, -constant * c).to_expr()


def _lifted(state: TraceState, value: Expr, guards: list[Expr], ranges: dict[Var, Range], js,
            adj: Adjoint) -> Expr:
    """`value` with each reduction nested in it given a Func of its own (`lift_reductions`, which
    reads the loops' ranges from the trace state, so they are put there for the while). Each such
    Func runs over the whole box of its variables, so the guards it can test join its `where`:
    outside them it would read out of bounds."""
    def guarded(n: Expr):
        if not isinstance(n, Reduce):
            return None
        mine = [g for g in guards if free_vars(g) <= free_vars(n)]
        where = conjunction(([n.where] if n.where is not None else []) + mine)
        return Reduce(n.op, n.body, n.rvars, where, n.loc)

    value = rewrite(value, guarded)
    saved = {v: state.var_ranges[v] for v in ranges if v in state.var_ranges}
    state.var_ranges.update(ranges)
    try:
        return lift_reductions(state, value, js, f"d_{adj.buffer}")
    finally:
        for v in ranges:
            state.var_ranges.pop(v, None)
        state.var_ranges.update(saved)


def _argindex_func(state: TraceState, f: Func, made: dict[str, Func]) -> Func:
    """The position of max or min reduction f's first extremum (what the forward pass stores as
    its argindex), as a Func of the trace."""
    if f.name not in made:
        op = "argmax" if f.body.op == "max" else "argmin"
        body = Reduce(op, f.body.body, f.body.rvars, f.body.where, f.body.loc)
        made[f.name] = add_func(state, Func(state.fresh_name(f"{f.name}_{op}"), f.vars, f.shape, body,
                                            ir.INDEX_DTYPE, f.loc))
    return made[f.name]


# ---- the transformations, while tracing ---------------------------------------------------------

def _lift(args: tuple, positions) -> tuple:
    """`args` with each float numpy array at `positions` made a Tensor of the trace (a captured
    array, halide_ad/capture.py), so that it can be differentiated, as JAX's transformations
    differentiate a numpy argument."""
    return tuple(captured(a) if k in positions and isinstance(a, np.ndarray) and a.dtype.kind == "f" else a
                 for k, a in enumerate(args))


def _argnums(args: tuple, argnums: tuple, fn_name: str) -> tuple[int, ...]:
    out = []
    for k in argnums:
        if not isinstance(k, numbers.Integral) or isinstance(k, bool):
            raise NotDifferentiableError(f"argnums must be an int or a tuple of ints, got {k!r}")
        if not -len(args) <= k < len(args):
            raise NotDifferentiableError(f"argnums={k} but {fn_name} was called with {len(args)} "
                                         "positional argument(s)")
        a = args[k]
        a = a.tensor if isinstance(a, BoundaryView) else a
        if not isinstance(a, Tensor):
            raise NotDifferentiableError(f"argument {k} of {fn_name} is {type(a).__name__}, not a "
                                         "traced array; only float32/float64 arrays have gradients")
        if not ir.is_float(a.buffer.dtype):
            raise NotDifferentiableError(f"argument {k} ({a.name!r}) of {fn_name} is a "
                                         f"{a.buffer.dtype} array: integer and bool arrays are data, "
                                         "not differentiable")
        out.append(k % len(args))
    return tuple(out)


def value_and_grad(fn, argnums: tuple[int, ...], single: bool, args: tuple, kwargs: dict):
    name = getattr(fn, "__name__", "fn")
    args = _lift(args, {k % len(args) for k in argnums if isinstance(k, int) and -len(args) <= k < len(args)})
    nums = _argnums(args, argnums, name)
    traced = _Traced(fn, args, kwargs, tuple(dict.fromkeys(nums)), name)
    (out,) = traced.outputs if len(traced.outputs) == 1 else (None,)
    if out is None or out.shape != ():
        shapes = [t.shape for t in traced.outputs]
        raise NotDifferentiableError(f"hd.grad needs {name} to return one scalar (shape ()), but it "
                                     f"returned shape(s) {shapes}; reduce it (e.g. hd.sum) or use hd.vjp")
    grads = traced.pullback({out.name: 1})
    results = tuple(grads[k] for k in nums)
    return out, (results[0] if single else results)


def vjp(fn, args: tuple, kwargs: dict):
    name = getattr(fn, "__name__", "fn")
    args = _lift(args, range(len(args)))
    diff = tuple(k for k, a in enumerate(args) if isinstance(a, (Tensor, BoundaryView)))
    traced = _Traced(fn, args, kwargs, diff, name)

    def vjp_fn(cotangent):
        try:
            leaves, _ = flatten(cotangent, "the cotangent") if not isinstance(cotangent, numbers.Number) \
                else ([cotangent], None)
        except TraceError:
            raise TraceError(f"while tracing, the cotangent of {name}'s vjp must be hd.Tensors (or "
                             "numbers) with the outputs' structure", user_loc()) from None
        if len(leaves) != len(traced.outputs):
            raise ShapeError(f"the cotangent must have the structure of {name}'s outputs "
                             f"({len(traced.outputs)} array(s)), got {len(leaves)}", user_loc())
        seeds = {}
        for out, ct in zip(traced.outputs, leaves, strict=True):
            if isinstance(ct, Tensor) and tuple(ct.shape) != tuple(out.shape):
                raise ShapeError(f"the cotangent for output {out.name!r} has shape {tuple(ct.shape)}; "
                                 f"it must be {tuple(out.shape)}, the output's shape", user_loc())
            seeds[out.name] = ct
        grads = traced.pullback(seeds)
        return tuple(grads.get(k) for k in range(len(args)))

    return traced.result(), vjp_fn
