"""A loop-nest IR: the loops a kernel runs, as frozen data between the gathers and the source text.

`runtime/lower.py` builds plain nests from Funcs, the passes under `runtime/schedule/` rewrite
them, and `runtime/emit.py` prints them as the Python that numba compiles, outlining each parallel
loop into the functions `parallel_for` runs. Values, indices and conditions are `halide_ad.ir`
expressions. A `Source` node is a printed line: what runtime/emit.py resolves each statement to
(`emit.resolve`); no builder or pass makes one.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from enum import Enum

from halide_ad.ir import INDEX_DTYPE, Const, Expr, Load, Op, Var, dtype_of
from halide_ad.ir import show as show_expr


class Kind(Enum):
    SERIAL = "serial"
    PARALLEL = "parallel"  # iterations independent: emit.py hands the body to parallel_for
    REVERSED = "reversed"  # hi - 1 down to lo
    UNROLLED = "unrolled"  # constant bounds: one copy of the body per iteration
    AT_MOST_ONCE = "at most once"  # proved to run zero times or once: `var = lo`, then a test


Bound = Expr | int


@dataclass(frozen=True, slots=True)
class Block:
    body: tuple[Stmt, ...] = ()


@dataclass(frozen=True, slots=True)
class For:
    """`for var in range(lo, hi, step)`, of `kind`. `var` is a Var, named by the emitter, or a
    str, a name generated code has already chosen."""
    var: Var | str
    lo: Bound
    hi: Bound
    kind: Kind
    body: Block
    step: int = 1


@dataclass(frozen=True, slots=True)
class Spans:
    """`body` for `var` in [0, gap[0]), then in [gap[1], extent): a dimension's points outside a
    box's extent, where each of `inside` (var, lo, hi: lo <= var <= hi, the enclosing loops' box
    ranges) holds; where one fails, for `var` in [0, extent). One loop over a tuple of the two
    spans, so that numba compiles the body once. `var` is named as a For's is."""
    var: Var | str
    gap: tuple[int, int]
    extent: int
    inside: tuple[tuple[Var | str, int, int], ...]
    body: Block


@dataclass(frozen=True, slots=True)
class Text(Expr):
    """Python text the emitter has printed already: a resolved loop's bound (`emit.resolve`).
    Only the emitter makes one, as it makes `Source` lines."""
    text: str
    dtype: str = INDEX_DTYPE


@dataclass(frozen=True, slots=True)
class IfElse(Expr):
    """`then if cond else otherwise`, printed without the parentheses of a Select's Python form:
    a loop bound that differs on an enclosing loop's first iteration (schedule/separable.py)."""
    cond: Expr
    then: Expr
    otherwise: Expr

    @property
    def dtype(self) -> str:
        return dtype_of(self.then)


@dataclass(frozen=True, slots=True)
class Local(Expr):
    """A local variable of the kernel's own (an accumulator, a lane of partial sums), which the
    pass that introduces it names: `acc`, `acc_lane3`. Generated names never clash with the
    user's: the emitter renames those."""
    name: str
    dtype: str


@dataclass(frozen=True, slots=True)
class Hoisted(Local):
    """A local holding `load`, read once at the top of an iteration (schedule/hoist.py). It
    prints as its name, but an index that reads it still reads data: the emitter checks it at
    run time as it would the load (`solver.bounds.checked_at_run_time` sees the load inside)."""
    load: Load


@dataclass(frozen=True, slots=True)
class Table(Expr):
    """A module-level constant array, `rows` (Python text of nested lists) of `dtype`, which the
    emitter defines once and names (`tab_<k>`): numba freezes globals into constants."""
    rows: str
    dtype: str


@dataclass(frozen=True, slots=True)
class Element(Expr):
    """array[index]: an element of a local array (Allocate) or a Table, indexed within its shape
    by construction (no check, no wraparound); or of a buffer at indices read from a table (a
    corner's taps, schedule/corners.py), where `buffer` says so."""
    array: str | Table
    index: tuple[Expr, ...]
    dtype: str
    buffer: bool = False  # `array` is a buffer of the kernel's (named and listed by the emitter)
    # `array` is written only where it is read (a staged plane cut to `read_box`): a select that
    # reads it keeps its branch, as for a buffer's load (`Emitter._speculable`)
    partial: bool = False


@dataclass(frozen=True, slots=True)
class Row(Expr):
    """The contiguous last-axis row of a buffer that holds `first` (a Load), at its other
    indices: `x[nonneg(i)]`, a view that a lane fold reads in place."""
    first: Load

    @property
    def dtype(self) -> str:
        return self.first.dtype


@dataclass(frozen=True, slots=True)
class Lanes(Expr):
    """A reduction's partial results, as one tuple: `acc, acc_lane1, ...`."""
    locals: tuple[Local, ...]

    @property
    def dtype(self) -> str:
        return self.locals[0].dtype


@dataclass(frozen=True, slots=True)
class Term(Expr):
    """In a Fold's `terms`, the element of its row `k` at the term's position."""
    k: int
    dtype: str


@dataclass(frozen=True, slots=True)
class Fold(Expr):
    """`lanes`, each combined (`op`: sum, prod, max or min) with its terms at lo + q,
    lo + q + LANES, ... below `hi` (runtime/lanes.py): the values of the lanes after a
    reduction's rounds. Each of `rows` is a local array (a Local naming it) or a Row. A term is
    the one row's element, or `terms`: arithmetic (+ - * / and negation, in the rows' type)
    of the rows' elements (Term k) and of expressions that do not change along the fold, which
    the fold reads once (`lanes.sums_of`). A Let assigns it to the same Lanes."""
    op: str
    rows: tuple[Expr, ...]
    lo: int
    hi: int
    lanes: Lanes
    terms: Expr | None = None

    @property
    def dtype(self) -> str:
        return self.lanes.dtype


@dataclass(frozen=True, slots=True)
class Folds(Expr):
    """Several Folds of one op over the same rows and rounds, run as one pass (`lanes.sums_of_all`:
    the rows read once a round for all of them); a Let assigns it to a LanesOf of their lanes, in
    order (`schedule.fuse_folds`)."""
    folds: tuple[Fold, ...]

    @property
    def dtype(self) -> str:
        return self.folds[0].dtype


@dataclass(frozen=True, slots=True)
class LanesOf(Expr):
    """Several reductions' lanes, as a tuple of tuples: what a Folds assigns."""
    lanes: tuple[Lanes, ...]

    @property
    def dtype(self) -> str:
        return self.lanes[0].dtype


@dataclass(frozen=True, slots=True)
class Chain(Expr):
    """args[0] op args[1] op ...: terms combined left to right, printed flat (`h1 * h2 * f32_3`,
    `k & 3`), in parentheses where `grouped` (`(h1 + h2 + h6) * f32_2`), instead of the pair of
    parentheses a Bin prints around each operation. The weighted sums of a gather loop nest
    (`weighted_sums`) are chains."""
    op: Op
    args: tuple[Expr, ...]
    grouped: bool = False

    @property
    def dtype(self) -> str:
        return dtype_of(self.args[0])


def weighted_sums(terms: list[tuple[Expr | None, float]], dtype: str) -> list[Expr]:
    """`sum(term * weight)` as one sum per weight, its terms added before the weight multiplies
    them (`(h1 + h2 + h6) * f32_2`): numba's compile time grows with every operation. A term
    None is its weight alone."""
    by_weight: dict[float, list[Expr]] = {}
    sums: list[Expr] = []
    for term, weight in terms:
        if term is not None:
            by_weight.setdefault(weight, []).append(term)
        else:
            sums.append(Const(weight, dtype))
    for weight, group in by_weight.items():
        total = group[0] if len(group) == 1 else Chain(Op.ADD, tuple(group), grouped=True)
        sums.append(total if weight == 1 else Chain(Op.MUL, (total, Const(weight, dtype))))
    return sums


@dataclass(frozen=True, slots=True)
class Combine(Expr):
    """`lhs` and `rhs` combined as Accumulate combines (`op`: sum, prod, max or min): the lanes of
    a reduction combined in a fixed tree (schedule/accumulate.py)."""
    op: str
    lhs: Expr
    rhs: Expr

    @property
    def dtype(self) -> str:
        return dtype_of(self.lhs)


@dataclass(frozen=True, slots=True)
class Improves(Expr):
    """Whether `val` takes the place of `acc` as the max or min (`op`) found so far: none yet
    (`arg` < 0), a better value, or a NaN over a number (numpy's rule; of equal values the
    first wins)."""
    op: str
    val: Expr
    acc: Expr
    arg: Expr
    dtype: str = "bool"


@dataclass(frozen=True, slots=True)
class Store:
    """buffer[index] = value"""
    buffer: str
    index: tuple[Expr, ...]
    value: Expr


# how Accumulate combines its target and a value, as Python (numpy's NaN rule for max and min)
COMBINE = {"sum": "{} + {}", "prod": "{} * {}", "max": "vmath.maximum({}, {})", "min": "vmath.minimum({}, {})"}


@dataclass(frozen=True, slots=True)
class Accumulate:
    """target = target <op> value, for op "sum", "prod", "max" or "min" (the max and min with
    numpy's NaN rule, `vmath.maximum`). `augmented`: written `target += value` (a sum into a
    buffer's element, which a scatter may also have read: numba then reads it once)."""
    target: Local | Element | Load
    value: Expr
    op: str = "sum"
    augmented: bool = False


@dataclass(frozen=True, slots=True)
class If:
    """`then` where `cond` holds, or all of a tuple of conditions."""
    cond: Expr | tuple[Expr, ...]
    then: Block
    otherwise: Block | None = None


@dataclass(frozen=True, slots=True)
class Let:
    """var = value: a Var is named by the emitter."""
    var: Var | Local | Element | Lanes
    value: Expr


@dataclass(frozen=True, slots=True)
class Fail:
    """The call fails with `message` once the kernel returns, `{value}` in it replaced by `value`
    (runtime/execute.py raises BoundsError); the kernel runs on. A write tested out of range is
    skipped with one (runtime/lower_updates.py)."""
    message: str
    value: Expr


@dataclass(frozen=True, slots=True)
class Allocate:
    """array = an uninitialized local array of `shape` and `dtype` (a row of partial sums);
    `stack`: a row of at most lanes.SCRATCH_MAX elements on the kernel's stack (`lanes.scratch`:
    no heap allocation per iteration)."""
    array: str
    shape: tuple[int, ...]
    dtype: str
    stack: bool = False


@dataclass(frozen=True, slots=True)
class Comment:
    """`# text`: what the code that follows computes, for a person reading the kernel."""
    text: str


@dataclass(frozen=True, slots=True)
class Point:
    """A gather loop nest's point whose statements are not built yet: the sum of `gathers` (the
    solver's Gathers) and of `terms` ((expression, weight) pairs of `terms_dtype`), stored at the
    enclosing loops' point. `region`: the region around the box (a Split.outside box, as pairs)
    that the point runs in, its gathers specialized to it, where its loads may be read once at the
    top of an iteration (`hoist_loads`). `at`: the point's index where a phase does not assign it
    (j = stride*q + p, schedule/strided.py), as (variable, value) pairs; `reads`: what its
    statements read instead of each expression (the locals of the loads its phases share, a
    phased row's alias), as pairs. The schedule passes that rewrite a gather loop nest move and
    rewrite Points (schedule/separable.py, corners.py, columns.py, strided.py);
    `gathers.expand_points` then builds each one's statements."""
    gathers: tuple = ()
    terms: tuple[tuple[Expr, float], ...] = ()
    terms_dtype: str | None = None
    region: tuple[tuple[Var, tuple[int, int]], ...] = ()
    at: tuple[tuple[Var, Expr], ...] = ()
    reads: tuple[tuple[Expr, Expr], ...] = ()


@dataclass(frozen=True, slots=True)
class Source:
    """A line of Python text, and the statements nested under it: a statement as runtime/emit.py
    prints it (`resolve`). Only the emitter makes them."""
    text: str
    body: Block = Block()


Stmt = Block | For | Spans | Store | Accumulate | If | Let | Fail | Allocate | Comment | Point | Source


def children(s: Stmt) -> tuple[Stmt, ...]:
    match s:
        case Block(body):
            return body
        case For(body=body) | Spans(body=body) | Source(body=body):
            return (body,)
        case If(_, then, otherwise):
            return (then,) if otherwise is None else (then, otherwise)
    return ()


def walk(s: Stmt) -> Iterator[Stmt]:
    """`s` and every statement inside it, outermost first."""
    yield s
    for c in children(s):
        yield from walk(c)


def block(*stmts: Stmt) -> Block:
    """A block of `stmts`, the statements of nested blocks spliced in."""
    out: list[Stmt] = []
    for s in stmts:
        out.extend(s.body if isinstance(s, Block) else (s,))
    return Block(tuple(out))


def nest(loops: list[tuple[Var | str, Bound, Bound, Kind]], body: Stmt) -> Stmt:
    """`body` inside the loops (first outermost)."""
    for var, lo, hi, kind in reversed(loops):
        body = For(var, lo, hi, kind, block(body))
    return body


def map_exprs(s: Stmt, fn: Callable[[Expr], Expr]) -> Stmt:
    """`s` with `fn` applied to each expression of its statements, in the order they print: a
    loop's bounds before its body, a target or index before the value."""
    match s:
        case Block(body):
            return Block(tuple(map_exprs(c, fn) for c in body))
        case For(_, lo, hi, _, body):
            lo, hi = (fn(b) if isinstance(b, Expr) else b for b in (lo, hi))
            return replace(s, lo=lo, hi=hi, body=map_exprs(body, fn))
        case Store(_, index, value):
            index = tuple(map(fn, index))
            return replace(s, index=index, value=fn(value))
        case Accumulate(target, value) | Let(target, value):
            target = fn(target)
            return replace(s, value=fn(value), **{"target" if isinstance(s, Accumulate) else "var": target})
        case If(cond, then, otherwise):
            cond = tuple(map(fn, cond)) if isinstance(cond, tuple) else fn(cond)
            then = map_exprs(then, fn)
            return replace(s, cond=cond, then=then, otherwise=otherwise and map_exprs(otherwise, fn))
        case Fail(_, value):
            return replace(s, value=fn(value))
        case Spans(body=body):
            return replace(s, body=map_exprs(body, fn))
        case Point(terms=terms):
            return replace(s, terms=tuple((fn(e), weight) for e, weight in terms))
    return s  # Allocate, Comment


def loops(s: Stmt) -> list[For]:
    """The For nodes in `s`, outermost first."""
    return [n for n in walk(s) if isinstance(n, For)]


def show(s: Stmt) -> str:
    """`s` as text for a person (HALIDE_AD_DUMP): loops with their kind, expressions as
    `ir.show` writes them."""
    return "\n".join(_show(s, 0))


def _show(s: Stmt, depth: int) -> list[str]:
    pad = "    " * depth
    match s:
        case Block(body):
            return [line for c in body for line in _show(c, depth)]
        case For(var, lo, hi, kind, body, step):
            head = f"{pad}for {_expr(var)} in [{_expr(lo)}, {_expr(hi)}){f' step {step}' if step != 1 else ''}:"
            return [head + ("" if kind is Kind.SERIAL else f"  # {kind.value}")] + _show(body, depth + 1)
        case Spans(var, (lo, hi), n, inside, body):
            where = " and ".join(f"{a} <= {_expr(v)} <= {b}" for v, a, b in inside)
            where = f" if {where}, else [0, {n})" if inside else ""
            return [f"{pad}for {_expr(var)} in [0, {lo}) and [{hi}, {n}){where}:"] + _show(body, depth + 1)
        case Store(buffer, index, value):
            return [f"{pad}{buffer}[{', '.join(map(_expr, index))}] = {_expr(value)}"]
        case Accumulate(target, value, op, augmented):
            return [f"{pad}{_expr(target)} {'+=' if augmented else f'{op}='} {_expr(value)}"]
        case Let(var, value):
            return [f"{pad}{_expr(var)} = {_expr(value)}"]
        case Allocate(array, shape, dtype, stack):
            return [f"{pad}{array} = {'scratch' if stack else 'empty'}({shape}, {dtype})"]
        case Fail(message, value):
            return [f"{pad}fail({_expr(value)}): {message}"]
        case If(cond, then, otherwise):
            conds = cond if isinstance(cond, tuple) else (cond,)
            lines = [f"{pad}if {' and '.join(map(_expr, conds))}:"] + _show(then, depth + 1)
            return lines + ([f"{pad}else:"] + _show(otherwise, depth + 1) if otherwise else [])
        case Comment(text):
            return [f"{pad}# {text}"]
        case Point(gathers, terms, _, region, at, reads):
            sums = "".join(f" + {_expr(e)} * {weight}" for e, weight in terms)
            where = "".join(f", {_expr(v)} in [{lo}, {hi}]" for v, (lo, hi) in region)
            where += "".join(f", {_expr(v)} = {_expr(e)}" for v, e in at)
            where += "".join(f", {_expr(e)} read as {_expr(local)}" for e, local in reads)
            return [f"{pad}point({len(gathers)} gather(s){sums}{where})"]
        case Source(text, body):
            return [pad + text] + _show(body, depth + 1)
    raise TypeError(f"not a statement: {s!r}")


def _expr(e) -> str:
    match e:
        case str() | int():
            return str(e)
        case Text(text):
            return text
        case IfElse(cond, then, otherwise):
            return f"{_expr(then)} if {_expr(cond)} else {_expr(otherwise)}"
        case Local(name):
            return name
        case Element(array, index, _):
            return f"{_expr(array)}[{', '.join(map(_expr, index))}]"
        case Table(rows, dtype):
            return f"table({rows}, {dtype})"
        case Chain(op, args, grouped):
            text = f" {op.value} ".join(map(_expr, args))
            return f"({text})" if grouped else text
        case Lanes(locals):
            return ", ".join(map(_expr, locals))
        case Row(first):
            return f"row({show_expr(first)})"
        case Term(k):
            return f"r{k}"
        case Fold(op, rows, lo, hi, lanes, terms):
            of = "" if terms is None else f"{_expr(terms)} of "
            return f"fold_{op}({of}{', '.join(map(_expr, rows))}, {lo}, {hi}, ({_expr(lanes)}))"
        case Folds(folds):
            return "folds(" + "; ".join(map(_expr, folds)) + ")"
        case LanesOf(lanes):
            return ", ".join(f"({_expr(ls)})" for ls in lanes)
        case Combine(op, lhs, rhs):
            return f"{op}({_expr(lhs)}, {_expr(rhs)})"
        case Improves(op, val, acc, arg):
            return f"improves_{op}({_expr(val)}, {_expr(acc)}, {_expr(arg)})"
    return show_expr(e)
