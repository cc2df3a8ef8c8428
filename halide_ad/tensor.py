"""Symbolic tensors and the DSL that builds Funcs: `compute`, `rdom`, reductions, boundary views,
and the numpy-style sugar (broadcasting arithmetic, reshape, transpose, slicing)."""
from __future__ import annotations

import dis
import inspect
import math
import numbers
import sys

import numpy as np

from halide_ad import config, ir
from halide_ad.capture import captured_buffer
from halide_ad.errors import BoundsError, ShapeError, SourceLoc, TraceError, is_user_frame, user_loc
from halide_ad.expr import Expr, array_function, array_ufunc, binary, to_node
from halide_ad.solver.bounds import check_bounds, func_domain, guarded_loads, interval
from halide_ad.trace import TraceState, current, require
from halide_ad.traverse import free_vars, rewrite, substitute


class Shape(tuple):
    """A Tensor's shape: a plain tuple, except that unpacking or indexing it with the wrong rank
    (`N, C, H, W = x.shape` for a 3-d x) is a ShapeError that names the tensor, not a bare
    ValueError from Python."""

    def __new__(cls, dims, owner: str):
        self = super().__new__(cls, dims)
        self.owner = owner
        return self

    def __iter__(self):
        frame = sys._getframe(1)
        code = frame.f_code.co_code
        at = frame.f_lasti
        if 0 <= at < len(code) - 1 and code[at] == _UNPACK_SEQUENCE and code[at + 1] != len(self) and (
                at < 2 or code[at - 2] != _EXTENDED_ARG):
            raise ShapeError(f"{self.owner} has shape {tuple(self)} ({len(self)} dimension(s)), but "
                             f"{frame.f_code.co_name} unpacks its shape into {code[at + 1]} names: "
                             "pass an array of the rank it expects",
                             SourceLoc(frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name))
        return super().__iter__()

    def __getitem__(self, k):
        if isinstance(k, numbers.Integral) and not -len(self) <= k < len(self):
            raise ShapeError(f"{self.owner} has shape {tuple(self)} ({len(self)} dimension(s)), so "
                             f"{self.owner}.shape[{k}] does not exist: pass an array of the rank the "
                             "program expects", user_loc())
        return super().__getitem__(k)


_UNPACK_SEQUENCE = dis.opmap["UNPACK_SEQUENCE"]
_EXTENDED_ARG = dis.opmap["EXTENDED_ARG"]
_STORES = {"STORE_FAST", "STORE_NAME", "STORE_DEREF", "STORE_GLOBAL"}


def _assigned_names(frame, count: int) -> list[str] | None:
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


class Tensor:
    """A whole symbolic array while tracing: a function input or the result of `hd.compute`."""

    __slots__ = ("buffer", "last_item")

    def __init__(self, buffer: ir.Buffer):
        self.buffer = buffer
        self.last_item = None  # (int index, the 0-d slice it gave): see updates._live_element

    name = property(lambda self: self.buffer.name)
    shape = property(lambda self: Shape(self.buffer.shape, self.buffer.name))
    ndim = property(lambda self: len(self.buffer.shape))
    dtype = property(lambda self: np.dtype(self.buffer.dtype))
    size = property(lambda self: math.prod(self.buffer.shape))

    def __repr__(self) -> str:
        return f"hd.Tensor({self.name}, shape={self.shape}, dtype={self.buffer.dtype})"

    def __getitem__(self, index):
        index = index if isinstance(index, tuple) else (index,)
        state = current()
        if (state is not None and state.compute_vars is not None) or any(isinstance(i, Expr) for i in index):
            return element(self, index)
        out = slice_tensor(self, index)
        self.last_item = (index, out.name) if out.ndim == 0 and state is not None else None
        return out

    def __setitem__(self, index, value):
        from halide_ad.updates import set_item  # update definitions (halide_ad/updates.py)
        set_item(self, index, value)

    def __bool__(self):
        raise TraceError(f"{self} has no truth value while tracing: Python control flow (`if`, `while`, "
                         "`and`/`or`) and the builtins max/min cannot branch on symbolic tensors; use "
                         "hd.where(cond, a, b), hd.maximum(a, b) or hd.minimum(a, b)", user_loc())

    def __abs__(self):
        raise TraceError(f"Python's abs() on the symbolic tensor {self.name}: use hd.abs({self.name})",
                         user_loc())

    def __round__(self, ndigits=None):
        raise TraceError(f"Python's round() on the symbolic tensor {self.name}: use hd.round({self.name})",
                         user_loc())

    def _not_a_number(self, *args):
        raise TraceError(f"{self} is symbolic and has no Python or numpy value while tracing; keep it "
                         "symbolic, with halide_ad's functions (hd.exp, hd.sum, hd.cast, ...)", user_loc())

    __int__ = __float__ = __index__ = __complex__ = __array__ = _not_a_number

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        return array_ufunc(ufunc, method, inputs, kwargs)

    def __array_function__(self, func, types, args, kwargs):
        if func in (np.shape, np.ndim, np.size) and len(args) == 1 and not kwargs:
            return getattr(self, func.__name__)  # np.shape(t), np.ndim(t), np.size(t)
        return array_function(func, args)

    def __len__(self):
        if not self.shape:
            raise TypeError("len() of a 0-d tensor")
        return self.shape[0]

    def __add__(self, o): return binary(ir.Op.ADD, self, o)
    def __radd__(self, o): return binary(ir.Op.ADD, o, self)
    def __sub__(self, o): return binary(ir.Op.SUB, self, o)
    def __rsub__(self, o): return binary(ir.Op.SUB, o, self)
    def __mul__(self, o): return binary(ir.Op.MUL, self, o)
    def __rmul__(self, o): return binary(ir.Op.MUL, o, self)
    def __truediv__(self, o): return binary(ir.Op.DIV, self, o)
    def __rtruediv__(self, o): return binary(ir.Op.DIV, o, self)
    def __floordiv__(self, o): return binary(ir.Op.FLOORDIV, self, o)
    def __mod__(self, o): return binary(ir.Op.MOD, self, o)
    def __pow__(self, o): return binary(ir.Op.POW, self, o)
    def __rpow__(self, o): return binary(ir.Op.POW, o, self)
    def __lt__(self, o): return binary(ir.Op.LT, self, o)
    def __le__(self, o): return binary(ir.Op.LE, self, o)
    def __gt__(self, o): return binary(ir.Op.GT, self, o)
    def __ge__(self, o): return binary(ir.Op.GE, self, o)
    def __eq__(self, o): return binary(ir.Op.EQ, self, o)  # type: ignore[override]
    def __ne__(self, o): return binary(ir.Op.NE, self, o)  # type: ignore[override]
    def __neg__(self): return map_elementwise(lambda a: -a, (self,), "neg")
    def __matmul__(self, o): return matmul(self, o)
    def __hash__(self):  # == builds an expression, so a Tensor cannot be a dict key (as JAX's tracers)
        raise TraceError(f"the symbolic tensor {self.name} cannot be a dict key or a set member while "
                         "tracing; was an array passed where a static option (a string or a number) "
                         "is expected?", user_loc())

    def sum(self, axis=None, keepdims=False): return reduce("sum", self, axis=axis, keepdims=keepdims)
    def prod(self, axis=None, keepdims=False): return reduce("prod", self, axis=axis, keepdims=keepdims)
    def max(self, axis=None, keepdims=False): return reduce("max", self, axis=axis, keepdims=keepdims)
    def min(self, axis=None, keepdims=False): return reduce("min", self, axis=axis, keepdims=keepdims)

    def mean(self, axis=None, keepdims=False):
        count = math.prod(self.shape[a] for a in _axes(axis, self.ndim))
        return self.sum(axis, keepdims) / count

    def reshape(self, *shape):
        return reshape(self, shape[0] if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape)

    def transpose(self, *axes):
        return transpose(self, axes[0] if len(axes) == 1 and isinstance(axes[0], (tuple, list)) else axes or None)

    @property
    def T(self):
        return transpose(self, None)


class BoundaryView:
    """A tensor that any integer index may read: `repeat_edge`, `constant_exterior`, `mirror`."""

    __slots__ = ("tensor", "kind", "value")

    def __init__(self, tensor: Tensor, kind: str, value=0.0):
        if isinstance(tensor, np.ndarray) and current() is not None:
            tensor = captured(tensor)
        if not isinstance(tensor, Tensor):
            raise TraceError(f"hd.{kind} takes a traced hd.Tensor, got {type(tensor).__name__}", user_loc())
        self.tensor, self.kind, self.value = tensor, kind, value

    shape = property(lambda self: self.tensor.shape)
    ndim = property(lambda self: self.tensor.ndim)
    dtype = property(lambda self: self.tensor.dtype)

    def __repr__(self) -> str:
        return f"hd.{self.kind}({self.tensor.name})"

    def __getitem__(self, index):
        index = index if isinstance(index, tuple) else (index,)
        nodes = _index_nodes(self.tensor, index)
        if self.kind == "constant_exterior":
            inside = [ir.Bin(ir.Op.AND, ir.Bin(ir.Op.GE, e, ir.const(0)), ir.Bin(ir.Op.LT, e, ir.const(n)))
                      for e, n in zip(nodes, self.shape, strict=True)]
            cond = inside[0] if inside else ir.const(True)
            for c in inside[1:]:
                cond = ir.Bin(ir.Op.AND, cond, c)
            load = ir.Load(self.tensor.name, nodes, self.tensor.buffer.dtype, user_loc())
            value = to_node(self.value, self.tensor.buffer.dtype)
            dtype = ir.promote(load.dtype, ir.dtype_of(value))
            return Expr(ir.Select(cond, ir.cast(dtype, load), ir.cast(dtype, value)))
        remap = _repeat_edge_index if self.kind == "repeat_edge" else _mirror_index
        nodes = tuple(remap(e, n) for e, n in zip(nodes, self.shape, strict=True))
        return Expr(ir.Load(self.tensor.name, nodes, self.tensor.buffer.dtype, user_loc()))


def repeat_edge(t: Tensor) -> BoundaryView:
    """A view of `t` that any integer index may read: out-of-range indices clamp to the edge."""
    return BoundaryView(t, "repeat_edge")


def constant_exterior(t: Tensor, value=0.0) -> BoundaryView:
    """A view of `t` that reads `value` outside its bounds."""
    return BoundaryView(t, "constant_exterior", value)


def mirror(t: Tensor) -> BoundaryView:
    """A view of `t` reflected at its edges without repeating them (numpy's 'reflect',
    Halide's mirror_interior)."""
    return BoundaryView(t, "mirror")


def _span(e: ir.Expr) -> tuple[int, int] | None:
    """The range of an index expression over the variables of the computation being traced."""
    state = current()
    return interval(e, {v: (r.lo, r.hi - 1) for v, r in state.var_ranges.items()}) if state else None


def _repeat_edge_index(e: ir.Expr, n: int) -> ir.Expr:
    """clamp(e, 0, n - 1), with only the sides that `e` can actually cross.

    The variables of `e` stay in the result even when it is constant (n == 1): a reduction over
    them still counts every point, as the user wrote it.
    """
    if isinstance(e, ir.Const):
        return ir.const(min(max(e.value, 0), n - 1))
    span = _span(e) or (-1, n)
    if span[0] < 0:
        e = ir.Bin(ir.Op.MAX, e, ir.const(0))
    if span[1] > n - 1:
        e = ir.Bin(ir.Op.MIN, e, ir.const(n - 1))
    return e


def _mirror_index(e: ir.Expr, n: int) -> ir.Expr:
    """numpy's 'reflect' (Halide's mirror_interior): n-1 - |n-1 - (|e| mod 2(n-1))|."""
    if n == 1:
        return _repeat_edge_index(e, 1)
    if isinstance(e, ir.Const):
        period = 2 * (n - 1)
        return ir.const(n - 1 - abs(n - 1 - abs(e.value) % period))
    span = _span(e)
    if span is not None and 0 <= span[0] and span[1] <= n - 1:
        return e  # provably inside: no reflection, and no boundary pieces for the inverter
    folded = ir.Bin(ir.Op.MOD, ir.Call("abs", (e,)), ir.const(2 * (n - 1)))
    return ir.Bin(ir.Op.SUB, ir.const(n - 1), ir.Call("abs", (ir.Bin(ir.Op.SUB, ir.const(n - 1), folded),)))


def is_tensorlike(x) -> bool:
    return isinstance(x, (Tensor, BoundaryView))


def _index_nodes(t: Tensor, index: tuple) -> tuple[ir.Expr, ...]:
    if len(index) != t.ndim:
        raise ShapeError(f"{t.name} has {t.ndim} dimension(s) (shape {t.shape}) but was indexed "
                         f"with {len(index)} index(es)", user_loc())
    nodes = []
    for i in index:
        node = to_node(i)
        if ir.dtype_of(node) not in ("int64", "int32", "int16", "int8", "uint8", "uint16", "uint32"):
            raise TraceError(f"the index `{node}` into {t.name} is {ir.dtype_of(node)}; indices must "
                             "be integers (use hd.cast(x, 'int64') or hd.floor first)", user_loc())
        nodes.append(ir.cast(ir.INDEX_DTYPE, node))
    return tuple(nodes)


def captured(array: np.ndarray) -> Tensor:
    """The Tensor over a numpy array that the traced function captured (halide_ad/capture.py)."""
    return Tensor(captured_buffer(array))


def element(t: Tensor, index: tuple) -> Expr:
    return Expr(ir.Load(t.name, _index_nodes(t, index), t.buffer.dtype, user_loc()))


# ---- compute and rdom ---------------------------------------------------------------------------

def _check_shape(shape, what: str) -> tuple[int, ...]:
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


def compute(shape, fn, name: str | None = None) -> Tensor:
    """A new Tensor whose element at index vars `(i, ...)` is `fn(i, ...)`."""
    state = require("hd.compute")
    if not callable(fn):
        raise TraceError(f"hd.compute needs a function of the index variables, e.g. lambda i, j: ..., "
                         f"got {type(fn).__name__} {fn!r}", user_loc())
    if state.compute_vars is not None:
        raise TraceError("hd.compute was called inside another hd.compute's function; build the "
                         "inner tensor first, outside, and index it", user_loc())
    shape = _check_shape(shape, "hd.compute's shape")
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
    body = _lift_reductions(state, body, fvars, fname)
    if name is not None and is_user_frame(sys._getframe(1)):
        state.named.append(fname)  # named by the user, not by halide_ad's own sugar: hd.adjoints shows it
    return Tensor(add_func(state, ir.Func(fname, fvars, shape, body, ir.dtype_of(body), loc)).buffer)


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


def _lift_reductions(state: TraceState, body: ir.Expr, fvars, fname: str) -> ir.Expr:
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
    names = (is_user_frame(caller) and _assigned_names(caller, len(extents))) or ["r"] * len(extents)
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


# ---- reductions ---------------------------------------------------------------------------------

def reduce(op: str, x, axis=None, keepdims: bool = False):
    """On a Tensor: numpy-style reduction over `axis`. On an expression: over its rdom variables."""
    if isinstance(x, np.ndarray) and current() is not None and current().compute_vars is None:
        x = captured(x)
    if isinstance(x, Tensor):
        return _reduce_tensor(op, x, axis, keepdims)
    if isinstance(x, BoundaryView):
        return _reduce_tensor(op, x.tensor, axis, keepdims)
    if axis is not None or keepdims:
        raise TraceError(f"hd.{op}(expr) reduces over the expression's rdom variables; axis= is "
                         "for tensors", user_loc())
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


def _axes(axis, ndim: int) -> tuple[int, ...]:
    if axis is None:
        return tuple(range(ndim))
    axes = (axis,) if isinstance(axis, numbers.Integral) else tuple(axis)
    out = []
    for a in axes:
        if not -ndim <= a < ndim:
            raise ShapeError(f"axis {a} is out of range for a tensor of {ndim} dimension(s)", user_loc())
        out.append(a % ndim)
    if len(set(out)) != len(out):
        raise ShapeError(f"axis {axis} repeats an axis", user_loc())
    return tuple(sorted(out))


def _reduce_tensor(op: str, t: Tensor, axis, keepdims: bool) -> Tensor:
    axes = _axes(axis, t.ndim)
    kept = [d for d in range(t.ndim) if d not in axes]
    out_shape = tuple(1 if d in axes else t.shape[d] for d in range(t.ndim)) if keepdims else \
        tuple(t.shape[d] for d in kept)
    rv = rdom(*(t.shape[a] for a in axes)) if axes else ()
    rv = rv if isinstance(rv, tuple) else (rv,)

    def body(*idx):
        full = list(idx) if keepdims else [None] * t.ndim
        if not keepdims:
            for d, i in zip(kept, idx, strict=True):
                full[d] = i
        for a, r in zip(axes, rv, strict=True):
            full[a] = r
        value = element(t, tuple(full))
        return reduce(op, value) if axes else value

    return compute(out_shape, body, name=f"{t.name}_{op}")


# ---- elementwise sugar --------------------------------------------------------------------------

def broadcast_shape(*shapes) -> tuple[int, ...]:
    try:
        return tuple(np.broadcast_shapes(*shapes))
    except ValueError:
        raise ShapeError(f"shapes {' and '.join(map(str, shapes))} do not broadcast together "
                         "(numpy's rules: trailing dimensions must match or be 1)", user_loc()) from None


def _broadcast_element(x, idx: tuple, shape: tuple[int, ...]):
    if isinstance(x, BoundaryView):
        x = x.tensor
    if not isinstance(x, Tensor):
        return x
    offset = len(shape) - x.ndim
    return element(x, tuple(0 if n == 1 else idx[offset + d] for d, n in enumerate(x.shape)))


def map_elementwise(scalar_fn, args: tuple, name: str) -> Tensor | Expr:
    """`scalar_fn` applied elementwise over the broadcast of the tensors among `args`. A numpy
    array among them is a captured input (halide_ad/capture.py). With element expressions among
    them, 0-d tensors are single elements (`hd.maximum(t[0], x[r])` in an update's value) and the
    result is an expression."""
    args = tuple(captured(a) if isinstance(a, np.ndarray) else a for a in args)
    if any(isinstance(a, Expr) for a in args) and all(a.ndim == 0 for a in args if isinstance(a, Tensor)):
        return scalar_fn(*(element(a, ()) if isinstance(a, Tensor) else a for a in args))
    shape = broadcast_shape(*(a.shape for a in args if is_tensorlike(a)))
    return compute(shape, lambda *idx: scalar_fn(*(_broadcast_element(a, idx, shape) for a in args)),
                   name=name)


def tensor_binary(op: ir.Op, a, b) -> Tensor | Expr:
    if any(isinstance(x, Expr) for x in (a, b)) and all(x.ndim == 0 for x in (a, b) if isinstance(x, Tensor)):
        return map_elementwise(lambda x, y: binary(op, x, y), (a, b), op.name.lower())  # 0-d: elements
    for x in (a, b):
        if isinstance(x, Expr):
            raise TraceError(f"cannot combine a whole tensor with the element expression `{x.node}`; "
                             "index the tensor inside hd.compute", user_loc())
    return map_elementwise(lambda x, y: binary(op, x, y), (a, b), op.name.lower())


def matmul(a: Tensor, b: Tensor) -> Tensor:
    if not (isinstance(b, Tensor) and a.ndim == 2 and b.ndim == 2 and a.shape[1] == b.shape[0]):
        raise ShapeError(f"matmul needs (m, k) @ (k, n) tensors, got {a.shape} @ "
                         f"{getattr(b, 'shape', type(b).__name__)}", user_loc())
    k = rdom(a.shape[1])
    return compute((a.shape[0], b.shape[1]), lambda i, j: reduce("sum", a[i, k] * b[k, j]), name="matmul")


def reshape(t: Tensor, shape) -> Tensor:
    shape = list(shape)
    if shape.count(-1) > 1:
        raise ShapeError(f"reshape to {tuple(shape)}: at most one dimension may be -1", user_loc())
    if -1 in shape:
        rest = math.prod(n for n in shape if n != -1)
        shape[shape.index(-1)] = t.size // rest if rest and t.size % rest == 0 else -1
    shape = _check_shape(shape, "reshape's shape") if -1 not in shape else shape
    if -1 in shape or math.prod(shape) != t.size:
        raise ShapeError(f"cannot reshape {t.name} of shape {t.shape} ({t.size} elements) to "
                         f"{tuple(shape)}", user_loc())

    def body(*idx):
        flat = 0
        for i, n in zip(idx, shape, strict=True):
            flat = flat * n + i
        old = []
        for n in reversed(t.shape):
            old.append(flat % n if n > 1 else 0)
            flat = flat // n
        return t[tuple(reversed(old))]

    return compute(tuple(shape), body, name=f"{t.name}_reshape")


def transpose(t: Tensor, axes) -> Tensor:
    axes = tuple(reversed(range(t.ndim))) if axes is None else tuple(a % t.ndim for a in axes)
    if sorted(axes) != list(range(t.ndim)):
        raise ShapeError(f"transpose axes {axes} are not a permutation of {tuple(range(t.ndim))}", user_loc())

    def body(*idx):
        old = [None] * t.ndim
        for out_dim, a in enumerate(axes):
            old[a] = idx[out_dim]
        return t[tuple(old)]

    return compute(tuple(t.shape[a] for a in axes), body, name=f"{t.name}_T")


def slice_tensor(t: Tensor, index: tuple) -> Tensor:
    """numpy basic indexing with ints and slices, as a new tensor."""
    if Ellipsis in index:
        k = index.index(Ellipsis)
        index = index[:k] + (slice(None),) * (t.ndim - len(index) + 1) + index[k + 1:]
    if len(index) > t.ndim:
        raise ShapeError(f"too many indices for {t.name} of shape {t.shape}", user_loc())
    index = index + (slice(None),) * (t.ndim - len(index))
    starts, steps, out_shape, keep = [], [], [], []
    for d, (i, n) in enumerate(zip(index, t.shape, strict=True)):
        if isinstance(i, slice):
            start, _, step = i.indices(n)
            length = len(range(*i.indices(n)))
            if length == 0:
                raise ShapeError(f"the slice {i} of dimension {d} of {t.name} (size {n}) is empty", user_loc())
            starts.append(start), steps.append(step), out_shape.append(length), keep.append(True)
        elif isinstance(i, numbers.Integral):
            if not -n <= i < n:
                raise BoundsError(f"index {i} is out of range for dimension {d} of {t.name} (size {n})",
                                  user_loc())
            starts.append(int(i) % n), steps.append(0), keep.append(False)
        else:
            raise TraceError(f"cannot index tensor {t.name} with {i!r} outside hd.compute; use ints "
                             "and slices, or index elementwise inside hd.compute", user_loc())

    def body(*idx):
        it = iter(idx)
        return t[tuple(s + st * next(it) if k else s for s, st, k in zip(starts, steps, keep, strict=True))]

    return compute(tuple(out_shape), body, name=f"{t.name}_slice")
