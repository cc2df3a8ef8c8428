"""The front-end `Expr`: a thin wrapper over an IR node that overloads Python's operators.

Users write `c[y, x - 1] + 1.5` and `i == j` inside `hd.compute`; these build IR, so the IR's own
structural equality stays intact. Python numbers are weakly typed: `x * 0.5` keeps float32 float32.
"""
from __future__ import annotations

import numbers

import numpy as np

import halide_ad
from halide_ad import ir
from halide_ad.capture import captured_buffer
from halide_ad.errors import TraceError, user_loc
from halide_ad.traverse import PY_OPS, rewrite, simplify_rule

_CONTROL_FLOW_HINT = (
    "cannot use the symbolic value `{e}` as a Python bool. Python control flow (`if`, `while`, "
    "`and`/`or`) and the builtins max/min/sorted cannot branch on symbolic values: use "
    "hd.where(cond, a, b), hd.maximum(a, b), hd.minimum(a, b), or & and | for conditions.")


class Expr:
    """A symbolic scalar inside `hd.compute`: an index variable, a tensor element, or math on them."""

    __slots__ = ("node", "weak")

    def __init__(self, node: ir.Expr, weak: bool = False):
        self.node = node
        self.weak = weak  # built from Python floats only: adopts the float type it meets

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(ir.dtype_of(self.node))

    def __repr__(self) -> str:
        return f"hd.Expr({self.node})"

    def __add__(self, o): return _operator(ir.Op.ADD, self, o)
    def __radd__(self, o): return _operator(ir.Op.ADD, o, self)
    def __sub__(self, o): return _operator(ir.Op.SUB, self, o)
    def __rsub__(self, o): return _operator(ir.Op.SUB, o, self)
    def __mul__(self, o): return _operator(ir.Op.MUL, self, o)
    def __rmul__(self, o): return _operator(ir.Op.MUL, o, self)
    def __truediv__(self, o): return _operator(ir.Op.DIV, self, o)
    def __rtruediv__(self, o): return _operator(ir.Op.DIV, o, self)
    def __floordiv__(self, o): return _operator(ir.Op.FLOORDIV, self, o)
    def __rfloordiv__(self, o): return _operator(ir.Op.FLOORDIV, o, self)
    def __mod__(self, o): return _operator(ir.Op.MOD, self, o)
    def __rmod__(self, o): return _operator(ir.Op.MOD, o, self)
    def __pow__(self, o): return _operator(ir.Op.POW, self, o)
    def __rpow__(self, o): return _operator(ir.Op.POW, o, self)
    def __eq__(self, o): return _operator(ir.Op.EQ, self, o)  # type: ignore[override]
    def __ne__(self, o): return _operator(ir.Op.NE, self, o)  # type: ignore[override]
    def __lt__(self, o): return _operator(ir.Op.LT, self, o)
    def __le__(self, o): return _operator(ir.Op.LE, self, o)
    def __gt__(self, o): return _operator(ir.Op.GT, self, o)
    def __ge__(self, o): return _operator(ir.Op.GE, self, o)
    def __and__(self, o): return logical(ir.Op.AND, self, o)
    def __rand__(self, o): return logical(ir.Op.AND, o, self)
    def __or__(self, o): return logical(ir.Op.OR, self, o)
    def __ror__(self, o): return logical(ir.Op.OR, o, self)
    def __neg__(self): return call("neg", self)
    def __pos__(self): return self
    def __invert__(self): return call("not", self)

    def __hash__(self):
        raise TraceError(f"the symbolic value `{self.node}` cannot be a dict key or a set member "
                         "while tracing; choose between values with hd.where", user_loc())

    def __bool__(self):
        raise TraceError(_CONTROL_FLOW_HINT.format(e=self.node), user_loc())

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        if any(isinstance(x, TensorLike) for x in inputs):
            return NotImplemented  # numpy then asks the Tensor, which broadcasts
        return array_ufunc(ufunc, method, inputs, kwargs, binary)

    def __array_function__(self, func, types, args, kwargs):
        return array_function(func, args)

    def __abs__(self):
        raise TraceError(f"Python's abs() on the symbolic value `{self.node}`: use hd.abs(x)", user_loc())

    def __round__(self, ndigits=None):
        raise TraceError(f"Python's round() on the symbolic value `{self.node}`: use hd.round(x)",
                         user_loc())

    def _not_a_number(self, *args):
        raise TraceError(f"`{self.node}` is symbolic and has no Python value while tracing, so Python's "
                         "math module, int(), float() and list indexing cannot use it: use halide_ad's "
                         "math (hd.sin, hd.exp, ...), index tensors, and hd.cast(x, dtype) to change "
                         "its type. A numpy array read from a closure or a global cannot be indexed with "
                         "it either: read it through a boundary view, hd.repeat_edge(a)[i, j]", user_loc())

    __int__ = __float__ = __index__ = __complex__ = __iter__ = __array__ = _not_a_number


class TensorLike:
    """Base of the whole symbolic arrays, `Tensor` and `BoundaryView` (halide_ad/tensor.py). They
    are built on element expressions, so this module knows them only by this base: an Expr's
    operator meeting one returns NotImplemented, and Python hands the operation to the Tensor's
    reflected operator, which broadcasts."""

    __slots__ = ()


def is_tensorlike(x) -> bool:
    return isinstance(x, TensorLike)


def _operator(op: ir.Op, a, b):
    """An Expr's arithmetic or comparison operator."""
    return NotImplemented if is_tensorlike(a) or is_tensorlike(b) else binary(op, a, b)


Scalar = Expr | int | float | bool


def is_symbolic(x) -> bool:
    return isinstance(x, Expr)


def to_node(x, like: str | None = None) -> ir.Expr:
    """An IR node for `x`; a Python number takes its dtype from `like` (weak typing)."""
    if isinstance(x, Expr):
        return x.node
    if isinstance(x, (bool, np.bool_)):
        return ir.const(bool(x), "bool")
    if isinstance(x, np.generic):
        return ir.const(x.item(), x.dtype.name)
    if isinstance(x, numbers.Integral):
        dtype = like if like is not None and like != "bool" else ir.INDEX_DTYPE
        return ir.const(int(x), dtype)
    if isinstance(x, numbers.Real):
        dtype = like if like in ir.FLOAT_DTYPES else "float64"
        return ir.const(float(x), dtype)
    if is_tensorlike(x):
        raise TraceError(f"a whole tensor ({x}) was used where one element is expected; index it, "
                         "e.g. t[i, j], inside hd.compute", user_loc())
    if isinstance(x, np.ndarray) and x.ndim == 0:  # a captured 0-d array (halide_ad/capture.py)
        buf = captured_buffer(x)
        return ir.Load(buf.name, (), buf.dtype, user_loc())
    raise TraceError(f"cannot use {type(x).__name__} {x!r} in a halide_ad expression", user_loc())


def _fold(node: ir.Expr, weak: bool = False) -> Expr:
    folded = simplify_rule(node) if all(isinstance(c, ir.Const) for c in _args(node)) else None
    return Expr(folded if folded is not None else node, weak)


def _weak_operands(*xs) -> list:
    """Weakly typed float expressions among `xs` retyped to the float type of the others,
    as Python floats are: `hd.where(c, 0.25, 0.75) * x` keeps a float32 x float32."""
    strong = [ir.dtype_of(x.node) for x in xs if isinstance(x, Expr) and not x.weak]
    target = next((d for d in strong if ir.is_float(d)), None)
    if target is None:
        return list(xs)
    retype = lambda n: ir.const(n.value, target) if isinstance(n, ir.Const) and n.dtype == "float64" else None  # noqa: E731
    return [Expr(rewrite(x.node, retype)) if isinstance(x, Expr) and x.weak else x for x in xs]


def _is_weak(*xs) -> bool:
    """True when every operand is a Python number or a weak expression."""
    return all(x.weak if isinstance(x, Expr) else isinstance(x, numbers.Real) for x in xs)


def _args(node: ir.Expr):
    if isinstance(node, ir.Bin):
        return (node.lhs, node.rhs)
    if isinstance(node, ir.Call):
        return node.args
    return (node,)


def _like(*xs) -> str | None:
    """The dtype that Python numbers among `xs` adopt: that of the first symbolic one."""
    return next((ir.dtype_of(x.node) for x in xs if isinstance(x, Expr)), None)


# numpy's operator ufuncs, so that `np.float32(2) * e` builds the same expression as `2 * e`
_UFUNC_OPS = {np.add: ir.Op.ADD, np.subtract: ir.Op.SUB, np.multiply: ir.Op.MUL, np.true_divide: ir.Op.DIV,
              np.floor_divide: ir.Op.FLOORDIV, np.remainder: ir.Op.MOD, np.power: ir.Op.POW,
              np.less: ir.Op.LT, np.less_equal: ir.Op.LE, np.greater: ir.Op.GT,
              np.greater_equal: ir.Op.GE, np.equal: ir.Op.EQ, np.not_equal: ir.Op.NE}
# numpy spellings of halide_ad functions, for the error message
_HD_NAMES = {"absolute": "abs", "fabs": "abs", "rint": "round", "arctan2": "atan2", "fmax": "maximum",
             "fmin": "minimum", "clip": "clamp", "amax": "max", "amin": "min", "around": "round"}


def _symbolic_operand(values):
    return next((v for v in values if isinstance(v, Expr) or is_tensorlike(v)), None)


def _use_instead(name: str) -> str:
    hd_name = _HD_NAMES.get(name, name)
    if hd_name in getattr(halide_ad, "__all__", ()):
        return f"use hd.{hd_name}, which works inside hd.compute and on hd.Tensors"
    return "halide_ad has no such function: build it from hd's math (hd.exp, hd.where, hd.sum, ...)"


def array_ufunc(ufunc, method: str, inputs: tuple, kwargs: dict, combine):
    """numpy ufuncs on symbolic values: the operators build IR (`combine(op, a, b)`: `binary` on
    elements, `tensor_binary` on tensors); anything else is a TraceError."""
    if method == "__call__" and not kwargs and ufunc in _UFUNC_OPS and len(inputs) == 2:
        return combine(_UFUNC_OPS[ufunc], *inputs)
    if method == "__call__" and not kwargs and ufunc in (np.negative, np.positive) and len(inputs) == 1:
        return -inputs[0] if ufunc is np.negative else inputs[0]
    x = _symbolic_operand(inputs)
    shown = getattr(x, "node", x)
    raise TraceError(f"numpy's np.{ufunc.__name__}{'' if method == '__call__' else '.' + method} cannot "
                     f"compute on the symbolic value `{shown}` while tracing: {_use_instead(ufunc.__name__)}",
                     user_loc())


def array_function(func, args: tuple):
    """numpy functions (np.sum, np.where, np.concatenate, ...) on symbolic values: a TraceError."""
    x = _symbolic_operand([a for arg in args for a in (arg if isinstance(arg, (list, tuple)) else (arg,))])
    shown = getattr(x, "node", x)
    raise TraceError(f"numpy's np.{func.__name__} cannot run on the symbolic value `{shown}` while "
                     f"tracing: {_use_instead(func.__name__)}", user_loc())


def binary(op: ir.Op, a, b):
    """`a op b` on elements (Exprs and Python numbers)."""
    if not (is_symbolic(a) or is_symbolic(b)):
        return _python_binary(op, a, b)
    weak = _is_weak(a, b)
    a, b = _weak_operands(a, b)
    like = _like(a, b)
    la, lb = to_node(a, like), to_node(b, like)
    if op is ir.Op.POW and isinstance(lb, ir.Const) and ir.is_float(ir.dtype_of(la)):
        lb = ir.const(lb.value, ir.dtype_of(la))  # x ** 2 keeps x's float type
    if op in (ir.Op.FLOORDIV, ir.Op.MOD) and isinstance(lb, ir.Const) and lb.value == 0:
        raise TraceError(f"division by zero in `{la} {op.value} 0`", user_loc())
    if (op is ir.Op.POW and isinstance(lb, ir.Const) and lb.value < 0
            and not ir.is_float(ir.dtype_of(la)) and not ir.is_float(lb.dtype)):
        raise TraceError(f"`{la} ** {lb.value}`: integers to negative integer powers are not allowed "
                         "(as in numpy); cast first, e.g. hd.cast(x, 'float64') ** -1", user_loc())
    return _fold(ir.Bin(op, la, lb), weak and op not in ir.COMPARISONS)


def logical(op: ir.Op, a, b):
    la, lb = to_node(a), to_node(b)
    for side in (la, lb):
        if ir.dtype_of(side) != "bool":
            raise TraceError(f"`{op.value}` combines conditions, but `{side}` is "
                             f"{ir.dtype_of(side)}; compare it first, e.g. (x > 0)", user_loc())
    return _fold(ir.Bin(op, la, lb))


def _python_binary(op: ir.Op, a, b):
    if op is ir.Op.DIV:
        return a / b
    if op is ir.Op.POW:
        return a ** b
    return PY_OPS[op](a, b)


def call(fn: str, *args) -> Expr:
    weak = _is_weak(*args)
    args = _weak_operands(*args)
    like = _like(*args)
    nodes = tuple(to_node(a, like) for a in args)
    return _fold(ir.Call(fn, nodes), weak and fn != "not")


def select(cond, a, b) -> Expr:
    c = to_node(cond)
    if ir.dtype_of(c) != "bool":
        raise TraceError(f"hd.where needs a condition, but `{c}` is {ir.dtype_of(c)}; "
                         "compare it first, e.g. hd.where(x > 0, x, 0)", user_loc())
    weak = _is_weak(a, b)
    a, b = _weak_operands(a, b)
    like = _like(a, b)
    ta, tb = to_node(a, like), to_node(b, like)
    dtype = ir.promote(ir.dtype_of(ta), ir.dtype_of(tb))
    return _fold(ir.Select(c, ir.cast(dtype, ta), ir.cast(dtype, tb)), weak and ir.is_float(dtype))
