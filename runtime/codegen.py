"""IR -> Python source a person could have written, for numba to compile.

`emit_forward` writes one function that fills every Func's buffer, stage after stage;
`emit_backward` writes one that fills every adjoint: a gather loop nest per adjoint (one writer
per element, parallel over the outermost useful dimension), then any fallback scatters. Loop
nests are written with `prange` marking the parallel loop; `_outline` then turns each into a
numba function that runs a range of that loop, called through `parallel_for`.
"""
from __future__ import annotations

import collections
from collections.abc import Callable
import math
import re
from dataclasses import dataclass, field, replace

from halide_ad import config
from halide_ad.ir import (RUN_TIME_CHECKED, Bin, Call, Cast, Const, Expr, Func, Load, Op, Program, Range,
                          Reduce, Select, Var, INDEX_DTYPE, adjoint_name, argindex_name, dtype_of, is_float)
from halide_ad.show import show, show_func
from halide_ad.solver import Gather, GatherPiece
from halide_ad.affine import Affine, linear_form
from halide_ad.solver.bounds import checked_at_run_time, interval, is_data_dependent
from halide_ad.runtime.contract import factors
from halide_ad.runtime.schedule import Split, interior, piece_exprs
from halide_ad.runtime.writer import Writer
from halide_ad.traverse import flat_index, free_vars, simplify, substitute, walk

_NP_FUNCS = {"exp": "np.exp", "log": "np.log", "log1p": "np.log1p", "sqrt": "np.sqrt", "sin": "np.sin",
             "cos": "np.cos", "tan": "np.tan", "tanh": "np.tanh", "sign": "np.sign", "floor": "np.floor",
             "ceil": "np.ceil", "round": "np.rint", "atan2": "np.arctan2"}
# float32 math that vectorizes (runtime/vmath.py); float64 keeps numpy's, i.e. the C library's
_VMATH = {"exp", "log", "log1p", "tanh", "sigmoid", "sin", "cos", "erf"}
_RESERVED = {"np", "math", "prange", "njit", "status", "acc", "arg", "val", "checked", "spans", "span", "point", "taps",
             "tap", "start", "stop",
             "parallel_for", "kernel", "branchless", "vmath", "nonneg"}
# hoisted loads and indices, literals, tables, staged adjoints
_LOCAL = re.compile(r"h\d+|ix\d+|f32_\d+|tab_\d+|stage\d+|red\d+|row\d+|col\d+(_block)?|(acc|red\d+)_lane\d")


@dataclass
class Emitter:
    """Python text for expressions, with buffer shapes for 0-d buffers and run-time index checks."""
    shapes: dict[str, tuple[int, ...]]
    names: dict[Var, str] = field(default_factory=dict)
    checks: list[str] = field(default_factory=list)  # each run-time index check's error, with {value}
    out: Writer = field(default_factory=Writer)
    used: dict[str, None] = field(default_factory=dict)  # buffers the code reads or writes, in order
    hoisted: dict[Expr, str] = field(default_factory=dict)  # loads and indices already held in a local
    # float32 literals and constant tables, defined once at module level: numba freezes globals
    # into constants, and typing an np.float32(...) call at every use made big kernels compile
    # ~25% slower. Text -> name.
    literals: dict[str, str] = field(default_factory=dict)
    # adjoints kept one plane at a time in a local array (see `_stage_depth`): buffer -> (the
    # leading dimensions the enclosing loops fix, the local's name)
    staged: dict[str, tuple[int, str]] = field(default_factory=dict)

    def name(self, v: Var) -> str:
        if v not in self.names:
            clash = v.name in self.shapes or v.name in _RESERVED or _LOCAL.fullmatch(v.name)
            base = v.name + "_" if clash else v.name
            taken = set(self.names.values())
            name, k = base, 1
            while name in taken or name in self.shapes:
                name, k = f"{base}{k}", k + 1
            self.names[v] = name
        return self.names[v]

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

    def table(self, rows: list[list], dtype: str) -> str:
        """A module-level constant array of these rows."""
        return self.literals.setdefault(f"np.array({rows!r}, np.{dtype})", f"tab_{len(self.literals)}")

    def index(self, buffer: str, index: tuple[Expr, ...], loc_text: str) -> str:
        if buffer in self.staged:
            depth, local = self.staged[buffer]
            return f"{local}[{', '.join(self.expr(e) for e in index[depth:])}]"
        self.used[buffer] = None
        if not index:
            return f"{buffer}[0]"
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
            if not isinstance(e, Const):  # proved or checked >= 0: no wraparound (see vmath.nonneg)
                text = f"nonneg({text})"
            parts.append(text)
        return f"{buffer}[{', '.join(parts)}]"

    def expr(self, e: Expr) -> str:
        if self.hoisted and isinstance(e, (Load, Bin)) and e in self.hoisted:
            return self.hoisted[e]
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
            case Reduce():
                return self.reduce_inline(e)
        raise NotImplementedError(f"no Python for {e!r}")

    def _speculable(self, e: Expr) -> bool:
        """Whether `e` may be computed where its select does not take it (`branchless`): no load
        but those already read into variables (a guarded one may be out of range), no reduction,
        no integer division or remainder by a variable (it may be zero)."""
        for n in walk(e):
            if self.hoisted and n in self.hoisted:
                continue
            match n:
                case Load() | Reduce():
                    return False
                case Bin(Op.FLOORDIV | Op.MOD, _, Const(k)) if k:
                    continue
                case Bin(Op.FLOORDIV | Op.MOD):
                    return False
        return True

    def cast(self, text: str, dtype: str) -> str:
        return f"np.{'bool_' if dtype == 'bool' else dtype}({text})"

    def reduce_inline(self, r: Reduce) -> str:
        """Hoist a reduction out of an expression: its loop goes before the line that uses it."""
        tmp = self.out.temp("red")
        _emit_accumulation(self.out, self, r, tmp)
        return tmp


def reduce_init(r: Reduce, em: Emitter, dtype: str | None = None) -> str:
    dtype = dtype or dtype_of(r)
    if r.op in ("argmax", "argmin"):
        dtype = dtype_of(r.body)
    init = {"sum": 0, "prod": 1, "max": -math.inf, "min": math.inf}.get(r.op, -math.inf if r.op == "argmax" else math.inf)
    if not is_float(dtype) and dtype != "bool" and not isinstance(init, int):
        import numpy as np
        info = np.iinfo(dtype)
        init = info.min if init < 0 else info.max
    return em.const(init, dtype)


LONG_SUM = 256  # terms from which a float32 sum or product accumulates in float64
LANES = 8  # independent partial sums of a long reduction over a contiguous axis


def accumulator_dtype(op: str, dtype: str, terms: int) -> str:
    """float64 for a float32 sum or product of LONG_SUM terms or more. Each float32 add rounds
    to the running total's precision: a sum of 16M squares came out 2% low. The result is
    rounded to float32 once, at the store."""
    return "float64" if op in ("sum", "prod") and dtype == "float32" and terms >= LONG_SUM else dtype


def _terms(r: Reduce) -> int:
    return math.prod(rv.hi - rv.lo for rv in r.rvars)


def _unit_stride(e: Expr, v: Var) -> bool:
    """Whether the last index of some load in `e` steps by one with `v`."""
    return any(n.index and (form := linear_form(n.index[-1])) is not None and form[0].get(v) == 1
               for n in walk(e) if isinstance(n, Load))


def _lane_var(r: Reduce) -> Range | None:
    """The innermost reduction variable, where the sum runs as LANES partial sums over it: it
    walks a contiguous axis (so the lanes read one cache line) for at least two rounds. One
    running total is a chain of dependent adds, each waiting for the last (~4 cycles); LANES of
    them keep the adder busy. Deterministic: the split depends on the extent only. (A masked sum
    keeps one total.)"""
    rv = r.rvars[-1] if r.rvars else None
    if (rv is None or r.op not in ("sum", "prod", "max", "min") or not is_float(dtype_of(r)) or r.where is not None
            or rv.hi - rv.lo < 2 * LANES or not _unit_stride(r.body, rv.var)):
        return None
    return rv


def _emit_accumulation(w: Writer, em: Emitter, r: Reduce, acc: str) -> None:
    """`acc` = the sum or product `r`, in its accumulator's dtype (`accumulator_dtype`), or the
    max or min `r` of a Func that keeps no argindex (numpy's NaN rule, `vmath.maximum`)."""
    op = {"sum": "{} + {}", "prod": "{} * {}", "max": "vmath.maximum({}, {})", "min": "vmath.minimum({}, {})"}[r.op]
    init = reduce_init(r, em, accumulator_dtype(r.op, dtype_of(r), _terms(r)))
    lane = _lane_var(r)
    lanes = [acc] + [f"{acc}_lane{q}" for q in range(1, LANES)] if lane is not None else [acc]
    for name in lanes:
        w.line(f"{name} = {init}")
    depth = w.depth
    _open_reduction(w, em, r.rvars if lane is None else r.rvars[:-1], r.where)
    if lane is None:
        w.line(f"{acc} = {op.format(acc, em.expr(r.body))}")
    else:
        v, whole = em.name(lane.var), lane.lo + (lane.hi - lane.lo) // LANES * LANES
        _lane_rounds(w, em, lane.var, lane.lo, whole, r.body, lanes,
                     lambda name, value: f"{name} = {op.format(name, value)}")
        if whole < lane.hi:
            with w.block(f"for {v} in range({whole}, {lane.hi}):"):
                w.line(f"{acc} = {op.format(acc, em.expr(r.body))}")
    w.depth = depth
    if lane is not None:
        w.line(f"{acc} = {_pairwise(lanes, op)}")


def _lane_rounds(w: Writer, em: Emitter, var: Var, lo: int, whole: int, body: Expr, lanes: list[str],
                 update: Callable[[str, str], str]) -> None:
    """`for var in range(lo, whole, LANES)`, lane q updated with `body` at var + q by the line
    `update(lane, value)`: the rounds of a reduction split into LANES partial results."""
    with w.block(f"for {em.name(var)} in range({lo}, {whole}, {LANES}):"):
        for q, name in enumerate(lanes):
            shifted = simplify(substitute(body, {var: Bin(Op.ADD, var, Const(q, INDEX_DTYPE))}))
            w.line(update(name, em.expr(shifted)))


def _open_reduction(w: Writer, em: Emitter, rvars: tuple[Range, ...], where: Expr | None) -> None:
    """The loops over `rvars` (first outermost), and the test of `where` inside them."""
    for rv in rvars:
        w.line(f"for {em.name(rv.var)} in range({rv.lo}, {rv.hi}):")
        w.depth += 1
    if where is not None:
        w.line(f"if {em.expr(where)}:")
        w.depth += 1


def _pairwise(names: list[str], op: str) -> str:
    """((a + b) + (c + d)) + ...: the lanes combined in a fixed tree. `op` is "+" or "*", or a
    format with two places ("{} + {}")."""
    form = op if "{}" in op else f"{{}} {op} {{}}"
    while len(names) > 1:
        names = [f"({form.format(a, b)})" for a, b in zip(names[::2], names[1::2])] + names[len(names) // 2 * 2:]
    return names[0]


def _is_power_of_two(k) -> bool:
    return isinstance(k, int) and not isinstance(k, bool) and k > 0 and k & (k - 1) == 0


def _parallel_min_points() -> int:
    """Below this many points a loop nest runs serially: threads cost more than they save there
    (handing chunks to the pool and waiting for them takes ~50 us: x * w + x over 64K float32
    took 70 us on two threads, 15 us on one). Set with HALIDE_AD_PARALLEL_MIN_POINTS (0: every
    loop nest with more than one point is parallel)."""
    return config.parallel_min_points()


def settings() -> tuple:
    """The environment settings that change generated code: keys of cached code include them."""
    return (_parallel_min_points(),)


def _parallel_dim(shape: tuple[int, ...], terms: float = 1) -> int | None:
    """The dimension a loop nest over `shape` runs in parallel: the first with more than one point,
    where the points times the `terms` each adds up (a reduction's) reach _parallel_min_points. A
    batch norm's statistics are 64 points of 262144 terms each: they ran on one thread."""
    if math.prod(shape) * terms < _parallel_min_points():
        return None
    return next((d for d, n in enumerate(shape) if n > 1), None)


def _loop_nest(w: Writer, em: Emitter, vars_, shape, terms: float = 1):
    """Open one loop per dimension (prange on `_parallel_dim`)."""
    par = _parallel_dim(shape, terms)
    for d, (v, n) in enumerate(zip(vars_, shape, strict=True)):
        _open_loop(w, em.name(v), f"0, {n}", d == par)


def _open_loop(w: Writer, name: str, bounds: str, parallel: bool) -> None:
    """numba may type a prange index as unsigned, and uint64 mixed with int64 gives float64:
    rebind it as int64."""
    if parallel:
        w.line(f"for {name}_ in prange({bounds}):")
        w.depth += 1
        w.line(f"{name} = np.int64({name}_)")
    else:
        w.line(f"for {name} in range({bounds}):")
        w.depth += 1


def _function(em: Emitter, entry: str) -> str:
    """The module text for `entry(<the buffers it uses>, status)`: its loop nests become numba
    functions (`_outline`), and `entry` itself is the Python that calls them in order."""
    names = [*em.used, "status"]
    helpers, body = _outline(em.out.lines, entry, names)
    literals = "".join(f"{name} = {text}\n" for text, name in em.literals.items())
    return literals + "".join(helpers) + f"def {entry}({', '.join(names)}):\n" + "\n".join(body) + "\n"


_PRANGE = re.compile(r"^( *)for (\w+)_ in prange\((.*)\):$")
_FOR = re.compile(r"^( *)for (\w+) in range\(")
_NAME = re.compile(r"\b[A-Za-z_]\w*\b")


def _outline(lines: list[str], entry: str, names: list[str]) -> tuple[list[str], list[str]]:
    """(helper sources, the entry's body). The body of each prange loop becomes a numba function
    of the loop index, `entry_b<k>(j, ...)`, and `entry_p<k>(start, stop, ...)` calls it for the
    iterations [start, stop): the entry hands both to `parallel_for` (runtime/parallel.py), which
    calls the body from Python where each iteration is large. (With the loop inside the body's
    own function, LLVM made the bilinear gradient ~20% slower.) The
    statements between prange loops become serial functions `entry_s<k>(...)`. Loops that enclose
    a prange (of extent 1: the parallel dimension is the first longer one) stay in the entry, as
    Python."""
    helpers: list[str] = []

    def params(body: list[str], outer: list[str]) -> list[str]:
        used = set(_NAME.findall("\n".join(body)))
        return [v for v in outer if v in used] + [n for n in names if n in used]

    def helper(kind: str, args: list[str], body: list[str], indent: int) -> str:
        name = f"{entry}_{kind}{len(helpers)}"
        helpers.append(f"@kernel\ndef {name}({', '.join(args)}):\n"
                       + "".join(" " * 4 + line[indent:] + "\n" for line in body) + "\n\n")
        return name

    def level(lines: list[str], indent: int, outer: list[str]) -> list[str]:
        out, serial = [], []

        def flush() -> None:
            if any(line.strip() and not line.strip().startswith("#") for line in serial):
                args = params(serial, outer)
                out.append(" " * indent + f"{helper('s', args, serial, indent)}({', '.join(args)})")
            else:
                out.extend(serial)
            serial.clear()

        for statement in _statements(lines, indent):
            head = statement[0]
            if head.strip() == "return None":  # the entry ends with its own
                continue
            if not any("prange(" in line for line in statement):
                serial += statement
                continue
            flush()
            if (match := _PRANGE.match(head)) is not None:
                var, bounds = match.group(2), match.group(3)
                body = statement[2:]  # [1] rebinds the index as int64: the parameter is one
                args = params(body, outer)
                iteration = helper("b", [var, *args], body, indent + 4)
                name = helper("p", ["start", "stop", *args], [f"for {var} in range(start, stop):",
                                                              f"    {iteration}({', '.join([var, *args])})"], 0)
                out.append(" " * indent + f"parallel_for({name}, {bounds}{''.join(', ' + a for a in args)}, "
                                          f"iteration={iteration})")
            else:
                loop = _FOR.match(head)
                assert loop is not None, f"a prange inside a statement that is not a loop: {head!r}"
                out.append(head)
                out += level(statement[1:], indent + 4, outer + [loop.group(2)])
        flush()
        return out

    return helpers, level(lines, 4, []) + ["    return None"]


def _statements(lines: list[str], indent: int) -> list[list[str]]:
    """`lines` cut into statements at `indent`: each a line and the deeper lines after it."""
    statements: list[list[str]] = []
    for line in lines:
        if statements and (not line.strip() or len(line) - len(line.lstrip(" ")) > indent):
            statements[-1].append(line)
        else:
            statements.append([line])
    return statements


def emit_forward(program: Program, funcs: tuple[Func, ...], entry: str) -> tuple[str, list[str], list[str]]:
    """The source of `entry(...)` computing `funcs`, its parameter names, and the run-time index checks."""
    shapes = {b.name: b.shape for b in program.inputs} | {f.name: f.shape for f in program.funcs}
    shapes |= {argindex_name(f.name): f.shape for f in program.funcs if f.keeps_argindex}
    em = Emitter(shapes)
    w = em.out
    w.depth = 1
    for f in funcs:
        w.line(f"# {show_func(f)}" + (f"  ({f.loc})" if f.loc else ""))
        depth = w.depth
        if _reduces_by_rows(f):
            _emit_row_reduction(w, em, f)
        elif (split := _pointwise_phases(f)) is not None:
            _emit_phased(w, em, f, split)
        else:
            _loop_nest(w, em, f.vars, f.shape, _terms(f.body) if isinstance(f.body, Reduce) else 1)
            store = em.index(f.name, f.vars, f.name)  # (the output first among the kernel's parameters)
            if isinstance(f.body, Reduce):
                _emit_reduction(w, em, f)
            else:
                w.line(f"{store} = {em.expr(f.body)}")
        w.depth = depth
    w.line("return None")
    return _function(em, entry), list(em.used), em.checks


def _pointwise_phases(f: Func) -> Split | None:
    """How to run a pointwise definition that reads through quotients or parities of its
    innermost variables (`x[i // 2]`, a 2x upsampling; a bilinear weight's `i % 2 == 0`): split
    as the gradient's gathers are (runtime/schedule.py), those dimensions in phases j = s*q + p,
    in each of which every quotient is q + a constant and every parity test is decided, so that
    the loads are unit-stride and the loop vectorizes. None where there are no phases to run."""
    if isinstance(f.body, Reduce) or not f.vars or not any(
            isinstance(n, Bin) and n.op in (Op.FLOORDIV, Op.MOD) and isinstance(n.rhs, Const)
            and f.vars[-1] in free_vars(n.lhs) for n in walk(f.body)):
        return None  # phases start from the innermost dimension: without its quotient, no schedule to ask
    split = interior(f.vars, f.shape, [_as_gather(f)])
    if split is None or not split.phased:
        return None
    gathers = [g for gs in split.phases.values() for g in gs] + [g for _, gs in split.outside for g in gs]
    if any(len(g.pieces) != 1 or g.pieces[0].loops or any(g.pieces[0].guards) for g in gathers):
        return None
    return split


def _as_gather(f: Func) -> Gather:
    """A pointwise definition as a gather of one term, which the schedule splits as it does
    the gradient's."""
    return Gather(None, f.vars, (GatherPiece((), ((),), f.body, ()),))


def _emit_phased(w: Writer, em: Emitter, f: Func, split: Split) -> None:
    def body(gs, at=None, terms=(), terms_dtype=None):
        index = tuple((at or {}).get(v, v) for v in f.vars)
        values = [em.expr(p.value) for g in gs for p in g.pieces] + _weighted_sums(em, list(terms), f.dtype)
        w.line(f"{em.index(f.name, index, f.name)} = {' + '.join(values)}")

    _split_loop_nest(w, em, f.vars, f.shape, split, body, [_as_gather(f)], f.name)


def _emit_reduction(w: Writer, em: Emitter, f: Func) -> None:
    r: Reduce = f.body
    result = "arg" if r.op in ("argmax", "argmin") else "acc"
    if r.op in ("sum", "prod") or r.op in ("max", "min") and not f.keeps_argindex:
        _emit_accumulation(w, em, r, "acc")
    else:
        _emit_extremum(w, em, r)
    w.line(f"{em.index(f.name, f.vars, f.name)} = {result}")
    if f.keeps_argindex:
        w.line(f"{em.index(argindex_name(f.name), f.vars, f.name)} = arg")


MAX_PARTS = 16  # partial results of a reduction to one point (`split_reduction`)


def split_reduction(f: Func, taken: set[str]) -> tuple[Func, Func] | None:
    """A long sum or product to one point (a loss) as partial results over MAX_PARTS or fewer
    equal chunks of its first reduction variable whose extent they divide, a Func of their own
    whose points run in parallel, then their combination (Halide's rfactor). None where `f`'s
    points already run in parallel, or no chunking fits. The chunks are fixed by the extents, so
    the result does not depend on the thread count; float32 partials are float64."""
    r = f.body
    if (not isinstance(r, Reduce) or r.op not in ("sum", "prod") or not is_float(f.dtype)
            or _parallel_dim(f.shape, _terms(r)) is not None
            or math.prod(f.shape) * _terms(r) < _parallel_min_points()):
        return None
    for k, rv in enumerate(r.rvars):
        extent = rv.hi - rv.lo
        parts = next((n for n in range(min(MAX_PARTS, extent // 2), 1, -1) if extent % n == 0), None)
        if parts is not None:
            break
    else:
        return None
    names = {n.name for n in walk(r) if isinstance(n, Var)} | {v.name for v in f.vars} | taken

    def fresh(base: str) -> str:
        while base in names:
            base += "_"
        names.add(base)
        return base

    part, inner = Var(fresh(f"{rv.var.name}_part")), Var(fresh(f"{rv.var.name}_in"))
    size = extent // parts
    at = {rv.var: Bin(Op.ADD, Bin(Op.ADD, Bin(Op.MUL, part, Const(size, INDEX_DTYPE)), inner),
                      Const(rv.lo, INDEX_DTYPE))}
    wide = "float64" if f.dtype == "float32" else f.dtype
    body = simplify(substitute(r.body, at))
    body = body if dtype_of(body) == wide else Cast(wide, body)
    where = None if r.where is None else simplify(substitute(r.where, at))
    rvars = r.rvars[:k] + (Range(inner, 0, size),) + r.rvars[k + 1:]
    partial = Func(fresh(f"{f.name}_parts"), (part, *f.vars), (parts, *f.shape),
                   Reduce(r.op, body, rvars, where, r.loc), wide, f.loc)
    combined = Reduce(r.op, Load(partial.name, (part, *f.vars), wide), (Range(part, 0, parts),), None, r.loc)
    return partial, replace(f, body=combined)


def _reduces_by_rows(f: Func) -> bool:
    """Whether the sum or product `f` runs with its last pure loop inside the reduction's loops
    (`_emit_row_reduction`): that loop walks the reads' last axis, which no reduction variable
    does, so the reduction would otherwise stride across rows for every element (a mean over
    the channels of NCHW, 6x slower than numpy)."""
    r = f.body
    if not isinstance(r, Reduce) or r.op not in ("sum", "prod") or not f.vars or f.shape[-1] < 2:
        return False
    par = _parallel_dim(f.shape, _terms(r))
    rvars = {rv.var for rv in r.rvars}
    return (par != len(f.vars) - 1 and _unit_stride(r.body, f.vars[-1])
            and not any(n.index and free_vars(n.index[-1]) & rvars
                        for n in walk(r.body) if isinstance(n, Load)))


def _emit_row_reduction(w: Writer, em: Emitter, f: Func) -> None:
    """`f`'s rows reduced one at a time: for each row, the reduction's loops outside, the row's
    loop inside, so every read walks memory in order. Each element still accumulates its terms in
    reduction order, so the result is the same as one element at a time. A float64 accumulator
    (`accumulator_dtype`) is a row of its own; otherwise the output row accumulates in place."""
    r: Reduce = f.body
    op = {"sum": "+", "prod": "*"}[r.op]
    dtype = accumulator_dtype(r.op, dtype_of(r), _terms(r))
    par = _parallel_dim(f.shape, _terms(r))
    k, n = em.name(f.vars[-1]), f.shape[-1]
    store = em.index(f.name, f.vars, f.name)
    row = None if dtype == f.dtype else w.temp("row")
    acc = store if row is None else f"{row}[{k}]"
    _open_rows(w, em, f.vars, f.shape, par, row, dtype)
    with w.block(f"for {k} in range(0, {n}):"):
        w.line(f"{acc} = {reduce_init(r, em, dtype)}")
    depth = w.depth
    _open_reduction(w, em, r.rvars, None)
    with w.block(f"for {k} in range(0, {n}):"):
        if r.where is not None:
            w.line(f"if {em.expr(r.where)}:")
            w.depth += 1
        w.line(f"{acc} = {acc} {op} {em.expr(r.body)}")
    w.depth = depth
    if row is not None:
        with w.block(f"for {k} in range(0, {n}):"):
            w.line(f"{store} = {acc}")


def _open_rows(w: Writer, em: Emitter, vars_, shape, par: int | None, row: str | None, dtype: str) -> None:
    """The loops over all but the last of `vars_` (prange on dimension `par`), for a loop nest run
    a row at a time; where the row accumulates in a local array `row` of `dtype`, that array,
    allocated once per parallel iteration (once in all, serially)."""
    if row is not None and par is None:
        w.line(f"{row} = np.empty({shape[-1]}, np.{dtype})")
    for d, v in enumerate(vars_[:-1]):
        _open_loop(w, em.name(v), f"0, {shape[d]}", d == par)
        if row is not None and d == par:
            w.line(f"{row} = np.empty({shape[-1]}, np.{dtype})")


def _emit_extremum(w: Writer, em: Emitter, r: Reduce) -> None:
    """acc = the max or min of `r`, arg = its position in reduction order (-1 if empty)."""
    w.line(f"acc = {reduce_init(r, em)}")
    w.line("arg = -1")
    depth = w.depth
    _open_reduction(w, em, r.rvars, r.where)
    better = ">" if r.op in ("max", "argmax") else "<"
    w.line(f"val = {em.expr(r.body)}")
    # The first extremal element wins; a NaN wins over numbers, as in numpy.
    with w.block(f"if arg < 0 or val {better} acc or (val != val and acc == acc):"):
        w.line("acc = val")
        w.line(f"arg = {em.expr(flat_index(r.rvars))}")
    w.depth = depth


def emit_backward(program: Program, plans, entry: str, private: frozenset[str] = frozenset(),
                  temporaries: tuple[tuple[str, tuple[int, ...]], ...] = ()
                  ) -> tuple[str, list[str], list[str]]:
    """The source of `backward(...)`: one gather loop nest per adjoint, then fallback scatters.

    `plans` are `AdjointPlan`s in order (outputs first), each adjoint's contributions inverted.
    `private` names the adjoints that only the next plan reads: such a pair may run one plane at
    a time, the first adjoint's plane kept in a local array (`_stage_depth`). `temporaries`: the
    names and shapes of buffers that earlier steps of the gradient filled and that no program
    buffer is the adjoint of (a strided convolution's products per tap).
    """
    shapes = {b.name: b.shape for b in program.inputs} | {f.name: f.shape for f in program.funcs}
    shapes |= {adjoint_name(n): sh for n, sh in shapes.items()}  # inlined adjoints read ones stored earlier
    shapes |= dict(temporaries)
    shapes |= {argindex_name(f.name): f.shape for f in program.funcs if f.keeps_argindex}
    computed = [p for p in plans if p.contributions and not p.inlined]
    shapes |= {"ct_" + p.adjoint.buffer: p.adjoint.shape for p in computed if p.adjoint.seeded}
    em = Emitter(shapes)
    w = em.out
    w.depth = 1
    gathers = [[c for c in p.contributions if isinstance(c, Gather)] for p in computed]
    splits = [interior(p.new_vars, p.adjoint.shape, gs) for p, gs in zip(computed, gathers, strict=True)]

    def nest(k: int, opened: int = 0) -> None:
        plan, adj = computed[k], computed[k].adjoint
        name = adjoint_name(adj.buffer)

        def body(gs, at=None, terms=(), terms_dtype=None):
            """acc = the gathers `gs` (and the `terms`, (text, weight) pairs whose texts are of
            `terms_dtype`), stored at j, or at `at[j]` for phased dimensions."""
            index = tuple((at or {}).get(v, v) for v in plan.new_vars)
            guarded = Writer()  # the pieces under a guard or in a loop go after the sums
            guarded.depth = w.depth
            like: dict[tuple[Load, ...], float] = {}
            for g in gs:
                _emit_gather(guarded, em, g, like, adj.dtype, "float64" if _wide_gathers(gs, adj) else adj.dtype)
            sums = _weighted_sums(em, [(" * ".join(em.expr(x) for x in loads), scale)
                                       for loads, scale in like.items()] + list(terms), adj.dtype)
            # the first sum starts acc where it is of acc's dtype (the terms' may not be)
            first = (em.index("ct_" + adj.buffer, index, name) if adj.seeded else
                     sums.pop(0) if like or sums and terms_dtype == adj.dtype else em.const(0, adj.dtype))
            if _wide_gathers(gs, adj):
                first = em.cast(first, "float64")
            w.line(f"acc = {first}")
            for term in sums:
                w.line(f"acc += {term}")
            w.lines += guarded.lines
            w.line(f"{em.index(name, index, name)} = acc")

        if not opened and splits[k] is None and _gathers_by_rows(plan.new_vars, adj.shape, gathers[k]):
            _emit_row_gathers(w, em, plan, gathers[k], name)
            return
        terms = _gather_terms(gathers[k], adj.shape) if not opened else 1
        _split_loop_nest(w, em, plan.new_vars, adj.shape, splits[k], body, gathers[k], name, opened, terms)

    k = 0
    while k < len(computed):
        plan = computed[k]
        name = adjoint_name(plan.adjoint.buffer)
        w.line(f"# {name}: {len(plan.contributions)} contribution(s)")
        depth = _stage_depth(computed, splits, gathers, k, private)
        if depth:
            _emit_staged(w, em, computed, k, depth, nest)
            k += 2
            continue
        nest(k)
        for s in plan.contributions:
            if not isinstance(s, Gather):
                _emit_scatter(w, em, s, name)
        k += 1
    w.line("return None")
    return _function(em, entry), list(em.used), em.checks


MAX_STAGE = 1 << 18  # elements of a staged adjoint's plane, per thread: L2-sized


def _cut_dims(vars_, shape, split) -> list[int]:
    """The dimensions that the split's box or phases cut."""
    if split is None:
        return []
    return [d for d, v in enumerate(vars_) if v in split.box and (split.box[v] != (0, shape[d] - 1) or v in split.phased)]


def _stage_depth(computed, splits, gathers, k: int, private: frozenset[str]) -> int:
    """How many leading dimensions adjoint k and the next one can loop over together, running
    one plane of each per iteration, adjoint k's plane in a local array that the next one reads
    while it is in cache, instead of a buffer written out and read back (the maxpool gradient
    that a blur's gradient reads, in a blur -> relu -> maxpool pipeline); 0 where they cannot.
    Adjoint k must be read by the next one only (`private`), the next one must read it at its
    own leading variables, and both loop nests must leave those dimensions whole."""
    if k + 1 >= len(computed):
        return 0
    producer, consumer = computed[k], computed[k + 1]
    name = adjoint_name(producer.adjoint.buffer)
    shape = consumer.adjoint.shape
    if name not in private or any(len(p.contributions) != len(g) for p, g in zip(computed[k:k + 2], gathers[k:k + 2])):
        return 0  # a fallback scatter runs as a loop nest of its own
    depth = min([len(p.adjoint.shape) - (1 if s is None or s.separable is None else 2)  # a separable window's
                 for p, s in zip(computed[k:k + 2], splits[k:k + 2], strict=True)]  # two passes need a plane
                + [d for p, s in zip(computed[k:k + 2], splits[k:k + 2], strict=True)
                   for d in _cut_dims(p.new_vars, p.adjoint.shape, s)[:1]])
    par = _parallel_dim(shape)  # (depth is -1 for a 0-d adjoint)
    if (depth <= 0 or par is not None and par >= depth or producer.adjoint.shape[:depth] != shape[:depth]
            or _parallel_dim(producer.adjoint.shape) != par or math.prod(producer.adjoint.shape[depth:]) > MAX_STAGE):
        return 0
    loads = [n for g in gathers[k + 1] for p in g.pieces for e in piece_exprs(p) for n in walk(e)
             if isinstance(n, Load) and n.buffer == name]
    if not loads or any(n.index[:depth] != consumer.new_vars[:depth] or any(map(checked_at_run_time, n.index))
                        for n in loads):
        return 0
    return depth


def _emit_staged(w: Writer, em: Emitter, computed, k: int, depth: int, nest) -> None:
    """Adjoint k and the next one, a plane of each per iteration of their leading `depth`
    dimensions, adjoint k's plane in a local array (see `_stage_depth`); `nest(k, opened)` emits
    adjoint k's loop nest inside loops already open."""
    producer, consumer = computed[k], computed[k + 1]
    shape, dtype = consumer.adjoint.shape, producer.adjoint.dtype
    name = adjoint_name(producer.adjoint.buffer)
    stage = w.temp("stage")  # unique in the kernel: two stages in one function may differ in type
    w.line(f"# {adjoint_name(consumer.adjoint.buffer)}: {len(consumer.contributions)} contribution(s), "
           f"reading {name} one plane at a time from {stage}")
    base, par = w.depth, _parallel_dim(shape)
    allocate = f"{stage} = np.empty({tuple(producer.adjoint.shape[depth:])}, np.{dtype})"
    if par is None:
        w.line(allocate)
    for d in range(depth):
        _open_loop(w, em.name(consumer.new_vars[d]), f"0, {shape[d]}", d == par)
        if d == par:  # one plane per thread
            w.line(allocate)
    for mine, theirs in zip(producer.new_vars[:depth], consumer.new_vars[:depth], strict=True):
        if em.name(mine) != em.name(theirs):
            w.line(f"{em.name(mine)} = {em.name(theirs)}")
    em.staged[name] = (depth, stage)
    level = w.depth
    nest(k, depth)
    w.depth = level
    nest(k + 1, depth)
    w.depth = base
    del em.staged[name]


def _split_loop_nest(w: Writer, em: Emitter, vars_, shape, split, body, gathers, written: str,
                     opened: int = 0, terms: float = 1) -> None:
    """The loop nest over `vars_` running `body(gathers)`, or, with a Split, one nest per region
    around the box running that region's specialized gathers (or, without regions, one over all
    the points outside the box running the general gathers), then one over the box running
    `split.inside`, or each phase's gathers with the phased dimensions as j = stride*q + p. The
    regions beside the box in its last dimension only run inside the box's loop, next to each
    row's interior. Each body is emitted once per region and once per phase. The loops over the
    first `opened` dimensions are open already; `terms` is the gathers' terms per point."""
    par = _parallel_dim(shape, terms)
    dims = _cut_dims(vars_, shape, split)
    box = {vars_[d]: split.box[vars_[d]] for d in dims}
    depth = w.depth
    if not dims and (split is None or split.separable is None):
        _full_loops(w, em, vars_, shape, range(opened, len(vars_)), par, lambda: body(gathers))
        w.depth = depth
        return
    first, last = (dims[0], dims[-1]) if dims else (len(vars_) - 2, len(vars_) - 2)  # else a whole separable window
    _full_loops(w, em, vars_, shape, range(opened, first), par, lambda: None)
    level = w.depth
    i, j = len(vars_) - 2, len(vars_) - 1
    separable = split.separable is not None and first <= i and par not in (i, j) and \
        _ring_rows(split) * shape[j] <= MAX_SEPARABLE_TEMP
    # regions beside the box in its last dimension only (a plane's edge columns) run inside the
    # box's loop over the dimension before it, while that row is in cache
    def is_column(region) -> bool:
        return not separable and region[vars_[last]] != box[vars_[last]] and all(
            region[vars_[d]] == box[vars_[d]] for d in dims[:-1])

    columns = [c for c in split.outside if is_column(c[0])]

    def regions(chosen, in_box_loop: bool) -> None:
        """Each region's loop nest, from the first box dimension in (from the last, inside the box's
        loop over the one before it), running its own specialized gathers with each point read
        once; a thin one (a row of one image), or one inside the box's loop, runs serially."""
        start, depth_ = (last if in_box_loop else first), w.depth
        for region, gs in chosen:
            ranges = {v: region.get(v, (0, n - 1)) for v, n in zip(vars_, shape, strict=True)}
            parallel = not in_box_loop and math.prod(hi - lo + 1 for lo, hi in ranges.values()) >= _parallel_min_points()
            for d in range(start, len(vars_)):
                lo, hi = ranges[vars_[d]]
                if lo == hi:  # a loop of one point costs numba more to compile than the body
                    w.line(f"{em.name(vars_[d])} = {lo}")
                else:
                    _open_loop(w, em.name(vars_[d]), f"{lo}, {hi + 1}", d == par and parallel)
            _hoist_loads(w, em, gs, ranges, written)
            body(gs)
            em.hoisted.clear()
            w.depth = depth_

    # the box; a separable one runs before the regions around it, whose edge columns (not inside
    # its row loop, which has none) then find the rows it read in cache: a bilinear gradient's
    # edges ran 2.5 ms faster after its interior than before it (other boxes ran as fast or
    # slightly faster after)
    phased = {vars_.index(j): k for k, j in enumerate(split.phased)}

    def box_loops(d: int, combo: tuple[int, ...], at: dict) -> None:
        if d == last and columns:
            # a phased row is j = s*q + p: the columns' gathers read it under a name of its own
            aliases = {}
            for v, e in at.items():
                alias = em.name(Var(f"{v.name}_{e.rhs.value}"))
                w.line(f"{alias} = {em.expr(e)}")
                aliases[v] = alias
            side(aliases, [c for c in columns if c[0][vars_[d]][1] < box[vars_[d]][0]])
            dim_loop(d, combo, at)
            side(aliases, [c for c in columns if c[0][vars_[d]][0] > box[vars_[d]][1]])
        else:
            dim_loop(d, combo, at)

    def side(aliases: dict[Var, str], chosen) -> None:
        saved = {v: em.names[v] for v in aliases}
        em.names.update(aliases)
        regions(chosen, True)
        em.names.update(saved)

    def dim_loop(d: int, combo: tuple[int, ...], at: dict) -> None:
        if d == len(vars_):
            body(split.phases[combo], at) if split.phased else body(split.inside)
            return
        v = vars_[d]
        if d not in phased:
            lo, hi = box[v] if v in box else (0, shape[d] - 1)
            _open_loop(w, em.name(v), f"{lo}, {hi + 1}", d == par)
            box_loops(d + 1, combo, at)
            w.depth -= 1
            return
        k = phased[d]
        stride, q = split.strides[k], split.phase_vars[k]
        lo, hi = box[v]
        _open_loop(w, em.name(q), f"{lo // stride}, {(hi + 1) // stride}", d == par)
        if k == len(split.phased) - 1:  # the phases of one iteration share their loads
            _hoist_loads(w, em, [g for p in range(stride) for g in split.phases[combo + (p,)]],
                         _box_ranges(vars_, shape, split), written)
        for p in range(stride):  # j is not assigned: a variable set twice per iteration slows numba
            w.line(f"# phase {p} of {stride}: {em.name(v)} = {stride} * {em.name(q)} + {p}")
            box_loops(d + 1, combo + (p,), at | {v: Bin(Op.ADD, Bin(Op.MUL, Const(stride, INDEX_DTYPE), q),
                                                        Const(p, INDEX_DTYPE))})
        w.depth -= 1

    def emit_box() -> None:
        if separable:
            for d in range(first, i):
                lo, hi = box.get(vars_[d], (0, shape[d] - 1))
                _open_loop(w, em.name(vars_[d]), f"{lo}, {hi + 1}", d == par)
            _emit_separable(w, em, split, vars_, shape, body)
        else:
            box_loops(first, (), {})
        em.hoisted.clear()
        w.depth = level

    if separable:
        emit_box()
    # the points outside the box, but for the columns; lone points (a plane's corners) whose
    # gathers are constant taps share one loop over tables of their taps
    around = [r for r in split.outside if not is_column(r[0])]
    points = _tabled_points(around, vars_[first:], em)
    tabled = {id(region) for region, _ in points}
    regions([r for r in around if id(r[0]) not in tabled], False)
    if points:
        _emit_tabled_points(w, em, points, vars_[first:], body)
        w.depth = level
    if not split.outside and any(box[vars_[d]] != (0, shape[d] - 1) for d in dims):
        # no regions: the general gathers run outside the box, where the last box dimension runs the
        # spans below and above it if the outer ones are inside it, else its whole extent
        _full_loops(w, em, vars_, shape, range(first, last), par, lambda: None)
        n, (lo, hi) = shape[last], box[vars_[last]]
        around = f"((0, {lo}), ({hi + 1}, {n}))"
        outer = [f"{box[vars_[d]][0]} <= {em.name(vars_[d])} <= {box[vars_[d]][1]}" for d in dims if d < last]
        w.line(f"spans = {around} if {' and '.join(outer)} else ((0, {n}), ({n}, {n}))" if outer else
               f"spans = {around}")
        w.line("for span in spans:")
        w.depth += 1
        _open_loop(w, em.name(vars_[last]), "span[0], span[1]", False)
        _full_loops(w, em, vars_, shape, range(last + 1, len(vars_)), par, lambda: body(gathers))
        w.depth = level
    if not separable:
        emit_box()
    w.depth = depth


MAX_SEPARABLE_TEMP = 1 << 18  # elements of a separable window's ring of rows: its rows stay in cache


def _ring_rows(split) -> int:
    """The rows of a separable window's temporary: a ring of a power of two, at least the source
    rows one output row reads, so that a row's slot is `row & (ring - 1)`."""
    offsets = [r for r, _ in split.separable.rows]
    return 1 << (max(offsets) - min(offsets)).bit_length()


def _emit_separable(w: Writer, em: Emitter, split, vars_, shape, body) -> None:
    """The box's last two dimensions (i, j) as two passes of the Separable window: each source
    row it reads, filtered along j into a ring of rows, then, per output row, the ring's rows
    summed along i. Each output row filters only the source rows the previous one did not read,
    so the ring stays in L1 and each source row is read from memory once (one temporary for the
    whole plane, then a second pass over it, ran bilinear's gradient 15% slower)."""
    sep = split.separable
    (i, j), dtype = vars_[-2:], sep.src.dtype
    (lo_i, hi_i), (lo_j, hi_j) = (split.box.get(v, (0, n - 1)) for v, n in zip((i, j), shape[-2:], strict=True))
    first_row = min(r for r, _ in sep.rows)
    span = max(r for r, _ in sep.rows) - first_row + 1
    fresh = min(sep.row_stride, span)  # the rows an output row reads that the one before did not
    mask = _ring_rows(split) - 1
    tmp, k = w.temp("window"), Var("row")

    def affine(coeffs: dict[Var, int], c: int = 0) -> Expr:
        return Affine.of(coeffs, c).to_expr()

    column = em.expr(affine({j: 1}, -lo_j))
    lead = sep.src.index[:-2]
    source_row = affine({k: 1}, sep.row_stride * lo_i + first_row)  # row k of the ring's numbering
    taps = [(em.expr(replace(sep.src, index=lead + (source_row, affine({j: sep.col_stride}, c)))), weight)
            for c, weight in sep.cols]

    w.line(f"# separable window: {len(sep.rows)} rows x {len(sep.cols)} columns, rows first")
    w.line(f"{tmp} = np.empty(({mask + 1}, {hi_j - lo_j + 1}), np.{dtype})")
    _open_loop(w, em.name(i), f"{lo_i}, {hi_i + 1}", False)
    first = -sep.row_stride * lo_i  # output row i reads ring rows row_stride * i + first ... + span - 1
    start, stop = (em.expr(affine({i: sep.row_stride}, first + n)) for n in (span - fresh, span))
    if span > fresh:  # the first output row filters all its rows (one loop: numba compiles the body once)
        start = f"0 if {em.name(i)} == {lo_i} else {start}"
    _open_loop(w, em.name(k), f"{start}, {stop}", False)
    _open_loop(w, em.name(j), f"{lo_j}, {hi_j + 1}", False)
    w.line(f"{tmp}[{em.name(k)} & {mask}, {column}] = {' + '.join(_weighted_sums(em, taps, dtype))}")
    w.depth -= 2
    _open_loop(w, em.name(j), f"{lo_j}, {hi_j + 1}", False)
    ring_row = {r: em.expr(affine({i: sep.row_stride}, first + r - first_row)) for r, _ in sep.rows}
    body([], terms=[(f"{tmp}[{ring_row[r]} & {mask}, {column}]", weight) for r, weight in sep.rows],
         terms_dtype=dtype)
    w.depth -= 2


def _box_ranges(vars_, shape, split) -> dict[Var, tuple[int, int]]:
    """Inclusive ranges of the gather variables and the phase variables inside the box."""
    ranges = {v: split.box.get(v, (0, n - 1)) for v, n in zip(vars_, shape, strict=True)}
    for j, stride, q in zip(split.phased, split.strides, split.phase_vars, strict=True):
        lo, hi = split.box[j]
        ranges[q] = (lo // stride, (hi + 1) // stride - 1)
    return ranges


def _hoist_loads(w: Writer, em: Emitter, gathers, ranges, written: str) -> None:
    """Read once, at the top of the iteration, every load of the phases that depends only on the
    loop variables and is in range for all of them (so reading it even where a guard fails is
    safe). Without this, a store between two phases makes LLVM read again and not vectorize.
    An index that two of them share is computed once, before them: numba's compile time grows
    with every operation, and an edge of a bilinear gradient reads 12 loads at 4 columns."""
    em.hoisted.clear()
    chosen: dict[Load, None] = {}
    for g in gathers:
        for piece in g.pieces:
            inner = {r.var for r in piece.loops}
            for e in [piece.value, *(c for level in piece.guards for c in level)]:
                for n in walk(e):
                    if (isinstance(n, Load) and n not in chosen and n.buffer != written and n.index
                            and not any(isinstance(m, Var) and m in inner for i in n.index for m in walk(i))
                            and all(_within(i, em.shapes[n.buffer][d], ranges) for d, i in enumerate(n.index))):
                        chosen[n] = None
    shared = collections.Counter(i for n in chosen for i in dict.fromkeys(n.index) if isinstance(i, Bin))
    for i in (i for i, count in shared.items() if count > 1):
        name = f"ix{len(em.hoisted)}"
        w.line(f"{name} = {em.expr(i)}")
        em.hoisted[i] = name
    for k, n in enumerate(chosen):
        w.line(f"h{k} = {em.index(n.buffer, n.index, n.buffer)}")
        em.hoisted[n] = f"h{k}"


def _within(e: Expr, n: int, ranges) -> bool:
    if checked_at_run_time(e):
        return False
    span = interval(e, ranges)
    return span is not None and 0 <= span[0] and span[1] < n


def _full_loops(w: Writer, em: Emitter, vars_, shape, dims, par, inner) -> None:
    """Open a loop over the whole extent of each of `dims`, run `inner`, and stay nested."""
    for d in dims:
        _open_loop(w, em.name(vars_[d]), f"0, {shape[d]}", d == par)
    inner()


def _tabled_points(regions, dims, em: Emitter) -> list:
    """(region, its taps) for the regions among `regions` that are single points in `dims` and
    whose gathers are only constant times loads of one buffer at one leading index, the rest
    constants (the corners of a bilinear gradient's planes: 9 taps each). Two or more such run
    as one loop over tables of their taps: a specialized copy of the body per corner cost numba
    as much to compile as an edge's loop. Empty unless there are two."""
    points = []
    for region, gs in regions:
        if not all(region[v][0] == region[v][1] for v in dims if v in region) or not gs:
            continue
        taps = _constant_taps(gs)
        if taps is not None:
            points.append((region, taps))
    heads = {(t[0].buffer, t[0].index[:t[1]], t[0].dtype, t[1]) for _, taps in points for t in taps[:1]}
    if len(points) < 2 or len(heads) != 1 or next(iter(heads))[0] in em.staged:
        return []
    return points


def _constant_taps(gs) -> list[tuple[Load, int, float]] | None:
    """(load, where its constant indices start, weight) for each load the gathers read, or None
    unless every piece is unguarded, loop-free, a constant times one load, and every load's index
    is the same leading expressions (no run-time check among them), then constants."""
    taps = []
    for g in gs:
        for p in g.pieces:
            f = None if p.loops or any(p.guards) else factors(p.value)
            if f is None or len(f[0]) != 1:
                return None
            (load,), scale = f
            lead = len(load.index)
            while lead and isinstance(load.index[lead - 1], Const):
                lead -= 1
            if (lead == len(load.index) or load.dtype != dtype_of(p.value)
                    or any(checked_at_run_time(e) for e in load.index[:lead])):
                return None
            taps.append((load, lead, scale))
    if not taps or len({(t[0].buffer, t[0].index[:t[1]], t[1]) for t in taps}) != 1:
        return None
    weights: dict[Load, float] = {}  # a load read by several gathers is one tap
    for load, _, scale in taps:
        weights[load] = weights.get(load, 0.0) + scale
    return [(load, taps[0][1], scale) for load, scale in weights.items()]


def _emit_tabled_points(w: Writer, em: Emitter, points, dims, body) -> None:
    """One loop over the points (`_tabled_points`): each point's position, and its taps'
    constant indices and weights, read from module-level tables; `body` stores the sum."""
    per_point = [taps for _, taps in points]
    load, lead, _ = per_point[0][0]
    width = max(len(taps) for taps in per_point)
    at = [v for v in dims if v in points[0][0]]
    where = em.table([[region[v][0] for v in at] for region, _ in points], "int64")
    tail = len(load.index) - lead
    # rows padded to the longest; a point runs only its own count of taps (a padding tap at weight
    # 0 would still turn an inf it read into nan)
    index = em.table([[[e.value for e in t[0].index[lead:]] for t in taps] + [[0] * tail] * (width - len(taps))
                      for taps in per_point], "int64")
    weight = em.table([[t[2] for t in taps] + [0.0] * (width - len(taps)) for taps in per_point], load.dtype)
    count = em.table([len(taps) for taps in per_point], "int64")
    w.line(f"for point in range({len(points)}):")
    w.depth += 1
    for k, v in enumerate(at):
        w.line(f"{em.name(v)} = {where}[point, {k}]")
    w.line(f"taps = {em.const(0, load.dtype)}")
    w.line(f"for tap in range({count}[point]):")
    lead_text = [em.expr(e) for e in load.index[:lead]]
    rest = [f"{index}[point, tap, {k}]" for k in range(tail)]
    w.line(f"    taps += {load.buffer}[{', '.join(lead_text + rest)}] * {weight}[point, tap]")
    em.used.setdefault(load.buffer, None)
    body([], terms=[("taps", 1.0)], terms_dtype=load.dtype)


def _weighted_sums(em: Emitter, terms: list[tuple[str, float]], dtype: str) -> list[str]:
    """`sum(text * weight)` as one sum per weight, its terms added before the weight multiplies
    them (`(h1 + h2 + h6) * f32_2`): numba's compile time grows with every operation. A term
    whose text is empty is its weight alone."""
    by_weight: dict[float, list[str]] = {}
    sums = []
    for text, weight in terms:
        if text:
            by_weight.setdefault(weight, []).append(text)
        else:
            sums.append(em.const(weight, dtype))
    for weight, texts in by_weight.items():
        total = texts[0] if len(texts) == 1 else f"({' + '.join(texts)})"
        sums.append(total if weight == 1 else f"{total} * {em.const(weight, dtype)}")
    return sums


def _emit_gather(w: Writer, em: Emitter, g, like: dict[tuple[Load, ...], float], dtype: str,
                 acc_dtype: str) -> None:
    """The gather's pieces, but those read unconditionally as a constant times loads of `dtype`:
    these go into `like`, the constant summed per product of loads, which the caller emits once
    (`h4 * f32_1 * f32_2 + h4 * f32_1 * f32_1` is one product and one add: a region of a
    bilinear gradient reads each load in up to four gathers, and numba's compile time grows with
    every operation). A long innermost loop adds into LANES partial sums (`_piece_lane`)."""
    _describe(w, g)
    for piece in g.pieces:
        product = None if piece.loops or any(piece.guards) else factors(piece.value)
        if product is not None and all(x.dtype == dtype for x in product[0]):
            key = tuple(sorted(product[0], key=show))
            like[key] = like.get(key, 0.0) + product[1]
            continue
        depth, lane = w.depth, _piece_lane(piece)
        for level, guards in enumerate(piece.guards):
            if level > 0:
                loop = piece.loops[level - 1]
                if piece.single and piece.single[level - 1]:  # at most one point: no loop
                    w.line(f"{em.name(loop.var)} = {em.expr(loop.lo)}")
                    w.line(f"if {em.name(loop.var)} < {em.expr(loop.hi)}:")
                else:
                    w.line(f"for {em.name(loop.var)} in range({em.expr(loop.lo)}, {em.expr(loop.hi)}):")
                w.depth += 1
            if guards:
                w.line(f"if {' and '.join(em.expr(c) for c in guards)}:")
                w.depth += 1
            if level == len(piece.loops) - 1 and lane is not None:
                _emit_lanes(w, em, piece, acc_dtype)
                break
        else:
            w.line(f"acc += {em.expr(piece.value)}")
        w.depth = depth


def _piece_lane(piece) -> Range | None:
    """A piece's innermost loop, where it adds into LANES partial sums (`_lane_var`'s reasons):
    constant bounds, at least two rounds, no guard inside it, reads stepping by one with it.
    The adjoint of a sum over a row (softmax's, layer norm's) ran as one chain of dependent
    float64 adds, 2-3x slower than the bandwidth allows."""
    if not piece.loops or piece.guards[-1] or (piece.single and piece.single[-1]):
        return None
    loop = piece.loops[-1]
    lo, hi = _constant(loop.lo), _constant(loop.hi)
    if lo is None or hi is None or hi - lo < 2 * LANES:
        return None
    return loop if _unit_stride(piece.value, loop.var) else None


def _constant(e) -> int | None:
    return e if isinstance(e, int) else e.value if isinstance(e, Const) else None


def _emit_lanes(w: Writer, em: Emitter, piece, acc_dtype: str) -> None:
    """`acc +=` the piece's innermost loop (`_piece_lane`), as LANES partial sums combined in a
    fixed tree, then the loop's remainder: deterministic, the split depends on the extent only."""
    loop = piece.loops[-1]
    lo, hi = _constant(loop.lo), _constant(loop.hi)
    whole = lo + (hi - lo) // LANES * LANES
    lanes = [f"acc_lane{q}" for q in range(LANES)]
    for name in lanes:
        w.line(f"{name} = {em.const(0, acc_dtype)}")
    _lane_rounds(w, em, loop.var, lo, whole, piece.value, lanes, lambda name, value: f"{name} += {value}")
    w.line(f"acc += {_pairwise(lanes, '+')}")
    if whole < hi:
        with w.block(f"for {em.name(loop.var)} in range({whole}, {hi}):"):
            w.line(f"acc += {em.expr(piece.value)}")


def _gather_terms(gathers, shape: tuple[int, ...]) -> float:
    """How many terms the gathers add per element on average: their scatters' points over the
    adjoint's elements (a bias's gradient sums a whole batch per element, a pooling window's a
    few)."""
    return sum(math.prod(r.hi - r.lo for r in g.scatter.domain) for g in gathers) / max(1, math.prod(shape))


def _wide_gathers(gs, adj) -> bool:
    """Whether the gathers' sum accumulates in float64 (`accumulator_dtype`)."""
    return accumulator_dtype("sum", adj.dtype, _gather_terms(gs, adj.shape)) != adj.dtype


def _gathers_by_rows(vars_, shape, gathers) -> bool:
    """Whether an adjoint's windows run with its last variable's loop innermost
    (`_emit_row_gathers`): the windows' reads walk memory with that variable, none with a window
    variable, no guard and no window bound depends on it. A layer norm's gain gradient,
    `adj_g[j] += adj_y[i, j] * xhat[i, j]` over i, walked every column across 4096 rows."""
    if not vars_ or shape[-1] < 2:
        return False
    last, pieces = vars_[-1], [p for g in gathers for p in g.pieces]
    windows = [p for p in pieces if p.loops]
    if not windows or any(c for p in pieces for level in p.guards for c in level):
        return False
    if any(isinstance(b, Expr) and last in free_vars(b) for p in windows for loop in p.loops
           for b in (loop.lo, loop.hi)):
        return False
    return any(_unit_stride(p.value, last) for p in windows) and not any(
        n.index and free_vars(n.index[-1]) & {loop.var for loop in p.loops}
        for p in windows for n in walk(p.value) if isinstance(n, Load))


def _emit_row_gathers(w: Writer, em: Emitter, plan, gathers, name: str) -> None:
    """An adjoint's rows, one at a time: the cotangent and the terms without a window, then each
    window's loops with the row's loop inside them, so that every read walks memory in order.
    Each element adds its terms in the same order as one element at a time would. A float64
    accumulator is a row of its own, else the adjoint's row accumulates in place."""
    adj, vars_, shape = plan.adjoint, plan.new_vars, plan.adjoint.shape
    pieces, outer = [p for g in gathers for p in g.pieces], w.depth
    dtype = "float64" if _wide_gathers(gathers, adj) else adj.dtype
    k, n = em.name(vars_[-1]), shape[-1]
    store = em.index(name, vars_, name)
    row = None if dtype == adj.dtype else w.temp("row")
    terms = _gather_terms(gathers, shape) * n
    columns = f"0, {n}"
    blocks = _column_blocks(shape, terms)
    if blocks is None:
        acc = store if row is None else f"{row}[{k}]"
        _open_rows(w, em, vars_, shape, _parallel_dim(shape[:-1], terms), row, dtype)
    else:  # a 1-D adjoint (a gain's or a bias's): blocks of columns in parallel
        block, lo = -(-n // blocks), w.temp("col")
        _open_loop(w, f"{lo}_block", f"0, {blocks}", True)
        w.line(f"{lo} = {lo}_block * {block}")
        columns = f"{lo}, min({lo} + {block}, {n})"
        if row is not None:
            w.line(f"{row} = np.empty({block}, np.{dtype})")
        acc = store if row is None else f"{row}[{k} - {lo}]"
    first = [em.index("ct_" + adj.buffer, vars_, name)] if adj.seeded else []
    first += [em.expr(p.value) for p in pieces if not p.loops]
    with w.block(f"for {k} in range({columns}):"):
        w.line(f"{acc} = {' + '.join(first) if first else em.const(0, adj.dtype)}")
    for g in gathers:
        _describe(w, g)
        for p in g.pieces:
            if not p.loops:
                continue
            depth = w.depth
            for loop in p.loops:
                w.line(f"for {em.name(loop.var)} in range({em.expr(loop.lo)}, {em.expr(loop.hi)}):")
                w.depth += 1
            with w.block(f"for {k} in range({columns}):"):
                w.line(f"{acc} = {acc} + {em.expr(p.value)}")
            w.depth = depth
    if row is not None:
        with w.block(f"for {k} in range({columns}):"):
            w.line(f"{store} = {acc}")
    w.depth = outer


COLUMN_BLOCK = 128  # the fewest columns a thread takes of a 1-D adjoint run a row at a time
COLUMN_BLOCKS = 16  # the most blocks it splits into (parallel_for hands them to the threads)


def _column_blocks(shape: tuple[int, ...], terms: float) -> int | None:
    """How many blocks of columns a 1-D adjoint run a row at a time splits into, to run in
    parallel; None for serial (short, or not 1-D: those run in parallel over their rows). Each
    column adds its terms in the same order either way, so the bits do not change. A layer
    norm's gain gradient (4096 rows of 1024) ran on one thread."""
    if len(shape) != 1 or shape[0] < 2 * COLUMN_BLOCK or terms < _parallel_min_points():
        return None
    return min(shape[0] // COLUMN_BLOCK, COLUMN_BLOCKS)


def _describe(w: Writer, c) -> None:
    """A comment naming contribution `c` (a Gather or a Fallback): its form, scatter and source."""
    s = c.scatter
    w.line(f"# {c.form}: adj_{s.buffer}[{', '.join(map(show, s.index))}] += {show(s.value)}"
           + (f"  ({s.loc})" if s.loc else ""))


def _emit_scatter(w: Writer, em: Emitter, f, adj_name: str) -> None:
    s = f.scatter
    _describe(w, f)
    w.line(f"# kept as a scatter: {f.reason}")
    depth = w.depth
    order = sorted(s.domain, key=lambda r: r.var != f.parallel)
    for r in order:
        _open_loop(w, em.name(r.var), f"{r.lo}, {r.hi}", r.var == f.parallel)
    if s.where is not None:
        w.line(f"if {em.expr(s.where)}:")
        w.depth += 1
    w.line(f"{em.index(adj_name, s.index, str(s.loc))} += {em.expr(s.value)}")
    w.depth = depth
