"""Update definitions, the front end: `hd.var` and `t[index] = value` (`t[index] += value` arrives
as `t[index] = t[index] + value`; `hd.zeros` and `hd.full` make a tensor to update). Each update becomes an
`ir.Update`, a new stage of the tensor: the Tensor object then names the new stage, so later reads
see the updated values. See docs/updates.md."""
from __future__ import annotations

import dataclasses
import math
import numbers
import sys


from halide_ad import config, ir
from halide_ad.errors import ShapeError, TraceError, is_user_frame, user_loc
from halide_ad.expr import Expr, is_tensorlike, to_node
from halide_ad.solver.bounds import check_bounds
from halide_ad.solver.updates import check_write_bounds, independent_rdom, reversible
from halide_ad.stages import assigned_names, index_nodes, lift_reductions
from halide_ad.trace import require
from halide_ad.update_ad import tapes
from halide_ad.traverse import free_vars, rewrite, walk


def var(name: str | None = None) -> Expr:
    """A pure variable for update definitions: it spans the dimension where it stands bare in the
    updated index, and every point of it is updated independently."""
    state = require("hd.var")
    caller = sys._getframe(1)
    if name is None:
        names = is_user_frame(caller) and assigned_names(caller, 1)
        name = names[0] if names else "x"
    v = ir.Var(state.fresh_name(name, loop_var=True))
    state.update_vars.add(v)
    return Expr(v)


def set_item(t, index, value) -> None:
    """`t[index] = value` while tracing, `t` a Tensor (halide_ad/tensor.py): appends an `ir.Update`
    stage and makes `t` name it."""
    state = require("an update definition (t[index] = value)")
    loc = user_loc()
    prev = t.name
    if any(b.name == prev for b in state.inputs):
        raise TraceError(f"an update definition writes into the argument {prev}; arguments cannot be "
                         f"updated. Copy it first, e.g. {prev}2 = hd.compute({prev}.shape, lambda *i: "
                         f"{prev}[i]), and update the copy", loc)
    if not any(f.name == prev for f in state.funcs):
        raise TraceError(f"an update definition writes into {prev}, which this trace did not make; "
                         "update only tensors made in the same function (hd.zeros, hd.full, hd.compute)", loc)
    if state.compute_vars is not None:
        raise TraceError(f"an update definition of {prev} inside hd.compute's function; write it "
                         "after the hd.compute, at the top level of the traced function", loc)
    index = index if isinstance(index, tuple) else (index,)
    value = _value_node(t, _live_element(t, index, value), loc)
    if len(index) == t.ndim:  # a negative int counts from the end, as in numpy
        index = tuple(i + n if isinstance(i, numbers.Integral) and -n <= i < 0 else i for i, n in zip(index, t.shape))
    index = index_nodes(t.buffer, index)
    pure, pure_dims = _pure_vars(state, t, index, loc)
    for r in pure:
        state.var_ranges[r.var] = r
    used = set().union(*(free_vars(e) for e in (*index, value)))
    rvars = [v for v in state.var_ranges if v in used and v in state.reduction_vars]
    preds = {state.rdom_where[v] for v in rvars if v in state.rdom_where}
    for p in preds:
        rvars += [v for v in state.var_ranges if v in free_vars(p) and v in state.rdom_where and v not in rvars]
    rvars.sort(key=list(state.var_ranges).index)
    stray = used - set(rvars) - {r.var for r in pure}
    if stray:
        raise TraceError(f"the update of {prev} uses {', '.join(sorted(v.name for v in stray))}, which is "
                         "neither an hd.var standing bare in the updated index nor an hd.rdom variable", loc)
    pure_vars = tuple(r.var for r in pure)
    for n in walk(value):
        if isinstance(n, ir.Reduce) and (shared := {r.var for r in n.rvars} & set(rvars)):
            raise TraceError(f"hd.{n.op} inside the update of {prev} reduces over "
                             f"{', '.join(sorted(v.name for v in shared))}, which the update itself loops over; "
                             "compute the reduction into a tensor of its own first (hd.compute), then read it "
                             "in the update", loc)
    if any(isinstance(n, ir.Reduce) and any(ld.buffer == prev for ld in walk(n) if isinstance(ld, ir.Load))
           for n in walk(value)):
        raise TraceError(f"a reduction inside the update of {prev} reads {prev} itself; reduce into a "
                         "tensor of its own first, then update with it", loc)
    wrapped = ir.Call(ir.UPDATE_CALL, (value,))  # (a Reduce as the whole value is lifted too)
    value = lift_reductions(state, wrapped, pure_vars + tuple(rvars), f"{prev}_update").args[0]
    rdom = tuple(state.var_ranges[v] for v in rvars)
    where = None
    for p in sorted(preds, key=str):
        where = p if where is None else ir.Bin(ir.Op.AND, where, p)
    _check_points(prev, pure, rdom, loc)
    # the writes first: `t[e] += v` reads t[e] too, and an affine write out of range is the error to report
    index = check_write_bounds(ir.Update(prev, prev, t.buffer.shape, t.buffer.dtype, pure, pure_dims, rdom,
                                         index, value, where, loc)).index
    index, value = _check_reads(state, t, pure, rdom, index, value, where, loc)
    name = state.fresh_name(prev)
    def own(n: ir.Expr) -> ir.Expr | None:  # reads of the tensor read the stage being written
        return ir.Load(name, n.index, n.dtype, n.loc) if isinstance(n, ir.Load) and n.buffer == prev else None

    index = tuple(rewrite(e, own) for e in index)
    value = rewrite(value, own)
    where = None if where is None else rewrite(where, own)
    _check_pure_reads(name, prev, pure, pure_dims, (*index, value) + ((where,) if where is not None else ()), loc)
    update = finished(ir.Update(name, prev, t.buffer.shape, t.buffer.dtype, pure, pure_dims, rdom, index, value,
                                where, loc))
    state.funcs.append(update)
    t.buffer = update.buffer


def finished(update: ir.Update) -> ir.Update:
    """`update` with what z3 proves of it (at trace time) recorded: how it may run, and how its
    adjoint runs (ir.Update's independent, reversible, taped)."""
    independent = independent_rdom(update)
    update = dataclasses.replace(update, independent=independent, reversible=not independent and reversible(update))
    return dataclasses.replace(update, taped=tapes(update))


def _live_element(t, index: tuple, value):
    """`t[0] += x[r]` arrives as t.__getitem__(0), a 0-d slice (a snapshot of t), then
    t.__setitem__(0, slice + x[r]): the value reads that snapshot, and would add each x[r] to the
    old t[0]. When the slice was the last element `t` handed out, at this very index, it stands for
    t[0] itself, read as the update runs (Halide's `f(0) += x(r)`)."""
    item = t.last_item
    t.last_item = None
    if item is None or item[0] != index or not isinstance(value, Expr):
        return value
    live = ir.Load(t.name, tuple(ir.const(i % n) for i, n in zip(index, t.shape, strict=True)), t.buffer.dtype)
    return Expr(rewrite(value.node, lambda n: live if isinstance(n, ir.Load) and n.buffer == item[1] else None))


def _value_node(t, value, loc) -> ir.Expr:
    if is_tensorlike(value):
        raise TraceError(f"an update of {t.name} assigns the whole tensor {value}; assign one element, "
                         "e.g. t[i] = x[i] with i = hd.var()", loc)
    node = to_node(value, t.buffer.dtype)
    have, want = ir.dtype_of(node), t.buffer.dtype
    if ir.is_float(have) and not ir.is_float(want):
        raise TraceError(f"an update of the {want} tensor {t.name} assigns the {have} value `{node}`; "
                         f"convert it explicitly with hd.cast(value, '{want}')", loc)
    return ir.cast(want, node)


def _pure_vars(state, t, index, loc) -> tuple[tuple[ir.Range, ...], tuple[int, ...]]:
    """The hd.vars of the update, each with the dimension where it stands bare."""
    used = set().union(*(free_vars(e) for e in index))
    ranges, dims = [], []
    for d, e in enumerate(index):
        if isinstance(e, ir.Var) and e in state.update_vars:
            if e in (r.var for r in ranges):
                raise TraceError(f"the pure variable {e.name} stands in two positions of the index of "
                                 f"{t.name}; use one hd.var per dimension", loc)
            ranges.append(ir.Range(e, 0, t.buffer.shape[d]))
            dims.append(d)
    bare = {r.var for r in ranges}
    for v in used & state.update_vars - bare:
        raise TraceError(f"the pure variable {v.name} appears in the index of {t.name} inside an "
                         f"expression; an hd.var must stand alone in one position (t[{v.name}, ...]); "
                         "use an hd.rdom variable for computed positions", loc)
    return tuple(ranges), tuple(dims)


def _check_points(name: str, pure, rdom, loc) -> None:
    points = math.prod(r.hi - r.lo for r in (*pure, *rdom))
    if points > config.max_points():
        raise ShapeError(f"the update of {name} loops over {points:.3g} points, past halide_ad's limit of "
                         f"{config.max_points():.3g} points per stage; check the sizes, or raise the limit "
                         "with the environment variable HALIDE_AD_MAX_POINTS", loc)


def _check_reads(state, t, pure, rdom, index, value, where, loc):
    """(index, value) once every read in them is proved in range (data-dependent ones are checked
    at run time); else BoundsError. Reuses the Funcs' check on a stand-in Func over the update's
    domain."""
    parts = ir.Call(ir.UPDATE_CALL, (*index, value))
    body = ir.Reduce("sum", parts, rdom, where, loc) if rdom else parts
    probe = ir.Func(t.name + "_update", tuple(r.var for r in pure), tuple(r.hi for r in pure), body,
                    t.buffer.dtype, loc)
    checked = check_bounds(probe, state.buffer).body
    args = (checked.body if rdom else checked).args
    return args[:-1], args[-1]


def _check_pure_reads(name: str, prev: str, pure, pure_dims, exprs, loc) -> None:
    """Halide's rule: a read of the updated tensor uses each pure variable at its own position, so
    pure points never read each other's writes."""
    for e in exprs:
        for load in (n for n in walk(e) if isinstance(n, ir.Load) and n.buffer == name):
            for r, d in zip(pure, pure_dims, strict=True):
                if load.index[d] != r.var:
                    raise TraceError(f"the update of {prev} reads {prev} at position {d} with "
                                     f"`{load.index[d]}`, where the write has the pure variable {r.var.name}; "
                                     f"a read of the tensor being updated must use {r.var.name} there too "
                                     "(pure points are independent). Use an hd.rdom variable to scan "
                                     "along that dimension instead", loc)
