"""Loop nests (runtime/loops.py) -> the Python source that numba compiles.

`function` prints a kernel's nest as one module: each parallel For becomes a numba function of its
loop index, `entry_b<k>(j, ...)`, and one that runs the iterations [start, stop),
`entry_p<k>(start, stop, ...)`, which the entry hands to `parallel_for` (runtime/parallel.py); the
statements between parallel loops become serial numba functions `entry_s<k>(...)`; serial loops
that enclose a parallel one (of extent 1: the parallel dimension is the first longer one) stay in
the entry, as Python. With the loop inside the body's own function, LLVM made the bilinear
gradient ~20% slower, hence the two functions per parallel loop.

Expressions, names and buffers print through the `Emitter` (`em`), which owns the kernel's
namespace: its `name` and `buffer` give every variable and buffer a name that no name of the
generated code's own takes (a parameter called `status` or `np` works).
"""
from __future__ import annotations

import ast
import math
import re
from dataclasses import dataclass, field

from halide_ad.ir import (RUN_TIME_CHECKED, Bin, Call, Cast, Const, Expr, Load, Op, Reduce, Select, Var, dtype_of,
                          is_float)
from halide_ad.runtime import lower, schedule
from halide_ad.runtime.schedule.accumulate import split_accumulators
from halide_ad.ir import show
from halide_ad.solver.bounds import checked_at_run_time, is_data_dependent
from halide_ad.traverse import children as expr_children, walk as walk_expr
from halide_ad.runtime.lanes import FOLD
from halide_ad.runtime.loops import (COMBINE, Accumulate, Allocate, Block, Bound, Chain, Combine, Comment, Element, Fail,
                                     Fold, Folds, For, Hoisted, If, IfElse, Improves, Kind, Lanes, LanesOf, Let, Local, Row,
                                     Source, Spans, Stmt, Store, Table, Term, Text, block, walk)

_NAME = re.compile(r"\b[A-Za-z_]\w*\b")  # identifiers in a helper's body: which parameters it needs


def _tuple(items) -> str:
    items = list(items)
    return f"({items[0]},)" if len(items) == 1 else f"({', '.join(items)})"


def function(em, entry: str, body: Block) -> str:
    """The module text for `entry(<the buffers it uses>, status)` running `body`."""
    pieces = _cut(body.body, em)  # (prints every expression first: that names the buffers used)
    names = [*map(em.buffer, em.used), "status"]
    helpers: list[str] = []

    def params(lines: list[str], outer: list[str]) -> list[str]:
        used = set(_NAME.findall("\n".join(lines)))
        return [v for v in outer if v in used] + [n for n in names if n in used]

    def helper(kind: str, args: list[str], lines: list[str]) -> str:
        name = f"{entry}_{kind}{len(helpers)}"
        lines = _bind_indices(args, lines)
        helpers.append(f"@kernel\ndef {name}({', '.join(args)}):\n" + "".join(f"    {line}\n" for line in lines) + "\n\n")
        return name

    def level(pieces: list, indent: int, outer: list[str]) -> list[str]:
        pad, out, serial = "    " * indent, [], []

        def flush() -> None:
            if any(line.strip() and not line.strip().startswith("#") for line in serial):
                args = params(serial, outer)
                out.append(pad + f"{helper('s', args, serial)}({', '.join(args)})")
            else:
                out.extend(pad + line if line else line for line in serial)
            serial.clear()

        for piece in pieces:
            if isinstance(piece, list):
                serial += piece
                continue
            flush()
            if isinstance(piece, _Parallel):
                args = params(piece.lines, outer)
                iteration = helper("b", [piece.var, *args], piece.lines)
                call = f"{iteration}({', '.join([piece.var, *args])})"
                name = helper("p", ["start", "stop", *args], [f"for {piece.var} in range(start, stop):", f"    {call}"])
                out.append(pad + f"parallel_for({name}, {piece.bounds}{''.join(', ' + a for a in args)}, "
                                 f"iteration={iteration})")
            else:
                out.append(pad + piece.header)
                out += level(piece.pieces, indent + 1, outer + [piece.var])
        flush()
        return out

    entry_lines = level(pieces, 1, []) + ["    return None"]
    code = "".join(helpers) + f"def {entry}({', '.join(names)}):\n" + "\n".join(entry_lines) + "\n"
    return _number_literals(em.literals, code)


_NONNEG = re.compile(r"\bnonneg\(([A-Za-z_]\w*)\)")


def _bind_indices(args: list[str], lines: list[str]) -> list[str]:
    """`lines`, a function's body, with `nonneg(v)` of a variable v read from `v_nn`, set to
    nonneg(v) right after each assignment of v: each `nonneg(...)` call is typed and lowered
    on its own, and a 4-d index inside loops repeats those of the outer loops (the max-pool
    gradient of tests/ops/test_pool.py called it 450 times). The same value in a local, so the
    same machine code. A variable assigned otherwise than by `v = ...` or `for v in ...` (a
    tuple, `+=`) keeps its calls."""
    names = set(_NONNEG.findall("\n".join(lines)))
    if not names:
        return lines
    tree = ast.parse("def _():\n" + "".join(f"    {line}\n" for line in lines))
    defs: list[tuple[ast.Name, int, int]] = []  # (v, the line its binding follows, its indent)
    for node in ast.walk(tree):
        if isinstance(node, ast.For) and isinstance(node.target, ast.Name):
            defs.append((node.target, node.lineno - 2, node.body[0].col_offset - 4))
        elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            defs.append((node.targets[0], node.end_lineno - 2, node.col_offset - 4))
    plain = {id(v) for v, _, _ in defs}
    names &= set(args) | {v.id for v, _, _ in defs}
    names -= {n.id for n in ast.walk(tree)
              if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store) and id(n) not in plain}
    after = {line: " " * indent + f"{v.id}_nn = nonneg({v.id})" for v, line, indent in defs if v.id in names}
    out = [f"{v}_nn = nonneg({v})" for v in args if v in names]
    for k, line in enumerate(lines):
        out.append(_NONNEG.sub(lambda m: f"{m[1]}_nn" if m[1] in names else m[0], line))
        if k in after:
            out.append(after[k])
    return out


def _number_literals(literals: dict[str, str], code: str) -> str:
    """`code` after the definitions of its `literals` (text -> name), each named by where it is
    first read in `code` (`f32_0`, `tab_1`, `f32_2`, ...): in print order, whatever order the
    statements were resolved in."""
    if not literals:
        return code
    text = {name: t for t, name in literals.items()}
    final: dict[str, str] = {}
    for name in re.findall(r"\b(?:" + "|".join(text) + r")\b", code):
        final.setdefault(name, f"{name.split('_')[0]}_{len(final)}")
    code = re.sub(r"\b(?:" + "|".join(final) + r")\b", lambda m: final[m.group()], code) if final else code
    return "".join(f"{new} = {text[old]}\n" for old, new in final.items()) + code


@dataclass(frozen=True, slots=True)
class _Parallel:
    """A parallel loop, printed: what `function` outlines."""
    var: str
    bounds: str
    lines: list[str]


@dataclass(frozen=True, slots=True)
class _Around:
    """A serial loop with a parallel one inside: it stays in the entry."""
    header: str
    var: str
    pieces: list


def _cut(stmts: tuple[Stmt, ...], em) -> list:
    """`stmts` printed: lines for each statement with no parallel loop inside, else a _Parallel or
    an _Around."""
    out: list = []
    for s in stmts:
        if not any(isinstance(n, For) and n.kind is Kind.PARALLEL for n in walk(s)):
            out.append(render(s, em))
            continue
        assert isinstance(s, For), f"a parallel loop inside a statement that is not a loop: {s!r}"
        s = resolve(s, em)
        if s.kind is Kind.PARALLEL:
            out.append(_Parallel(s.var, f"{s.lo.text}, {s.hi.text}", render(s.body, em)))
        else:
            out.append(_Around(_header(s), s.var, _cut(s.body.body, em)))
    return out


def resolve(s: Stmt, em) -> Stmt:
    """`s` with every expression printed, in order: For nodes with named variables and bounds as
    `Text`, the other statements as Source lines. Printing names variables and buffers, numbers
    run-time checks and lists the buffers used, in the order the nests are resolved (literals
    are renumbered in print order by `function`). Resolving a resolved nest returns it. The
    loops of a reduction inside an expression go before the line that reads it."""
    match s:
        case Block(body):
            return block(*(resolve(c, em) for c in body))
        case Source(text, body):
            return Source(text, resolve(body, em))
        case For(var, lo, hi, kind, body, step):
            name = var if isinstance(var, str) else em.name(var)
            return For(name, _bound(lo, em), _bound(hi, em), kind, resolve(body, em), step)
        case Spans(var, (lo, hi), n, inside, body):
            name = var if isinstance(var, str) else em.name(var)
            spans = f"((0, {lo}), ({hi}, {n}))"
            tests = " and ".join(f"{a} <= {v if isinstance(v, str) else em.name(v)} <= {b}" for v, a, b in inside)
            return block(Source(f"spans = {spans} if {tests} else ((0, {n}), ({n}, {n}))" if inside else f"spans = {spans}"),
                         Source("for span in spans:", block(For(name, Text("span[0]"), Text("span[1]"), Kind.SERIAL,
                                                                resolve(body, em)))))
        case Store(buffer, index, value):
            return _with_inline(em, lambda: f"{em.index(buffer, index, buffer)} = {em.expr(value)}")
        case Accumulate(Load(buffer, index, _, loc), value, "sum", True):
            return _with_inline(em, lambda: f"{em.index(buffer, index, str(loc))} += {em.expr(value)}")
        case Accumulate(target, value, "sum", True):
            return _with_inline(em, lambda: f"{em.expr(target)} += {em.expr(value)}")
        case Accumulate(target, value, op, False):
            def text():
                name = em.expr(target)
                return f"{name} = {COMBINE[op].format(name, em.expr(value))}"
            return _with_inline(em, text)
        case Comment(text):
            return Source(f"# {text}")
        case Allocate(array, (n,), dtype, True):
            return Source(f"{array} = lanes.scratch({n}, np.{dtype})")
        case Allocate(array, shape, dtype):
            return Source(f"{array} = np.empty({shape[0] if len(shape) == 1 else shape}, np.{dtype})")
        case Let(var, value):
            return _with_inline(em, lambda: f"{em.expr(var)} = {em.expr(value)}")
        case If(cond, then, otherwise):
            conds = cond if isinstance(cond, tuple) else (cond,)
            test = _with_inline(em, lambda: f"if {' and '.join(em.expr(c) for c in conds)}:")
            head = block(*test.body[:-1], Source(test.body[-1].text, resolve(then, em)))
            if otherwise is None:
                return head
            rest = resolve(otherwise, em)
            first = rest.body[0]
            if (len(otherwise.body) == 1 and isinstance(otherwise.body[0], If) and isinstance(first, Source)
                    and first.text.startswith("if ")):  # (not after a reduction the test computes)
                return block(head, Source("el" + first.text, first.body), *rest.body[1:])  # elif
            return block(head, Source("else:", rest))
        case Fail(message, value):
            em.checks.append(message)
            return block(Source("status[0] = 1"), Source(f"status[1] = {len(em.checks) - 1}"),
                         Source(f"status[2] = {em.expr(value)}"))
    raise TypeError(f"not a statement: {s!r}")


def render(s: Stmt, em, indent: int = 0) -> list[str]:
    """The lines of `s`, indented `indent` levels (a parallel loop inside runs serially: only
    `function` outlines them)."""
    return _lines(resolve(s, em), indent)


def _lines(s: Stmt, indent: int) -> list[str]:
    pad = "    " * indent
    match s:
        case Block(body):
            return [line for c in body for line in _lines(c, indent)]
        case Source(text, body):
            return [pad + text if text else ""] + _lines(body, indent + 1)
        case For(var, lo, hi, Kind.UNROLLED, body):
            return [line for k in range(int(lo.text), int(hi.text)) for line in [f"{pad}{var} = {k}", *_lines(body, indent)]]
        case For(var, lo, hi, Kind.AT_MOST_ONCE, body):
            return [f"{pad}{var} = {lo.text}", f"{pad}if {var} < {hi.text}:"] + _lines(body, indent + 1)
        case For(body=body):
            return [pad + _header(s)] + _lines(body, indent + 1)
    raise TypeError(f"not resolved: {s!r}")


def _header(s: For) -> str:
    """The header of a resolved loop."""
    assert s.step == 1 or s.kind is Kind.SERIAL, f"a {s.kind.value} loop with a step: {s!r}"
    if s.kind is Kind.REVERSED:
        return f"for {s.var} in range({_shift(s.hi.text)}, {_shift(s.lo.text)}, -1):"
    return f"for {s.var} in range({s.lo.text}, {s.hi.text}{'' if s.step == 1 else f', {s.step}'}):"


def _shift(text: str) -> str:
    """A bound minus one."""
    return str(int(text) - 1) if text.lstrip("-").isdigit() else f"{text} - 1"


def _bound(b: Bound, em) -> Text:
    return b if isinstance(b, Text) else Text(str(b) if isinstance(b, int) else em.expr(b))


def _with_inline(em, line) -> Block:
    """`line()`'s text as a Source line, after the loops of the reductions it computes inline (the
    Emitter adds those to `em.out` while it prints the expression)."""
    saved, em.out = em.out, []
    try:
        text = line()
    finally:
        inline, em.out = em.out, saved
    return block(*inline, Source(text))


_NP_FUNCS = {"exp": "np.exp", "log": "np.log", "log1p": "np.log1p", "sqrt": "np.sqrt", "sin": "np.sin",
             "cos": "np.cos", "tan": "np.tan", "tanh": "np.tanh", "sign": "np.sign", "floor": "np.floor",
             "ceil": "np.ceil", "round": "np.rint", "atan2": "np.arctan2"}
# float32 math that vectorizes (runtime/vmath.py); float64 keeps numpy's, i.e. the C library's
_VMATH = {"exp", "log", "log1p", "tanh", "sigmoid", "sin", "cos", "erf"}
# Names the generated code uses for its own: a variable or buffer named so is renamed
# (`Emitter.name`, `Emitter.buffer`).
_RESERVED = {"np", "math", "prange", "njit", "status", "acc", "arg", "val", "checked", "spans", "span", "point", "taps",
             "tap", "start", "stop", "range", "min", "max", "abs",
             "parallel_for", "kernel", "branchless", "vmath", "lanes", "nonneg"}
# hoisted loads and indices, literals, tables, staged adjoints, temporaries, entries and the
# functions runtime/emit.py outlines
_LOCAL = re.compile(r"h\d+|ix\d+|\w+_nn|f32_\d+|tab_\d+|stage\d+|red\d+|row\d+|window\d+|col\d+(_block)?|(acc|red\d+)_(lane\d|terms\d\d)"
                    r"|(forward|backward)\d*(_[bps]\d+)?")


def _generated(name: str) -> bool:
    return name in _RESERVED or _LOCAL.fullmatch(name) is not None


@dataclass
class Emitter:
    """Python text for expressions, with buffer shapes for 0-d buffers and run-time index checks."""
    shapes: dict[str, tuple[int, ...]]
    names: dict[Var, str] = field(default_factory=dict)
    checks: list[str] = field(default_factory=list)  # each run-time index check's error, with {value}
    out: list[Stmt] = field(default_factory=list)  # the kernel's statements, resolved (`put`)
    used: dict[str, None] = field(default_factory=dict)  # buffers the code reads or writes, in order
    # float32 literals and constant tables, defined once at module level: numba freezes globals
    # into constants, and typing an np.float32(...) call at every use made big kernels compile
    # ~25% slower. Text -> name.
    literals: dict[str, str] = field(default_factory=dict)
    buffers: dict[str, str] = field(default_factory=dict)  # buffer -> its name in the kernel (`buffer`)
    _temps: int = 0  # the temporaries named so far (`temp`)

    def name(self, v: Var) -> str:
        if v not in self.names:
            clash = v.name in self.shapes or _generated(v.name)
            base = v.name + "_" if clash else v.name
            taken = set(self.names.values()) | set(self.buffers.values())
            name, k = base, 1
            while name in taken or name in self.shapes or _generated(name):
                name, k = f"{base}{k}", k + 1
            self.names[v] = name
        return self.names[v]

    def buffer(self, name: str) -> str:
        """The kernel's name for buffer `name`: its own, unless the generated code uses that name
        (a parameter called `status` or `np`), then one with underscores added."""
        if name not in self.buffers:
            local, taken = name, set(self.buffers.values()) | set(self.names.values())
            while _generated(local) or local in taken or local != name and local in self.shapes:
                local += "_"
            self.buffers[name] = local
        return self.buffers[name]

    def const(self, value, dtype: str) -> str:
        if dtype == "bool":
            return "True" if value else "False"
        if not is_float(dtype):
            return repr(int(value))
        text = "np.inf" if value == math.inf else "-np.inf" if value == -math.inf else \
            "np.nan" if value != value else repr(float(value))
        if dtype != "float32":
            return text
        return self.literals.setdefault(f"np.float32({text})", f"f32_{len(self.literals)}")


    def index(self, buffer: str, index: tuple[Expr, ...], loc_text: str) -> str:
        self.used[buffer] = None
        local = self.buffer(buffer)
        if not index:
            return f"{local}[0]"
        parts = []
        for d, e in enumerate(index):
            text = self.expr(e)
            if checked_at_run_time(e):
                kind, fix = (("a data-dependent index", "Clamp the index (hd.clamp) or fix the index data")
                             if is_data_dependent(e) else
                             ("an index z3 could not bound", "Read through a boundary view or shrink "
                              "the output so that every read stays inside"))
                self.checks.append(f"{kind} was {{value}}, outside dimension {d} of {buffer} "
                                   f"(valid: 0..{self.shapes[buffer][d] - 1}), read at {loc_text}. {fix}.")
                text = f"checked({text}, {self.shapes[buffer][d]}, status, {len(self.checks) - 1})"
            if not isinstance(e, Const):  # proved or checked >= 0: no wraparound (see vmath.nonneg, _bind_indices)
                text = f"nonneg({text})"
            parts.append(text)
        return f"{local}[{', '.join(parts)}]"

    def row(self, buffer: str, lead: tuple[Expr, ...], loc_text: str) -> str:
        """The last-axis row of `buffer` at its leading indices `lead`: a view (the buffer itself,
        where nothing is left to index)."""
        if not lead:
            self.used[buffer] = None
            return self.buffer(buffer)
        return self.index(buffer, lead, loc_text)

    def expr(self, e: Expr) -> str:
        match e:
            case Const(v, dtype):
                return self.const(v, dtype)
            case Var():
                return self.name(e)
            case Load(buffer, index, _, loc):
                return self.index(buffer, index, str(loc) if loc else show(e))
            case Bin(Op.MIN | Op.MAX as op, a, b):
                # numpy's minimum/maximum propagate NaN from either side; the builtins do not
                fn = op.value if not is_float(dtype_of(e)) else f"np.{op.value}imum"
                return f"{fn}({self.expr(a)}, {self.expr(b)})"
            case Bin(Op.FLOORDIV | Op.MOD as op, a, Const(k)) if _is_power_of_two(k) and not is_float(dtype_of(a)):
                # floor division and mod by 2**n are a shift and a mask, also for negative ints
                # (two's complement); numba's `//` tests the divisor and fixes the sign
                x = self.expr(a)
                return f"({x} >> {k.bit_length() - 1})" if op is Op.FLOORDIV else f"({x} & {k - 1})"
            case Bin(Op.POW, a, Const(2)):
                x = self.expr(a)
                return f"({x} * {x})"
            case Bin(Op.POW, a, Const(3 | 4 as k)) if is_float(dtype_of(a)):
                x = self.expr(a)
                return f"({' * '.join([x] * int(k))})"
            case Bin(Op.POW, a, b) if dtype_of(e) == "float32":
                return f"vmath.pow_f32({self.expr(a)}, {self.expr(b)})"
            case Bin(Op.AND | Op.OR as op, a, b) if dtype_of(a) == "bool" and dtype_of(b) == "bool":
                return f"({self.expr(a)} {'and' if op is Op.AND else 'or'} {self.expr(b)})"
            case Bin(op, a, b):
                return f"({self.expr(a)} {op.value} {self.expr(b)})"
            case Call("neg", (a,)):
                return f"(-{self.expr(a)})"
            case Call(fn, (a,)) if fn in (RUN_TIME_CHECKED, "stop_gradient"):  # (Emitter.index checks)
                return self.expr(a)
            case Call("not", (a,)):
                return f"(not {self.expr(a)})"
            case Call("abs", (a,)):
                return f"abs({self.expr(a)})"
            case Call("rsqrt", (a,)):
                return f"({self.const(1.0, dtype_of(e))} / np.sqrt({self.expr(a)}))"
            case Call(fn, (a,)) if fn in _VMATH and dtype_of(e) == "float32":
                return f"vmath.{fn}_f32({self.expr(a)})"
            case Call("erf", (a,)):
                return self.cast(f"math.erf({self.expr(a)})", dtype_of(e))
            case Call("sigmoid", (a,)):
                one = self.const(1.0, dtype_of(e))
                return f"({one} / ({one} + np.exp(-{self.expr(a)})))"
            case Call(fn, args) if fn in _NP_FUNCS:
                return f"{_NP_FUNCS[fn]}({', '.join(self.expr(a) for a in args)})"
            case Select(c, t, f) if self._speculable(t) and self._speculable(f):
                return f"branchless({self.expr(c)}, {self.expr(t)}, {self.expr(f)})"
            case Select(c, t, f):
                return f"({self.expr(t)} if {self.expr(c)} else {self.expr(f)})"
            case Cast(dtype, v):
                return self.cast(self.expr(v), dtype)
            case Local(name) | Text(name):
                return name
            case IfElse(cond, then, otherwise):
                return f"{self.expr(then)} if {self.expr(cond)} else {self.expr(otherwise)}"
            case Element(array, index, _, buffer, _):
                if buffer:
                    self.used.setdefault(array, None)
                    array = self.buffer(array)
                array = self.expr(array) if isinstance(array, Table) else array
                return f"{array}[{', '.join(self.expr(i) for i in index)}]"
            case Table(rows, dtype):  # (a module-level constant, defined once)
                return self.literals.setdefault(f"np.array({rows}, np.{dtype})", f"tab_{len(self.literals)}")
            case Chain(op, args, grouped):
                text = f" {op.value} ".join(map(self.expr, args))
                return f"({text})" if grouped else text
            case Lanes(locals):
                return ", ".join(map(self.expr, locals))
            case Row(Load(buffer, index, _, loc)):
                return self.row(buffer, index[:-1], str(loc) if loc else show(e.first))
            case Fold(op, (row,), lo, hi, lanes, None):
                return f"lanes.{FOLD[op]}({self.expr(row)}, {lo}, {hi}, ({self.expr(lanes)}))"
            case Fold(op, rows, lo, hi, lanes, terms):
                scalars: list[str] = []
                text = self.terms(terms, scalars)
                rows_ = _tuple(map(self.expr, rows))
                return f'lanes.{FOLD[op]}_of("{text}", {rows_}, {_tuple(scalars)}, {lo}, {hi}, ({self.expr(lanes)}))'
            case LanesOf(lanes):
                return ", ".join(f"({self.expr(ls)})" for ls in lanes)
            case Folds(folds):  # one pass over the rows for them all (schedule/fuse_folds.py)
                scalars = []
                texts = [self.terms(Term(0, f.rows[0].dtype) if f.terms is None else f.terms, scalars) for f in folds]
                rows_ = _tuple(map(self.expr, folds[0].rows))
                lanes_ = _tuple(f"({self.expr(f.lanes)})" for f in folds)
                quoted = _tuple(f'"{t}"' for t in texts)
                return (f"lanes.{FOLD[folds[0].op]}_of_all({quoted}, {rows_}, {_tuple(scalars)}, {folds[0].lo}, "
                        f"{folds[0].hi}, {lanes_})")
            case Combine(op, lhs, rhs):
                return f"({COMBINE[op].format(self.expr(lhs), self.expr(rhs))})"
            case Improves(op, val, acc, arg):
                v, a = self.expr(val), self.expr(acc)
                return f"{self.expr(arg)} < 0 or {v} {'>' if op == 'max' else '<'} {a} or ({v} != {v} and {a} == {a})"
            case Reduce():
                return self.reduce_inline(e)
        raise NotImplementedError(f"no Python for {e!r}")

    def terms(self, e: Expr, scalars: list[str]) -> str:
        """A Fold's terms as the text `lanes.sums_of` reads: rk for its rows' elements, sk for the
        k-th of `scalars`, to which each subexpression without a Term is added (once)."""
        if not any(isinstance(n, Term) for n in walk_expr(e)):
            text = self.expr(e)
            if text not in scalars:
                scalars.append(text)
            return f"s{scalars.index(text)}"
        match e:
            case Term(k):
                return f"r{k}"
            case Bin(op, a, b):
                return f"({self.terms(a, scalars)} {op.value} {self.terms(b, scalars)})"
            case Call("neg", (a,)):
                return f"(-{self.terms(a, scalars)})"
        raise NotImplementedError(f"no fold term for {e!r}")

    def _speculable(self, e: Expr) -> bool:
        """Whether `e` may be computed where its select does not take it (`branchless`): no load
        but those already read into locals (a guarded one may be out of range), no reduction, no
        integer division or remainder by a variable (it may be zero)."""
        stack = [e]
        while stack:
            n = stack.pop()
            match n:
                case Hoisted(load=load):  # read already: only its index is computed here
                    stack.extend(load.index)
                    continue
                case Load() | Reduce() | Element(partial=True):
                    return False
                case Bin(Op.FLOORDIV | Op.MOD, _, Const(k)) if k:
                    pass
                case Bin(Op.FLOORDIV | Op.MOD):
                    return False
            stack.extend(expr_children(n))
        return True

    def cast(self, text: str, dtype: str) -> str:
        return f"np.{'bool_' if dtype == 'bool' else dtype}({text})"

    def put(self, *stmts: Stmt) -> None:
        """Add `stmts` to the kernel's statements, resolved now: its buffers listed, its run-time
        checks numbered in the order the kernel's nests are put."""
        self.out.append(resolve(block(*stmts), self))

    def temp(self, base: str) -> str:
        """A name for a local of the kernel's own, `base` and a number unique in the kernel."""
        self._temps += 1
        return f"{base}{self._temps}"

    def reduce_inline(self, r: Reduce) -> str:
        """Hoist a reduction out of an expression: its loop goes before the line that uses it."""
        tmp = self.temp("red")
        self.out.append(resolve(schedule.run(split_accumulators, lower.accumulation(r, lower.accumulator(r, tmp))), self))
        return tmp


def _is_power_of_two(k) -> bool:
    return isinstance(k, int) and not isinstance(k, bool) and k > 0 and k & (k - 1) == 0
