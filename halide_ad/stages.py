"""Funcs from element functions, below the Tensor that wraps them: hd.compute's core (`define`),
`hd.rdom` and its reductions (`reduce_rdom`), each reduction nested in a body given a Func of its
own, and every Func's checks (shape, size, reads in bounds) as it joins the trace."""
from __future__ import annotations

import dis
import inspect
import math
import numbers
import sys

from halide_ad import config, ir
from halide_ad.errors import ShapeError, TraceError, is_user_frame, user_loc
from halide_ad.expr import Expr, is_tensorlike, to_node
from halide_ad.solver.bounds import check_bounds, func_domain, guarded_loads
from halide_ad.trace import TraceState, require
from halide_ad.traverse import free_vars, rewrite, substitute

_STORES = {"STORE_FAST", "STORE_NAME", "STORE_DEREF", "STORE_GLOBAL"}


def assigned_names(frame, count: int) -> list[str] | None:
    """The names that the caller's statement assigns the call's result to (`c, r, s = hd.rdom(...)`
    gives ["c", "r", "s"]), read from its bytecode; None where it does not store plain names."""
    following = [ins for ins in dis.get_instructions(frame.f_code) if ins.offset > frame.f_lasti][:count + 1]
    if count > 1:
        if not following or following[0].opname != "UNPACK_SEQUENCE" or following[0].arg != count:
            return None
        following = following[1:]
    stores = following[:count]
    if len(stores) != count or any(ins.opname not in _STORES for ins in stores):
        return None
    return [ins.argval for ins in stores]


def index_nodes(buffer: ir.Buffer, index: tuple) -> tuple[ir.Expr, ...]:
    """The IR of an element's index into `buffer`, each an integer checked here."""
    if len(index) != len(buffer.shape):
        raise ShapeError(f"{buffer.name} has {len(buffer.shape)} dimension(s) (shape {buffer.shape}) but "
                         f"was indexed with {len(index)} index(es)", user_loc())
    nodes = []
    for i in index:
        node = to_node(i)
        if ir.dtype_of(node) not in ("int64", "int32", "int16", "int8", "uint8", "uint16", "uint32"):
            raise TraceError(f"the index `{node}` into {buffer.name} is {ir.dtype_of(node)}; indices must "
                             "be integers (use hd.cast(x, 'int64') or hd.floor first)", user_loc())
        nodes.append(ir.cast(ir.INDEX_DTYPE, node))
    return tuple(nodes)


def element(buffer: ir.Buffer, index: tuple) -> Expr:
    """`buffer[index]`, read at the user's line."""
    return Expr(ir.Load(buffer.name, index_nodes(buffer, index), buffer.dtype, user_loc()))


def check_shape(shape, what: str) -> tuple[int, ...]:
    shape = (shape,) if isinstance(shape, numbers.Integral) else tuple(shape)
    for n in shape:
        if not isinstance(n, numbers.Integral) or isinstance(n, bool):
            raise ShapeError(f"{what} {shape} must hold Python ints, got {type(n).__name__} {n!r}", user_loc())
        if n <= 0:
            raise ShapeError(f"{what} {shape} has a dimension of size {n}; every extent must be "
                             "positive", user_loc())
    if math.prod(shape) > MAX_ELEMENTS:
        raise ShapeError(f"{what} {shape} has {math.prod(shape):.3g} elements, more than any machine "
                         f"can hold (halide_ad's limit is 2**{MAX_ELEMENTS.bit_length() - 1}); "
                         "check the sizes", user_loc())
    return tuple(int(n) for n in shape)


MAX_ELEMENTS = 2 ** 48  # 2 PiB of float64: far past any machine, and far from int64 index overflow


_DEFAULT_VAR_NAMES = ("i", "j", "k", "l", "m", "n")


def _param_names(fn, count: int) -> list[str]:
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        params = []
    if params and params[0].kind is inspect.Parameter.VAR_POSITIONAL:
        return list(_DEFAULT_VAR_NAMES[:count]) if count <= 6 else [f"i{d}" for d in range(count)]
    if len(params) != count:
        raise ShapeError(f"hd.compute got a shape of {count} dimension(s) but a function of "
                         f"{len(params)} argument(s); give it one index variable per dimension", user_loc())
    return [p.name for p in params]


def define(shape, fn, name: str | None, caller) -> ir.Buffer:
    """The buffer of a new Func whose element at index vars `(i, ...)` is `fn(i, ...)`: hd.compute
    without the Tensor around it. `caller`: the frame that called hd.compute, so that a name the
    user gave (not halide_ad's own sugar) is listed for hd.adjoints."""
    state = require("hd.compute")
    if not callable(fn):
        raise TraceError(f"hd.compute needs a function of the index variables, e.g. lambda i, j: ..., "
                         f"got {type(fn).__name__} {fn!r}", user_loc())
    if state.compute_vars is not None:
        raise TraceError("hd.compute was called inside another hd.compute's function; build the "
                         "inner tensor first, outside, and index it", user_loc())
    shape = check_shape(shape, "hd.compute's shape")
    loc = user_loc()
    names = _param_names(fn, len(shape))
    fvars = tuple(ir.Var(n if n not in state.names else n + "_") for n in names)
    if len(set(fvars)) != len(fvars):
        raise TraceError(f"hd.compute's function repeats an index variable name: {names}", loc)
    for v, n in zip(fvars, shape, strict=True):
        state.var_ranges[v] = ir.Range(v, 0, n)
    state.compute_vars = fvars
    try:
        result = fn(*(Expr(v) for v in fvars))
    finally:
        state.compute_vars = None
    if is_tensorlike(result):
        raise TraceError(f"hd.compute's function returned the whole tensor {result}; return one "
                         "element, e.g. t[i, j]", loc)
    body = to_node(result)
    fname = state.fresh_name(name or getattr(fn, "__name__", "f").replace("<lambda>", "f"))
    body = lift_reductions(state, body, fvars, fname)
    if name is not None and is_user_frame(caller):
        state.named.append(fname)
    return add_func(state, ir.Func(fname, fvars, shape, body, ir.dtype_of(body), loc)).buffer


def add_func(state: TraceState, func: ir.Func) -> ir.Func:
    domain, _ = func_domain(func)
    points = math.prod(r.hi - r.lo for r in domain)
    if points > config.max_points():
        rdoms = [(r.lo, r.hi) for r in domain[len(func.domain):]]
        raise ShapeError(f"{func.name} loops over {points:.3g} points (shape {func.shape}"
                         + (f", reduction ranges {rdoms}" if rdoms else "")
                         + f"), past halide_ad's limit of {config.max_points():.3g} points per stage, which "
                         "stops a wrong size from running for hours; check the sizes, or raise the "
                         "limit with the environment variable HALIDE_AD_MAX_POINTS", func.loc)
    func = check_bounds(func, state.buffer)
    state.funcs.append(func)
    return func


def lift_reductions(state: TraceState, body: ir.Expr, fvars, fname: str) -> ir.Expr:
    """Give each Reduce that is not the whole body a Func of its own, over the vars it uses.

    `hd.compute(s, lambda i, j: x[i, j] - hd.max(x[i, r]))` becomes `m[i] = max(x[i, r] ...)`
    and `out[i, j] = x[i, j] - m[i]`, so every Func is pointwise or one reduction.
    """
    lifted: dict[ir.Reduce, ir.Load] = {}  # hd.relu(hd.sum(...)) holds its sum twice: lift it once

    def lift(node: ir.Expr) -> ir.Expr | None:
        if not isinstance(node, ir.Reduce) or node is root:
            return None
        if node in lifted:
            return lifted[node]
        used = free_vars(node)
        order = list(fvars) + [v for v in state.var_ranges if v not in fvars]
        lvars = [v for v in order if v in used]
        ranges = [state.var_ranges[v] for v in lvars]
        shifted = {v: ir.Bin(ir.Op.ADD, v, ir.const(r.lo)) for v, r in zip(lvars, ranges, strict=True) if r.lo}
        lbody = substitute(node, shifted)
        lname = state.fresh_name(f"{fname}_{node.op}")
        func = add_func(state, ir.Func(lname, tuple(lvars), tuple(r.extent for r in ranges), lbody,
                                       ir.dtype_of(lbody), node.loc))
        index = tuple(ir.Bin(ir.Op.SUB, v, ir.const(r.lo)) if r.lo else v for v, r in zip(lvars, ranges, strict=True))
        lifted[node] = ir.Load(func.name, index, func.dtype, node.loc)
        return lifted[node]

    root = body if isinstance(body, ir.Reduce) else None
    return rewrite(body, lift)


def rdom(*extents, where=None):
    """Reduction variables over a box: an extent is an int n ([0, n)) or a (lo, hi) pair."""
    state = require("hd.rdom")
    if not extents:
        raise ShapeError("hd.rdom needs at least one extent, e.g. hd.rdom(3)", user_loc())
    rvars = []
    caller = sys._getframe(1)  # the user's names; halide_ad's own reductions keep `r`
    names = (is_user_frame(caller) and assigned_names(caller, len(extents))) or ["r"] * len(extents)
    for e, name in zip(extents, names, strict=True):
        lo, hi = (0, e) if not isinstance(e, (tuple, list)) else tuple(e)
        for b in (lo, hi):
            if not isinstance(b, numbers.Integral) or isinstance(b, bool):
                raise ShapeError(f"hd.rdom extent {e!r} must be an int or a (lo, hi) pair of ints", user_loc())
        if hi <= lo:
            raise ShapeError(f"hd.rdom extent {e!r} is empty; extents must be positive", user_loc())
        if max(abs(lo), abs(hi)) > MAX_ELEMENTS:
            raise ShapeError(f"hd.rdom extent {e!r} reaches past 2**{MAX_ELEMENTS.bit_length() - 1}, "
                             "beyond any array halide_ad can index; check the sizes", user_loc())
        v = ir.Var(state.fresh_name(name, loop_var=True))
        state.var_ranges[v] = ir.Range(v, int(lo), int(hi))
        state.reduction_vars.add(v)
        rvars.append(v)
    if where is not None:
        pred = to_node(where(*(Expr(v) for v in rvars)))
        if ir.dtype_of(pred) != "bool":
            raise TraceError(f"hd.rdom's where= must return a condition, got `{pred}`", user_loc())
        for v in rvars:
            state.rdom_where[v] = pred
    out = tuple(Expr(v) for v in rvars)
    return out[0] if len(out) == 1 else out


def reduce_rdom(op: str, x) -> Expr:
    """`op` over the rdom variables of the element expression `x` (hd.sum(x[i, r]))."""
    state = require(f"hd.{op}")
    node = to_node(x)
    used = free_vars(node)
    rvars = [v for v in state.var_ranges if v in used and v in state.reduction_vars]
    preds = {state.rdom_where[v] for v in rvars if v in state.rdom_where}
    for p in preds:
        rvars += [v for v in state.var_ranges if v in free_vars(p) and v in state.rdom_where and v not in rvars]
    if not rvars:
        raise TraceError(f"hd.{op}(`{node}`) has no reduction variable to reduce over; make "
                         "some with hd.rdom(...) and use them in the expression", user_loc())
    rvars.sort(key=list(state.var_ranges).index)
    _check_contraction(state, node, rvars)
    where = None
    for p in sorted(preds, key=str):
        where = p if where is None else ir.Bin(ir.Op.AND, where, p)
    if op in ("max", "min", "argmax", "argmin") and ir.dtype_of(node) == "bool":
        node = ir.cast(ir.INDEX_DTYPE, node)
    return Expr(ir.Reduce(op, node, tuple(state.var_ranges[v] for v in rvars), where, user_loc()))


def _check_contraction(state: TraceState, node: ir.Expr, rvars: list[ir.Var]) -> None:
    """A reduction variable that indexes tensors directly must span dimensions of one size, as in
    einsum: in `hd.sum(x[n, c, i + r, j + s] * w[k, c, r, s])` dimension 1 of x and of w are both c.
    If they differ (a conv whose channel counts disagree), the sum would skip part of one tensor or
    read past the other."""
    seen: dict[ir.Var, tuple[ir.Load, int, int]] = {}
    for load, conds in guarded_loads(node):
        if conds:  # under a select (constant_exterior): partial reads may be the point
            continue
        shape = state.buffer(load.buffer).shape
        for d, e in enumerate(load.index):
            if isinstance(e, ir.Cast):
                e = e.value
            if not (isinstance(e, ir.Var) and e in rvars):
                continue
            first, d0, n0 = seen.setdefault(e, (load, d, shape[d]))
            if n0 != shape[d]:
                raise ShapeError(
                    f"`{first}` and `{load}` share the reduction variable {e.name}, but it indexes "
                    f"dimension {d0} of {first.buffer} (size {n0}) and dimension {d} of {load.buffer} "
                    f"(size {shape[d]}): the shapes disagree (e.g. a convolution whose channel counts "
                    "differ). Check the arguments' shapes, or read the part you mean through a slice "
                    "of the larger tensor.", load.loc or user_loc())
