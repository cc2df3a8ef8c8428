"""The driver, a table of contents of the passes:

    trace (Python -> IR) -> reverse_mode (IR -> scatters) -> solver.invert (-> gathers or a
    proven-safe scatter) -> runtime.codegen (-> Python source) -> numba -> run
"""
from __future__ import annotations

import os
from dataclasses import dataclass, replace

import numpy as np

from halide_ad.ad import Adjoint, reverse_mode
from halide_ad.errors import BoundsError, ShapeError
from halide_ad.ir import Program, Reduce, Var, adjoint_name, argindex_name, is_float
from halide_ad.runtime.codegen import emit_backward, emit_forward
from halide_ad.runtime.compile import compile_kernel
from halide_ad.runtime.contract import Contraction, contraction
from halide_ad.solver import Fallback, Gather, invert


@dataclass(frozen=True)
class AdjointPlan:
    """adj_<buffer>[new_vars] = cotangent + the sum of `contributions`, each inverted."""
    adjoint: Adjoint
    new_vars: tuple[Var, ...]
    contributions: tuple[Gather | Fallback, ...]


@dataclass
class NumbaStep:
    """A compiled numba function over named buffers."""
    fn: object
    params: list[str]
    checks: list[str]

    def __call__(self, buffers: dict[str, np.ndarray]) -> None:
        status = np.zeros(3, np.int64)
        self.fn(*(buffers[p] for p in self.params), status)
        if status[0]:
            raise BoundsError(self.checks[status[1]].replace("{value}", str(status[2])))


@dataclass
class ContractionStep:
    """`out` = (zeros, its cotangent, or what the kernels before wrote) + BLAS contractions."""
    out: str
    init: str  # "zeros", "ct_<name>" or "kernel"
    contractions: tuple[Contraction, ...]

    def __call__(self, buffers: dict[str, np.ndarray]) -> None:
        if self.init == "zeros":
            buffers[self.out].fill(0)
        elif self.init != "kernel":
            np.copyto(buffers[self.out], buffers[self.init].reshape(buffers[self.out].shape))
        for c in self.contractions:
            c.accumulate(buffers)


@dataclass
class Kernel:
    """The steps that fill a program's buffers (numba loop nests and BLAS contractions), and the
    source `hd.explain` shows."""
    steps: list
    source: str

    def __call__(self, buffers: dict[str, np.ndarray]) -> None:
        for step in self.steps:
            step(buffers)


def _dump(stage: str, text: str) -> None:
    if stage in os.environ.get("HALIDE_AD_DUMP", "").split(","):
        print(text)


def _numba_step(source: str, params: list[str], checks: list[str], entry: str, title: str) -> NumbaStep:
    _dump("source", source)
    return NumbaStep(compile_kernel(source, entry, title), params, checks)


def _shapes(program: Program) -> dict[str, tuple[int, ...]]:
    shapes = {b.name: b.shape for b in program.inputs} | {f.name: f.shape for f in program.funcs}
    return shapes | {adjoint_name(n): sh for n, sh in shapes.items()}


def compile_forward(program: Program) -> Kernel:
    """Consecutive loop-nest stages share one numba function; contractions run between them."""
    steps, sources, segment = [], [], []
    shapes = _shapes(program)

    def flush():
        if segment:
            entry = f"forward{len(sources)}" if len(sources) or len(segment) < len(program.funcs) else "forward"
            source, params, checks = emit_forward(program, tuple(segment), entry)
            steps.append(_numba_step(source, params, checks, entry, f"forward of {program.name}"))
            sources.append(source)
            segment.clear()

    for f in program.funcs:
        c = _func_contraction(f, shapes)
        if c is None:
            segment.append(f)
            continue
        flush()
        steps.append(ContractionStep(f.name, "zeros", (c,)))
        sources.append(f"# {f.name} by BLAS: {c.formula}\n")
    flush()
    return Kernel(steps, "\n".join(sources))


def _func_contraction(f, shapes) -> Contraction | None:
    if not (isinstance(f.body, Reduce) and f.body.op == "sum" and is_float(f.dtype)):
        return None
    return contraction(f.name, f.vars, f.body.body, f.domain + f.body.rvars, f.body.where, shapes)


def plan_gradient(program: Program, wrt: tuple[str, ...]) -> list[AdjointPlan]:
    plans = []
    shapes = _shapes(program)
    for adj in reverse_mode(program, wrt):
        new_vars = _gather_vars(adj)
        contributions = []
        for s in adj.scatters:
            inverse = invert(s, adj.shape, new_vars)
            c = contraction(adjoint_name(s.buffer), s.index, s.value, s.domain, s.where, shapes)
            if c is not None and isinstance(inverse, Gather):  # BLAS computes the same gather
                contributions.append(replace(c, inverse=inverse))
            else:
                contributions.append(inverse)
        plans.append(AdjointPlan(adj, new_vars, tuple(contributions)))
    return plans


def _gather_vars(adj: Adjoint) -> tuple[Var, ...]:
    """j (or j0, j1, ...): one per dimension, never the name of a variable the scatters use."""
    taken = {r.var.name for s in adj.scatters for r in s.domain}
    names = ["j"] if len(adj.shape) == 1 else [f"j{d}" for d in range(len(adj.shape))]
    out = []
    for n in names:
        while n in taken:
            n += "_"
        out.append(Var(n))
    return tuple(out)


def compile_gradient(program: Program, wrt: tuple[str, ...]) -> tuple[Kernel, list[AdjointPlan]]:
    """Loop-nest adjoints share numba functions; an adjoint with BLAS contributions ends one, and
    its contractions are added after the loop nest has written the rest."""
    plans = plan_gradient(program, wrt)
    steps, sources, segment = [], [], []

    def flush():
        if any(p.contributions for p in segment):
            entry = f"backward{len(sources)}"
            source, params, checks = emit_backward(program, list(segment), entry)
            steps.append(_numba_step(source, params, checks, entry, f"gradient of {program.name}"))
            sources.append(source)
        segment.clear()

    for plan in plans:
        blas = tuple(c for c in plan.contributions if isinstance(c, Contraction))
        if not blas:
            segment.append(plan)
            continue
        rest = replace(plan, contributions=tuple(c for c in plan.contributions if not isinstance(c, Contraction)))
        if rest.contributions:
            segment.append(rest)
            init = "kernel"
        else:
            init = "ct_" + plan.adjoint.buffer if plan.adjoint.seeded else "zeros"
        flush()
        steps.append(ContractionStep(adjoint_name(plan.adjoint.buffer), init, blas))
        sources.append("".join(f"# {c.formula}  (BLAS, {len(c.taps) and 'per tap of ' + ', '.join(t.var.name for t in c.taps) or 'one call'})\n" for c in blas))
    flush()
    return Kernel(steps, "\n".join(sources)), plans


def allocate(shape: tuple[int, ...], dtype: str, *, zero: bool = False) -> np.ndarray:
    """Kernels see 0-d buffers as shape (1,)."""
    try:
        return (np.zeros if zero else np.empty)(shape or (1,), dtype)
    except MemoryError:
        size = np.dtype(dtype).itemsize * int(np.prod(shape, dtype=object))
        raise ShapeError(f"a buffer of shape {shape} and dtype {dtype} needs {size / 2**30:.3g} GiB, more "
                         "than this machine can allocate; shrink the program's sizes") from None


def run_forward(program: Program, kernel: Kernel, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    buffers = {name: (a.reshape(1) if a.ndim == 0 else a) for name, a in inputs.items()}
    for f in program.funcs:
        buffers[f.name] = allocate(f.shape, f.dtype)
        if f.keeps_argindex:
            buffers[argindex_name(f.name)] = allocate(f.shape, f.argindex_dtype)
    kernel(buffers)
    return buffers


def run_backward(kernel: Kernel, plans: list[AdjointPlan], buffers: dict[str, np.ndarray],
                 cotangents: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Adjoint buffers by name; `cotangents` are keyed by output name."""
    buffers = dict(buffers)
    for plan in plans:
        adj = plan.adjoint
        name = adjoint_name(adj.buffer)
        ct = cotangents.get(adj.buffer)
        if ct is not None and ct.ndim == 0:
            ct = ct.reshape(1)
        if plan.contributions:
            buffers[name] = allocate(adj.shape, adj.dtype)
            if adj.seeded:
                buffers["ct_" + adj.buffer] = ct
        else:
            buffers[name] = ct if adj.seeded else allocate(adj.shape, adj.dtype, zero=True)
    kernel(buffers)
    return {plan.adjoint.buffer: buffers[adjoint_name(plan.adjoint.buffer)] for plan in plans}
