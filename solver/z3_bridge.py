"""IR -> z3, and the three-valued queries the solver asks. The only module that imports z3.

z3 spells integer division `/`, and it matches Python's `//` and `%` only for positive divisors;
any other divisor is refused (Unsupported), never guessed.
"""
from __future__ import annotations

import atexit
import threading
import weakref
from collections.abc import Iterable
from dataclasses import dataclass

import z3

from halide_ad import config
from halide_ad.ir import RUN_TIME_CHECKED, Bin, Call, Cast, Const, Expr, Load, Op, Select, Var, dtype_of, show
from halide_ad.traverse import free_vars, walk

DEFAULT_TIMEOUT_MS = config.z3_timeout_ms()  # per query
Z3_VERSION = z3.get_version_string()

_unknown_lock = threading.Lock()
_unknown_answers = 0


def unknown_answers() -> int:
    """How many queries in this process (any thread) have answered 'unknown' so far: a result
    that saw one depended on a time limit, so the inverter does not store it on disk."""
    return _unknown_answers


class Unsupported(Exception):
    """The expression has no exact z3 counterpart (floats, a non-constant divisor, ...)."""


_local = threading.local()
_contexts: weakref.WeakSet = weakref.WeakSet()  # every thread's, for _leave_contexts_to_the_os


@atexit.register
def _leave_contexts_to_the_os() -> None:
    """Skip deleting the z3 contexts at exit: z3 spun in ast_manager's destructor for minutes
    while the interpreter shut down after a test run; the process's memory goes back anyway."""
    for context in list(_contexts):
        context.owner = False


def _context() -> z3.Context:
    """This thread's z3 context (a context may not be shared across threads). Creating and
    deleting one per query took 4 ms: 40% of the bilinear gradient's solving."""
    if not hasattr(_local, "context"):
        _local.context = z3.Context()
        # Python's garbage collector frees a cycle's z3 objects in whichever thread collects (a
        # background compile's, while this thread solves): their dec_refs must not race this
        # context's work, which segfaulted or hung (tests/solver/test_z3_threads.py)
        z3.Z3_enable_concurrent_dec_ref(_local.context.ref())
        _contexts.add(_local.context)
        # z3's default solver first picks a strategy for the query's logic; for these small
        # linear queries with div, mod and uninterpreted loads, its SMT core alone gave the same
        # answers 2.6x as fast (the benchmark cases' 520 queries: 1.17 s against 0.45 s)
        _local.tactic = z3.Tactic("smt", ctx=_local.context)
    return _local.context


@dataclass
class Query:
    """A z3 solver of its own, with an Int per Var; integer Loads are uninterpreted functions."""
    timeout_ms: int | None = None  # None: DEFAULT_TIMEOUT_MS, read when the query is made

    def __post_init__(self):
        if self.timeout_ms is None:
            self.timeout_ms = DEFAULT_TIMEOUT_MS
        self.ctx = _context()
        self.solver = _local.tactic.solver()
        self.solver.set(timeout=self.timeout_ms)
        self.vars: dict[Var, z3.ArithRef] = {}
        self.functions: dict[str, z3.FuncDeclRef] = {}

    def var(self, v: Var, suffix: str = "") -> z3.ArithRef:
        key = Var(v.name + suffix) if suffix else v
        if key not in self.vars:
            self.vars[key] = z3.Int(key.name, self.ctx)
        return self.vars[key]

    def add(self, *constraints) -> None:
        self.solver.add(*constraints)

    def either(self, *conditions):
        return z3.Or(*conditions)

    def refute(self, claims: list) -> str:
        """'unsat' when every claim holds under the constraints added so far."""
        if not claims:
            return "unsat"
        self.solver.add(z3.Or(*(z3.Not(c) for c in claims)))
        return self.check()

    def check(self) -> str:
        """'sat', 'unsat' or 'unknown'."""
        answer = str(self.solver.check())
        if answer == "unknown":
            global _unknown_answers
            with _unknown_lock:
                _unknown_answers += 1
        return answer

    def model_values(self, names: Iterable[Var]) -> dict[str, int]:
        model = self.solver.model()
        return {v.name: model.eval(self.vars[v], model_completion=True).as_long()
                for v in names if v in self.vars}

    def _opaque(self, v: Expr, go):
        """An integer computed from float data (`int(floor(v[n, h, w]))`, as grid_sample does) is an
        uninterpreted function of the loop variables it reads at: the same point gives the same
        value, and nothing else is assumed, so the disjoint writes of a batch or channel loop still
        prove."""
        points = sorted(free_vars(v), key=lambda x: x.name)
        name = f"int_of_{show(v)}"
        if name not in self.functions:
            sorts = [z3.IntSort(self.ctx)] * (len(points) + 1)
            self.functions[name] = z3.Function(f"int_of_{len(self.functions)}", *sorts)
        return self.functions[name](*(go(p) for p in points))

    def to_z3(self, e: Expr, rename: dict[Var, z3.ArithRef] | None = None):
        rename = rename or {}

        def go(n: Expr):
            match n:
                case Const(v, "bool"):
                    return z3.BoolVal(bool(v), self.ctx)
                case Const(v, dtype) if not dtype.startswith("float"):
                    return z3.IntVal(int(v), self.ctx)
                case Var():
                    return rename[n] if n in rename else self.var(n)
                case Bin(Op.ADD, a, b):
                    return go(a) + go(b)
                case Bin(Op.SUB, a, b):
                    return go(a) - go(b)
                case Bin(Op.MUL, a, b):
                    return go(a) * go(b)
                case Bin(Op.FLOORDIV | Op.MOD as op, a, Const(k)) if isinstance(k, int) and k > 0:
                    return go(a) / k if op is Op.FLOORDIV else go(a) % k
                case Bin(Op.MIN, a, b):
                    x, y = go(a), go(b)
                    return z3.If(x <= y, x, y)
                case Bin(Op.MAX, a, b):
                    x, y = go(a), go(b)
                    return z3.If(x >= y, x, y)
                case Bin(Op.EQ, a, b):
                    return go(a) == go(b)
                case Bin(Op.NE, a, b):
                    return go(a) != go(b)
                case Bin(Op.LT, a, b):
                    return go(a) < go(b)
                case Bin(Op.LE, a, b):
                    return go(a) <= go(b)
                case Bin(Op.GT, a, b):
                    return go(a) > go(b)
                case Bin(Op.GE, a, b):
                    return go(a) >= go(b)
                case Bin(Op.AND, a, b):
                    return z3.And(go(a), go(b))
                case Bin(Op.OR, a, b):
                    return z3.Or(go(a), go(b))
                case Call("not", (a,)):
                    return z3.Not(go(a))
                case Call("neg", (a,)):
                    return -go(a)
                case Call(fn, (a,)) if fn == RUN_TIME_CHECKED:
                    return go(a)
                case Call("abs", (a,)):
                    x = go(a)
                    return z3.If(x >= 0, x, -x)
                case Select(c, t, f):
                    return z3.If(go(c), go(t), go(f))
                case Cast(dtype, v) if not dtype.startswith("float") and not dtype_of(v).startswith("float"):
                    return go(v)
                case Cast(dtype, v) if not dtype.startswith("float") and any(isinstance(x, Load) for x in walk(v)):
                    return self._opaque(v, go)
                case Load(buffer, index, dtype) if not dtype.startswith("float") and dtype != "bool":
                    if buffer not in self.functions:
                        sorts = [z3.IntSort(self.ctx)] * (len(index) + 1)
                        self.functions[buffer] = z3.Function(f"load_{buffer}", *sorts)
                    return self.functions[buffer](*(go(i) for i in index))
            raise Unsupported(f"no exact integer meaning in z3 for `{n}`")

        return go(e)
