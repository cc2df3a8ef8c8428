"""Tracing state: what one `@hd.func` trace has built so far (thread-local, so threads can trace)."""
from __future__ import annotations

import builtins
import itertools
import keyword
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field

from halide_ad import ir
from halide_ad.errors import TraceError, user_loc


@dataclass
class TraceState:
    name: str
    inputs: list[ir.Buffer] = field(default_factory=list)
    funcs: list[ir.Func] = field(default_factory=list)
    names: set[str] = field(default_factory=set)
    var_ranges: dict[ir.Var, ir.Range] = field(default_factory=dict)
    reduction_vars: set[ir.Var] = field(default_factory=set)
    rdom_where: dict[ir.Var, ir.Expr] = field(default_factory=dict)  # rvar -> its rdom's predicate
    update_vars: set[ir.Var] = field(default_factory=set)  # hd.var()s: pure variables of update definitions
    compute_vars: tuple[ir.Var, ...] | None = None  # pure vars of the hd.compute being traced
    named: list[str] = field(default_factory=list)  # Funcs the user named (hd.compute's name=)
    checkpoints: list[tuple[str, ...]] = field(default_factory=list)  # the Funcs of each hd.checkpoint call
    counter: itertools.count = field(default_factory=itertools.count)
    root: object = None  # the function being traced, where captured arrays are looked for
    captured: dict = field(default_factory=dict)  # id(array) -> its record (halide_ad/capture.py)
    overrides: list[ir.Override] = field(default_factory=list)  # custom rules (halide_ad/custom.py)
    custom_jvps: dict = field(default_factory=dict)  # output Func -> its custom_jvp call (custom.py)

    def fresh_name(self, base: str, loop_var: bool = False) -> str:
        """A Python identifier, unique in this trace, that reads like `base`. Buffers avoid the
        names generated kernels use; loop variables need not (the code generator renames them)."""
        base = "".join(ch if ch.isalnum() or ch == "_" else "_" for ch in base) or "f"
        if base[0].isdigit() or keyword.iskeyword(base) or (base in _GENERATED_CODE_NAMES and not loop_var):
            base = "f_" + base
        name, k = base, 1
        while name in self.names:
            name, k = f"{base}_{k}", k + 1
        self.names.add(name)
        return name

    def buffer(self, name: str) -> ir.Buffer:
        for b in self.inputs:
            if b.name == name:
                return b
        for f in self.funcs:
            if f.name == name:
                return f.buffer
        raise KeyError(name)


# Names that generated kernels use for themselves, so no buffer may take them.
_GENERATED_CODE_NAMES = set(vars(builtins)) | {
    "np", "math", "numba", "njit", "prange", "parallel_for", "kernel", "checked", "status", "acc", "arg", "val",
    "start", "stop", "forward", "backward", "branchless"}

_local = threading.local()


def current() -> TraceState | None:
    stack = getattr(_local, "stack", None)
    return stack[-1] if stack else None


def require(what: str) -> TraceState:
    state = current()
    if state is None:
        raise TraceError(f"{what} can only be used inside a function traced by halide_ad "
                         "(decorate it with @hd.func, or pass it to hd.grad/hd.vjp)", user_loc())
    return state


@contextmanager
def tracing(state: TraceState):
    stack = getattr(_local, "stack", None)
    if stack is None:
        stack = _local.stack = []
    stack.append(state)
    try:
        yield state
    finally:
        stack.pop()
