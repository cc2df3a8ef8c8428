"""Symbolic tensors: `Tensor` (a function's input or `hd.compute`'s result), boundary views,
`hd.full` and `hd.zeros`, and the numpy-style sugar on them (broadcasting arithmetic, reductions
over axes, reshape, transpose, slicing). The Funcs behind them are built in halide_ad/stages.py;
`t[index] = value` is an update definition (halide_ad/updates.py)."""
from __future__ import annotations

import dis
import math
import numbers
import sys

import numpy as np

from halide_ad import ir
from halide_ad.capture import captured_buffer
from halide_ad.errors import BoundsError, ShapeError, SourceLoc, TraceError, user_loc
from halide_ad.expr import Expr, TensorLike, array_function, array_ufunc, binary, is_tensorlike, to_node
from halide_ad.solver.bounds import interval
from halide_ad.stages import check_shape, define, element, index_nodes, rdom, reduce_rdom
from halide_ad.trace import current, require
from halide_ad.updates import set_item


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
class Tensor(TensorLike):
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
            return element(self.buffer, index)
        out = slice_tensor(self, index)
        self.last_item = (index, out.name) if out.ndim == 0 and state is not None else None
        return out

    def __setitem__(self, index, value):
        if isinstance(value, Tensor) and value.ndim == 0:  # `t[0] += 1` reads t[0] as a 0-d slice
            value = element(value.buffer, ())
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
        return array_ufunc(ufunc, method, inputs, kwargs, tensor_binary)

    def __array_function__(self, func, types, args, kwargs):
        if func in (np.shape, np.ndim, np.size) and len(args) == 1 and not kwargs:
            return getattr(self, func.__name__)  # np.shape(t), np.ndim(t), np.size(t)
        return array_function(func, args)

    def __len__(self):
        if not self.shape:
            raise TypeError("len() of a 0-d tensor")
        return self.shape[0]

    def __add__(self, o): return tensor_binary(ir.Op.ADD, self, o)
    def __radd__(self, o): return tensor_binary(ir.Op.ADD, o, self)
    def __sub__(self, o): return tensor_binary(ir.Op.SUB, self, o)
    def __rsub__(self, o): return tensor_binary(ir.Op.SUB, o, self)
    def __mul__(self, o): return tensor_binary(ir.Op.MUL, self, o)
    def __rmul__(self, o): return tensor_binary(ir.Op.MUL, o, self)
    def __truediv__(self, o): return tensor_binary(ir.Op.DIV, self, o)
    def __rtruediv__(self, o): return tensor_binary(ir.Op.DIV, o, self)
    def __floordiv__(self, o): return tensor_binary(ir.Op.FLOORDIV, self, o)
    def __rfloordiv__(self, o): return tensor_binary(ir.Op.FLOORDIV, o, self)
    def __mod__(self, o): return tensor_binary(ir.Op.MOD, self, o)
    def __rmod__(self, o): return tensor_binary(ir.Op.MOD, o, self)
    def __pow__(self, o): return tensor_binary(ir.Op.POW, self, o)
    def __rpow__(self, o): return tensor_binary(ir.Op.POW, o, self)
    def __lt__(self, o): return tensor_binary(ir.Op.LT, self, o)
    def __le__(self, o): return tensor_binary(ir.Op.LE, self, o)
    def __gt__(self, o): return tensor_binary(ir.Op.GT, self, o)
    def __ge__(self, o): return tensor_binary(ir.Op.GE, self, o)
    def __eq__(self, o): return tensor_binary(ir.Op.EQ, self, o)  # type: ignore[override]
    def __ne__(self, o): return tensor_binary(ir.Op.NE, self, o)  # type: ignore[override]
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


class BoundaryView(TensorLike):
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
        nodes = index_nodes(self.tensor.buffer, index)
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

    def _unindexed(self, other=None):
        if is_tensorlike(other):
            return NotImplemented  # a whole tensor's operator reads the view at each of its points
        raise TraceError(f"{self!r} is a boundary view, which only indexing reads: write {self!r}[i, ...] inside "
                         f"hd.compute, or use the tensor {self.tensor.name} itself in whole-array arithmetic",
                         user_loc())

    # a view with an element or a number (`c + x[i]`, `c * 2`) is a mistake for an indexed read
    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = _unindexed
    __truediv__ = __rtruediv__ = __floordiv__ = __rfloordiv__ = __mod__ = __rmod__ = _unindexed
    __pow__ = __rpow__ = __neg__ = _unindexed


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


def captured(array: np.ndarray) -> Tensor:
    """The Tensor over a numpy array that the traced function captured (halide_ad/capture.py)."""
    return Tensor(captured_buffer(array))


# ---- compute, full, zeros -----------------------------------------------------------------------

def compute(shape, fn, name: str | None = None) -> Tensor:
    """A new Tensor whose element at index vars `(i, ...)` is `fn(i, ...)`."""
    return Tensor(define(shape, fn, name, sys._getframe(1)))


def full(shape, value, dtype="float64", *, name: str = "full") -> Tensor:
    """A Tensor of `shape` holding `value` everywhere: a start for update definitions."""
    require(f"hd.{name}")
    dtype = np.dtype(dtype).name
    shape = check_shape(shape, f"hd.{name}'s shape")
    fill = ir.const(np.array(value).astype(dtype).item(), dtype)
    return compute(shape, lambda *i: Expr(fill), name=name)


def zeros(shape, dtype="float64") -> Tensor:
    """A Tensor of `shape` holding zeros: a start for update definitions (a histogram's bins)."""
    return full(shape, 0, dtype, name="zeros")


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
    return reduce_rdom(op, x)


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
        at = list(idx) if keepdims else [None] * t.ndim
        if not keepdims:
            for d, i in zip(kept, idx, strict=True):
                at[d] = i
        for a, r in zip(axes, rv, strict=True):
            at[a] = r
        value = element(t.buffer, tuple(at))
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
    return element(x.buffer, tuple(0 if n == 1 else idx[offset + d] for d, n in enumerate(x.shape)))


def map_elementwise(scalar_fn, args: tuple, name: str) -> Tensor | Expr:
    """`scalar_fn` applied elementwise over the broadcast of the tensors among `args`. A numpy
    array among them is a captured input (halide_ad/capture.py). With element expressions among
    them, 0-d tensors are single elements (`hd.maximum(t[0], x[r])` in an update's value) and the
    result is an expression."""
    args = tuple(captured(a) if isinstance(a, np.ndarray) else a for a in args)
    if any(isinstance(a, Expr) for a in args) and all(a.ndim == 0 for a in args if isinstance(a, Tensor)):
        return scalar_fn(*(element(a.buffer, ()) if isinstance(a, Tensor) else a for a in args))
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
    shape = check_shape(shape, "reshape's shape") if -1 not in shape else shape
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
