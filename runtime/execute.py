"""Running compiled programs: the steps a kernel is made of (numba functions over named buffers,
BLAS contractions), and the runs that allocate a call's buffers and hand them to the steps."""
from __future__ import annotations

import functools
import math
import operator
from dataclasses import dataclass

import numpy as np

from halide_ad.errors import BoundsError, ShapeError
from halide_ad.ir import Buffer, Program, adjoint_name, argindex_name
from halide_ad.runtime.buffers import MIN_POOLED_BYTES, pool
from halide_ad.runtime.contract import Contraction
from halide_ad.runtime.parallel import SMALL_MATMUL, blas_on_calling_thread, one_blas_thread
from halide_ad.runtime.plans import AdjointPlan


NO_STATUS = np.zeros(3, np.int64)  # for steps without checks: no kernel writes it


@dataclass
class NumbaStep:
    """A compiled numba function over named buffers."""
    fn: object
    params: list[str]
    checks: list[str]

    def __post_init__(self):
        self._args = _getter(self.params)

    def __call__(self, buffers: dict[str, np.ndarray]) -> None:
        if not self.checks:  # `status` is written only by the `checked` reads that checks describe
            self.fn(*self._args(buffers), NO_STATUS)
            return
        status = np.zeros(3, np.int64)
        self.fn(*self._args(buffers), status)
        if status[0]:
            raise BoundsError(self.checks[status[1]].replace("{value}", str(status[2])))


def _getter(names: list[str]):
    """buffers -> (buffers[name] for name in names), as a tuple."""
    if len(names) == 1:
        return lambda buffers, name=names[0]: (buffers[name],)
    return operator.itemgetter(*names) if names else lambda buffers: ()


@dataclass
class ContractionStep:
    """`out` = (zeros, its cotangent, or what the kernels before wrote) + BLAS contractions."""
    out: str
    init: str  # "zeros", "ct_<name>" or "kernel"
    contractions: tuple[Contraction, ...]

    def __call__(self, buffers: dict[str, np.ndarray]) -> None:
        if self.init not in ("zeros", "kernel"):
            np.copyto(buffers[self.out], buffers[self.init].reshape(buffers[self.out].shape))
        for k, c in enumerate(self.contractions):
            c.accumulate(buffers, assign=self.init == "zeros" and k == 0)


@dataclass
class Kernel:
    """The steps that fill a program's buffers (numba loop nests and BLAS contractions), and the
    source `hd.explain` shows."""
    steps: list
    source: str
    scratch: tuple[Buffer, ...] = ()  # buffers of its own, not the program's

    def __call__(self, buffers: dict[str, np.ndarray]) -> None:
        if self.small_products:
            with one_blas_thread():
                for step in self.steps:
                    step(buffers)
            return
        for step in self.steps:
            step(buffers)

    @functools.cached_property
    def small_products(self) -> bool:
        """Whether its steps include BLAS contractions and every one is small enough that BLAS
        runs it on the calling thread (`parallel.matmul`): the kernel then holds BLAS there for
        all of its steps, not product by product. Each switch back wakes OpenBLAS's threads: a
        training step's nine products paid up to ~40 us apiece for it on a busy machine. Not
        where BLAS keeps every one on the calling thread by itself (`blas_on_calling_thread`)."""
        sizes = [math.prod(r.extent for r in c.domain)
                 for step in self.steps if isinstance(step, ContractionStep) for c in step.contractions]
        return bool(sizes) and max(sizes) < SMALL_MATMUL and not blas_on_calling_thread(max(sizes))

    @functools.cached_property
    def _buffers(self) -> frozenset[str]:
        return frozenset(name for step in self.steps for name in (
            step.params if isinstance(step, NumbaStep) else
            [step.out] + [step.init] * (step.init not in ("zeros", "kernel"))
            + [x.buffer for c in step.contractions for x in c.loads]))

    def buffers(self) -> frozenset[str]:
        """The buffers its steps read or write."""
        return self._buffers

    def extents(self) -> tuple[str, ...] | None:
        """The extents its numba steps read at run time (`x.shape[0]`), where they serve other
        sizes of the program too (runtime/extents.py); None where every step is this size's own."""
        shared = [step.fn.extents for step in self.steps if getattr(getattr(step, "fn", None), "extents", None) is not None]
        return None if not shared else tuple(dict.fromkeys(r for reads in shared for r in reads))

    def compiled(self) -> bool:
        """Whether its steps run without compiling first (see `halide_ad/tiered.py`)."""
        return all(getattr(step.fn, "ready", lambda: True)() for step in self.steps if isinstance(step, NumbaStep))


def allocate(shape: tuple[int, ...], dtype: str, *, zero: bool = False) -> np.ndarray:
    """Kernels see 0-d buffers as shape (1,). Big uninitialized ones may be recycled (see
    runtime/buffers.py)."""
    try:
        return np.zeros(shape or (1,), dtype) if zero else pool.empty(shape or (1,), dtype)
    except MemoryError:
        size = np.dtype(dtype).itemsize * int(np.prod(shape, dtype=object))
        raise ShapeError(f"a buffer of shape {shape} and dtype {dtype} needs {size / 2**30:.3g} GiB, more "
                         "than this machine can allocate; shrink the program's sizes") from None


class Allocation:
    """A buffer a run allocates, `allocate(shape, dtype, zero=zero)`: plain np.empty where it is
    too small for the pool to keep (the same array, without the pool's checks per call)."""

    __slots__ = ("name", "shape", "dtype", "zero", "small")

    def __init__(self, name: str, shape: tuple[int, ...], dtype: str, *, zero: bool = False):
        self.name, self.shape, self.dtype, self.zero = name, shape, np.dtype(dtype), zero
        self.small = not zero and self.dtype.itemsize * math.prod(shape) < MIN_POOLED_BYTES

    def __call__(self) -> np.ndarray:
        if self.small:
            return np.empty(self.shape or (1,), self.dtype)
        return allocate(self.shape, self.dtype, zero=self.zero)


class ForwardRun:
    """`run_forward` for one program and its kernel, with what they fix worked out once: the 0-d
    inputs (kernels see shape (1,)) and the buffers to allocate. A cached call pays for the
    allocations and the kernel, and nothing else."""

    def __init__(self, program: Program, kernel: Kernel):
        stored = kernel.buffers()  # not the Funcs it computes where they are read
        allocations = []
        for f in program.funcs:
            if f.name not in stored:
                continue
            allocations.append(Allocation(f.name, f.shape, f.dtype))
            if f.keeps_argindex:
                allocations.append(Allocation(argindex_name(f.name), f.shape, f.argindex_dtype))
        allocations += [Allocation(b.name, b.shape, b.dtype) for b in kernel.scratch]
        self.kernel = kernel
        self.scalars = tuple(b.name for b in program.inputs if b.shape == ())
        self.allocations = tuple(allocations)

    def __call__(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        buffers = dict(inputs)
        for name in self.scalars:
            buffers[name] = buffers[name].reshape(1)
        for a in self.allocations:
            buffers[a.name] = a()
        self.kernel(buffers)
        return buffers


def run_forward(program: Program, kernel: Kernel, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return ForwardRun(program, kernel)(inputs)


class BackwardRun:
    """`run_backward` for one gradient kernel and its plans, with what they fix worked out once:
    which adjoints are allocated (zeroed where nothing contributes), which are the cotangents."""

    def __init__(self, kernel: Kernel, plans: list[AdjointPlan]):
        used = kernel.buffers()
        fills = []  # (buffer name, the output whose cotangent it is, or an Allocation), in plan order
        results = []
        for plan in plans:
            if plan.inlined:
                continue
            adj = plan.adjoint
            name = adjoint_name(adj.buffer)
            results.append((adj.buffer, name))
            if plan.contributions:
                if name in used:  # else a kernel keeps it one plane at a time (runtime/schedule/stage.py)
                    fills.append((name, Allocation(name, adj.shape, adj.dtype)))
                if adj.seeded:
                    fills.append(("ct_" + adj.buffer, adj.buffer))
            else:
                fills.append((name, adj.buffer if adj.seeded else
                              Allocation(name, adj.shape, adj.dtype, zero=True)))
        fills += [(b.name, Allocation(b.name, b.shape, b.dtype)) for b in kernel.scratch]  # (column_parts)
        self.kernel = kernel
        self.plans = plans
        self.fills = tuple(fills)
        self.results = tuple(results)

    def __call__(self, buffers: dict[str, np.ndarray], cotangents: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        buffers = dict(buffers)
        for name, fill in self.fills:
            if isinstance(fill, str):
                ct = cotangents.get(fill)
                buffers[name] = ct.reshape(1) if ct is not None and ct.ndim == 0 else ct
            else:
                buffers[name] = fill()
        self.kernel(buffers)
        return {buffer: buffers[name] for buffer, name in self.results if name in buffers}


def run_backward(kernel: Kernel, plans: list[AdjointPlan], buffers: dict[str, np.ndarray],
                 cotangents: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Adjoint buffers by name; `cotangents` are keyed by output name."""
    return BackwardRun(kernel, plans)(buffers, cotangents)
