"""The driver, a table of contents of the passes:

    trace (Python -> IR) -> reverse_mode (IR -> scatters) -> solver.invert (-> gathers or a
    proven-safe scatter) -> runtime.codegen (-> Python source) -> numba -> run
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from halide_ad.ad import Adjoint, reverse_mode
from halide_ad.errors import BoundsError
from halide_ad.ir import Program, Var, adjoint_name, argindex_name
from halide_ad.runtime.codegen import emit_backward, emit_forward
from halide_ad.runtime.compile import compile_kernel
from halide_ad.solver import Fallback, Gather, invert


@dataclass(frozen=True)
class AdjointPlan:
    """adj_<buffer>[new_vars] = cotangent + the sum of `contributions`, each inverted."""
    adjoint: Adjoint
    new_vars: tuple[Var, ...]
    contributions: tuple[Gather | Fallback, ...]


@dataclass
class Kernel:
    """A compiled numba function over named buffers, with its source for `hd.explain`."""
    fn: object
    source: str
    params: list[str]
    checks: list[str]

    def __call__(self, buffers: dict[str, np.ndarray]) -> None:
        status = np.zeros(3, np.int64)
        self.fn(*(buffers[p] for p in self.params), status)
        if status[0]:
            raise BoundsError(f"a data-dependent index was {status[2]}, outside {self.checks[status[1]]}. "
                              "Clamp the index (hd.clamp) or fix the index data.")


def _dump(stage: str, text: str) -> None:
    if stage in os.environ.get("HALIDE_AD_DUMP", "").split(","):
        print(text)


def compile_forward(program: Program) -> Kernel:
    source, params, checks = emit_forward(program)
    _dump("source", source)
    return Kernel(compile_kernel(source, "forward", f"forward of {program.name}"), source, params, checks)


def plan_gradient(program: Program, wrt: tuple[str, ...]) -> list[AdjointPlan]:
    plans = []
    for adj in reverse_mode(program, wrt):
        new_vars = _gather_vars(adj)
        plans.append(AdjointPlan(adj, new_vars, tuple(invert(s, adj.shape, new_vars) for s in adj.scatters)))
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
    plans = plan_gradient(program, wrt)
    source, params, checks = emit_backward(program, plans)
    _dump("source", source)
    return Kernel(compile_kernel(source, "backward", f"gradient of {program.name}"), source, params, checks), plans


def allocate(shape: tuple[int, ...], dtype: str, *, zero: bool = False) -> np.ndarray:
    """Kernels see 0-d buffers as shape (1,)."""
    return (np.zeros if zero else np.empty)(shape or (1,), dtype)


def run_forward(program: Program, kernel: Kernel, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    buffers = {name: (a.reshape(1) if a.ndim == 0 else a) for name, a in inputs.items()}
    for f in program.funcs:
        buffers[f.name] = allocate(f.shape, f.dtype)
        if f.keeps_argindex:
            buffers[argindex_name(f.name)] = allocate(f.shape, "int64")
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
