"""The IR: small frozen dataclasses with structural equality.

Expressions (`Expr`) are values at one point of a domain; `Func` defines a whole buffer as an
expression over its pure variables; `Program` is a traced function: inputs, funcs in topological
order, outputs. Shapes are concrete ints: a program is traced once per signature of shapes.

The IR has no operator sugar (users' `==` builds expressions, so the front end wraps these nodes);
build nodes with the helpers at the bottom, which fold constants and resolve dtypes.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from enum import Enum

import numpy as np

from halide_ad.errors import SourceLoc


class Op(Enum):
    ADD = "+"
    SUB = "-"
    MUL = "*"
    DIV = "/"
    FLOORDIV = "//"
    MOD = "%"
    POW = "**"
    MIN = "min"
    MAX = "max"
    EQ = "=="
    NE = "!="
    LT = "<"
    LE = "<="
    GT = ">"
    GE = ">="
    AND = "&"
    OR = "|"


COMPARISONS = {Op.EQ, Op.NE, Op.LT, Op.LE, Op.GT, Op.GE}
LOGICAL = {Op.AND, Op.OR}

FLOAT_DTYPES = ("float32", "float64")
INDEX_DTYPE = "int64"


class Expr:
    """Base of expression nodes. `str(e)` prints the expression as a person would write it."""

    __slots__ = ()

    def __str__(self) -> str:
        return show(self)


@dataclass(frozen=True, slots=True)
class Const(Expr):
    value: int | float | bool
    dtype: str


@dataclass(frozen=True, slots=True)
class Var(Expr):
    """An integer loop variable: a pure variable of a Func or a reduction variable."""
    name: str


@dataclass(frozen=True, slots=True)
class Bin(Expr):
    op: Op
    lhs: Expr
    rhs: Expr


@dataclass(frozen=True, slots=True)
class Call(Expr):
    """A pure math function of its arguments, by name: `neg`, `not`, `exp`, `abs`, `atan2`, ..."""
    fn: str
    args: tuple[Expr, ...]


# `Call(RUN_TIME_CHECKED, (index,))` is `index`, marking an index whose bounds no proof settled (a z3
# timeout): the kernels check it when they run, as they check data-dependent indices.
RUN_TIME_CHECKED = "checked"


@dataclass(frozen=True, slots=True)
class Select(Expr):
    cond: Expr
    true: Expr
    false: Expr


@dataclass(frozen=True, slots=True)
class Cast(Expr):
    dtype: str
    value: Expr


@dataclass(frozen=True, slots=True)
class Load(Expr):
    buffer: str
    index: tuple[Expr, ...]
    dtype: str
    loc: SourceLoc | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True, slots=True)
class Range:
    """`lo <= var < hi`. Bounds are ints in Funcs; the solver's loops may have Expr bounds."""
    var: Var
    lo: int | Expr
    hi: int | Expr

    @property
    def extent(self) -> int:
        return self.hi - self.lo


REDUCE_OPS = ("sum", "prod", "max", "min", "argmax", "argmin")


@dataclass(frozen=True, slots=True)
class Reduce(Expr):
    """`op` over the reduction domain `rvars` (first outermost), restricted by `where`.

    argmax/argmin give the position in reduction order (row-major over `rvars`), -1 if empty.
    """
    op: str
    body: Expr
    rvars: tuple[Range, ...]
    where: Expr | None = None
    loc: SourceLoc | None = field(default=None, compare=False, repr=False)


# ---- printing: `show(e)` writes an expression as a person would, e.g. `2 * (j - 1) + 1` ----

_PRECEDENCE = {Op.OR: 1, Op.AND: 2, Op.EQ: 3, Op.NE: 3, Op.LT: 3, Op.LE: 3, Op.GT: 3, Op.GE: 3,
               Op.ADD: 4, Op.SUB: 4, Op.MUL: 5, Op.DIV: 5, Op.FLOORDIV: 5, Op.MOD: 5, Op.POW: 7}
_ATOM = 9


def show(e: Expr) -> str:
    return _show(e)[0]


def _show(e: Expr) -> tuple[str, int]:
    match e:
        case Const(v, dtype):
            text = repr(v) if dtype != "float32" else repr(float(v))
            return text, (_ATOM if not (isinstance(v, (int, float)) and v < 0) else 6)
        case Var(name):
            return name, _ATOM
        case Load(buffer, index, _):
            return f"{buffer}[{', '.join(show(i) for i in index)}]", _ATOM
        case Bin(Op.MIN | Op.MAX as op, a, b):
            return f"{op.value}({show(a)}, {show(b)})", _ATOM
        case Bin(op, a, b):
            p = _PRECEDENCE[op]
            right_assoc = op is Op.POW
            left = _paren(a, p + (1 if right_assoc else 0))
            right = _paren(b, p + (0 if right_assoc else 1))
            return f"{left} {op.value} {right}", p
        case Call("neg", (a,)):
            return f"-{_paren(a, 6)}", 6
        case Call("not", (a,)):
            return f"~{_paren(a, 6)}", 6
        case Call(fn, args):
            return f"{fn}({', '.join(show(a) for a in args)})", _ATOM
        case Select(c, t, f):
            return f"select({show(c)}, {show(t)}, {show(f)})", _ATOM
        case Cast(dtype, v):
            return f"{dtype}({show(v)})", _ATOM
        case Reduce(op, body, rvars, where):
            doms = ", ".join(f"{r.var.name} in [{r.lo}, {r.hi})" for r in rvars)
            cond = f" if {show(where)}" if where is not None else ""
            return f"{op}({show(body)} for {doms}{cond})", _ATOM
    return repr(e), _ATOM


def _paren(e: Expr, min_precedence: int) -> str:
    text, p = _show(e)
    return f"({text})" if p < min_precedence else text


@dataclass(frozen=True, slots=True)
class Buffer:
    name: str
    shape: tuple[int, ...]
    dtype: str


@dataclass(frozen=True, slots=True)
class Func:
    """`name[vars] = body` for every point of `shape`. A Reduce appears only as the whole body."""
    name: str
    vars: tuple[Var, ...]
    shape: tuple[int, ...]
    body: Expr
    dtype: str
    loc: SourceLoc | None = field(default=None, compare=False, repr=False)
    argindex: bool = True  # False: no gradient can reach this Func (`ad.without_unused_argindex`)

    @property
    def buffer(self) -> Buffer:
        return Buffer(self.name, self.shape, self.dtype)

    @property
    def domain(self) -> tuple[Range, ...]:
        return tuple(Range(v, 0, n) for v, n in zip(self.vars, self.shape, strict=True))

    @property
    def keeps_argindex(self) -> bool:
        """max/min reductions store where the extremum was, for their gradient."""
        return self.argindex and isinstance(self.body, Reduce) and self.body.op in ("max", "min")


    @property
    def argindex_dtype(self) -> str:
        """The narrowest integer dtype holding every window position (and -1): less memory traffic
        for the forward pass that stores it and the gradient that reads it."""
        positions = math.prod(r.hi - r.lo for r in self.body.rvars)
        return next(t for t in ("int8", "int16", "int32", "int64") if positions <= np.iinfo(t).max)


UPDATE_CALL = "update"  # `Update.body`'s pseudo-call: what it reads, for passes that only walk loads


@dataclass(frozen=True, slots=True)
class Update:
    """An update definition: buffer `name` is the previous stage `prev`, then

        name[index] = value        at every point of `pure` (independent) x `rdom` where `where` holds,

    the rdom's points in lexicographic order as if serially. Loads of `name` in index, value and
    where read the buffer as updated so far (a scan reads its own earlier writes); `prev` is read
    only as the starting contents. `t[i] += v` arrives as `value = t[i] + v`. Each pure variable
    stands bare in `index` (at `pure_dims`), and reads of `name` use it at the same position, so
    pure points never touch each other's elements (Halide's rule).
    """
    name: str
    prev: str
    shape: tuple[int, ...]
    dtype: str
    pure: tuple[Range, ...]
    pure_dims: tuple[int, ...]
    rdom: tuple[Range, ...]
    index: tuple[Expr, ...]
    value: Expr
    where: Expr | None = None
    loc: SourceLoc | None = field(default=None, compare=False, repr=False)
    # z3 proved (solver/updates.py, at trace time) that distinct rdom points write distinct elements
    # and read none that another point writes: the rdom may run in any order
    independent: bool = False
    # z3 proved (at trace time) that its writes are one-to-one and that each read of the tensor,
    # other than of the element being written, sees its final value: its adjoint is the update
    # run backwards (`ReverseScan`)
    reversible: bool = False
    # neither: the forward records each point's overwritten value (`tape_name`), and the adjoint
    # rolls the tensor back point by point (a Horner loop, an in-place max over colliding writes)
    taped: bool = False

    argindex = False
    keeps_argindex = False

    @property
    def buffer(self) -> Buffer:
        return Buffer(self.name, self.shape, self.dtype)

    @property
    def body(self) -> Expr:
        """Not evaluable: every expression the update reads, for passes that walk a stage's loads
        (liveness, reachability). Passes that compute treat Updates on their own."""
        parts = (Load(self.prev, (), self.dtype), *self.index, self.value) + (
            (self.where,) if self.where is not None else ())
        return Call(UPDATE_CALL, parts)


def tape_name(update_name: str) -> str:
    """The forward's record of what a taped update overwrote, per point of its domain."""
    return f"{update_name}_tape"


def argindex_name(func_name: str) -> str:
    return f"arg_{func_name}"


def adjoint_name(buffer_name: str) -> str:
    return f"adj_{buffer_name}"


@dataclass(frozen=True, slots=True)
class Program:
    name: str
    inputs: tuple[Buffer, ...]
    funcs: tuple[Func | Update, ...]  # stages in order; Updates only from update definitions
    outputs: tuple[str, ...]
    overrides: tuple[Override, ...] = ()  # custom rules, for reverse mode

    def buffer(self, name: str) -> Buffer:
        for b in self.inputs:
            if b.name == name:
                return b
        return self.func(name).buffer

    def func(self, name: str) -> Func | Update:
        for f in self.funcs:
            if f.name == name:
                return f
        raise KeyError(name)


# ---- dtypes -------------------------------------------------------------------------------------

def dtype_of(e: Expr) -> str:
    match e:
        case Const(_, dtype) | Cast(dtype, _) | Load(_, _, dtype):
            return dtype
        case Var():
            return INDEX_DTYPE
        case Bin(op, lhs, rhs):
            return bin_dtype(op, dtype_of(lhs), dtype_of(rhs))
        case Call(fn, args):
            return call_dtype(fn, [dtype_of(a) for a in args])
        case Select(_, t, f):
            return promote(dtype_of(t), dtype_of(f))
        case Reduce(op, body, _, _):
            return INDEX_DTYPE if op in ("argmax", "argmin") else reduce_dtype(op, dtype_of(body))
    if isinstance(getattr(e, "dtype", None), str):  # a node of the loop-nest IR's own (runtime/loops.py)
        return e.dtype
    raise TypeError(f"not an expression: {e!r}")


@functools.cache  # numpy's dtype names are slow, and the compiler asks for the same pairs all the time
def promote(a: str, b: str) -> str:
    return np.result_type(np.dtype(a), np.dtype(b)).name


def is_float(dtype: str) -> bool:
    return dtype in FLOAT_DTYPES


def bin_dtype(op: Op, a: str, b: str) -> str:
    if op in COMPARISONS:
        return "bool"
    if op in LOGICAL:
        return promote(a, b)
    if a == "bool" and b == "bool" and op not in (Op.MIN, Op.MAX):
        a = b = INDEX_DTYPE
    t = promote(a, b)
    if op is Op.DIV and not is_float(t):
        return "float64"
    return t


FLOAT_FUNCS = {"exp", "log", "log1p", "sqrt", "rsqrt", "sin", "cos", "tan", "tanh", "sigmoid", "erf",
               "floor", "ceil", "round", "atan2"}


def call_dtype(fn: str, arg_dtypes: list[str]) -> str:
    if fn == "not":
        return "bool"
    t = arg_dtypes[0] if len(arg_dtypes) == 1 else promote(*arg_dtypes)
    if fn in FLOAT_FUNCS and not is_float(t):
        return "float64"
    return t


def reduce_dtype(op: str, body: str) -> str:
    if op in ("sum", "prod") and body == "bool":
        return INDEX_DTYPE
    return body


# ---- constructors that fold constants -----------------------------------------------------------

def const(value, dtype: str | None = None) -> Const:
    if dtype is None:
        dtype = "bool" if isinstance(value, (bool, np.bool_)) else (
            INDEX_DTYPE if isinstance(value, (int, np.integer)) else "float64")
    py = {"b": bool, "i": int, "u": int, "f": float}[np.dtype(dtype).kind]
    return Const(py(value), dtype)


def cast(dtype: str, e: Expr) -> Expr:
    if dtype_of(e) == dtype:
        return e
    if isinstance(e, Const):
        return const(np.array(e.value).astype(dtype).item(), dtype)
    return Cast(dtype, e)


def is_const(e: Expr, value=None) -> bool:
    return isinstance(e, Const) and (value is None or e.value == value)


@dataclass(frozen=True, slots=True)
class Scatter:
    """For every point of `domain` where `where` holds: adj_<buffer>[index] += value.

    Reverse mode produces these; the solver turns each into a gather when it can.
    """
    buffer: str
    index: tuple[Expr, ...]
    value: Expr
    domain: tuple[Range, ...]
    where: Expr | None = None
    loc: SourceLoc | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class ReverseScan:
    """A scan's adjoint: its update run backwards (halide_ad/update_ad.py). adj_<prev> starts as
    adj_<update>; then at each point of the update's domain, in reverse order, where the update's
    predicate holds: g = adj_<prev>[index] is kept in adj_<writes>[point], adj_<prev>[index] = 0,
    and each term adds `adj_<prev>[term.index] += term.value` (terms read g from adj_<writes>).

    A taped update first rolls its element back, adj_<state>[index] = tape[point], in a copy of the
    final tensor (adj_<state>, which the terms read as the tensor); the derivative's contributions
    to other tensors, which read that state too, are kept per point in `stored` (adj_<name>[point]
    = value) for the scatters that read them."""
    update: Update
    writes: str  # adj_<writes>[pure..., rdom - lo...]: the adjoint of each point's written value
    terms: tuple[Scatter, ...]
    state: str | None = None  # taped: the working copy of the tensor
    stored: tuple[tuple[str, Expr], ...] = ()

    @property
    def writes_shape(self) -> tuple[int, ...]:
        return tuple(r.hi - r.lo for r in self.update.pure + self.update.rdom)

    def exprs(self) -> list[Expr]:
        """Everything the backward kernel evaluates."""
        u = self.update
        return [*u.index, *([u.where] if u.where is not None else []),
                *(e for t in self.terms for e in (t.value, *t.index, *([t.where] if t.where is not None else []))),
                *(value for _, value in self.stored)]


@dataclass(frozen=True)
class Adjoint:
    """adj_<buffer> = (cotangent if seeded) + the sum of `scatters`; or, with `scan`, computed by
    running that scan backwards (it fills adj_<scan.update.prev> too)."""
    buffer: str
    shape: tuple[int, ...]
    dtype: str
    seeded: bool
    scatters: tuple[Scatter, ...]
    scan: ReverseScan | None = None


@dataclass(frozen=True, slots=True)
class Override:
    """A custom rule's reverse mode (halide_ad/custom.py): reverse mode gives the Funcs of `region`
    no contributions of their own; their inputs' adjoints are `scatters`, which read the adjoints
    of `outputs` (the region's Funcs that the rest of the program reads)."""
    what: str  # the function, as errors name it
    region: tuple[str, ...]
    outputs: tuple[str, ...]
    scatters: tuple[Scatter, ...]
