"""The machine's limits, measured in the same run as the cases, and each case's lower bound.

* Copy bandwidth: the faster of a parallel numba copy and numpy's copy between two 1 GiB float32
  arrays, counting the bytes read plus the bytes written (as STREAM's copy does).
* SGEMM rate: the faster of torch (when installed, with the benchmark's thread count) and numpy
  on float32 2048x2048 @ 2048x2048, counting 2 n^3 FLOPs.

A memory-bound case's bound is its minimal traffic over the copy bandwidth, a contraction's its
FLOPs over the SGEMM rate (see `Cost`).
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Literal

import numba
import numpy as np

from benchmarks.timing import measure

Shape = tuple[int, ...]
FLOAT32_BYTES = 4

FULL_COPY_BYTES = 1 << 30
SMALL_COPY_BYTES = 1 << 26
FULL_GEMM_N = 2048
SMALL_GEMM_N = 512


@dataclass(frozen=True, slots=True)
class Cost:
    """The work a backward pass cannot avoid: bytes moved (`memory`) or FLOPs (`compute`)."""

    kind: Literal["memory", "compute"]
    amount: float


CostModel = Callable[[Sequence[Shape], Shape], Cost]


def memory_bound(*, needed: tuple[int, ...] = ()) -> CostModel:
    """Backward traffic: read the cotangent and the inputs at positions `needed` (those the
    gradient depends on: none for a linear map), and write one gradient per input."""

    def cost(input_shapes: Sequence[Shape], out_shape: Shape) -> Cost:
        elements = math.prod(out_shape)
        elements += sum(math.prod(input_shapes[i]) for i in needed)
        elements += sum(math.prod(shape) for shape in input_shapes)
        return Cost("memory", elements * FLOAT32_BYTES)

    return cost


def contraction(forward_flops: Callable[[Sequence[Shape], Shape], int]) -> CostModel:
    """Backward FLOPs of a bilinear contraction: one contraction as large as the forward's per
    input (dx = ct . w and dw = x . ct for y = x . w)."""

    def cost(input_shapes: Sequence[Shape], out_shape: Shape) -> Cost:
        return Cost("compute", 2 * forward_flops(input_shapes, out_shape))

    return cost


def forward_cost(input_shapes: Sequence[Shape], out_shape: Shape, backward_cost: Cost) -> Cost:
    """The forward pass's counterpart of a case's backward `Cost`: read the inputs and write the
    output where the backward is memory-bound; one contraction (half the backward's two) for a
    contraction."""
    if backward_cost.kind == "compute":
        return Cost("compute", backward_cost.amount / 2)
    elements = math.prod(out_shape) + sum(math.prod(shape) for shape in input_shapes)
    return Cost("memory", elements * FLOAT32_BYTES)


@dataclass(frozen=True, slots=True)
class Rate:
    """The best of several ways to do one thing, in units per second, and which way won."""

    value: float
    method: str
    by_method: dict[str, float]


@dataclass(frozen=True, slots=True)
class MachineBounds:
    copy_bandwidth: Rate  # bytes per second
    sgemm: Rate  # FLOP per second

    def lower_bound_ms(self, cost: Cost) -> float:
        rate = self.copy_bandwidth if cost.kind == "memory" else self.sgemm
        return cost.amount / rate.value * 1e3


@numba.njit(parallel=True, cache=True)
def _parallel_copy(src: np.ndarray, dst: np.ndarray) -> None:
    for i in numba.prange(src.size):
        dst[i] = src[i]


def _best(rates: dict[str, float]) -> Rate:
    method = max(rates, key=rates.__getitem__)
    return Rate(rates[method], method, rates)


def measure_copy_bandwidth(nbytes: int, repeat: int) -> Rate:
    """Bytes read plus written per second by a copy of `nbytes`, into an already faulted-in
    destination (the warm-up call touches it)."""
    src = np.ones(nbytes // 4, dtype=np.float32)
    dst = np.empty_like(src)
    copies: dict[str, Callable[[], object]] = {
        "numba prange": lambda: _parallel_copy(src, dst),
        "numpy": lambda: np.copyto(dst, src),
    }
    return _best({
        name: 2 * nbytes / (measure(copy, repeat).median_ms * 1e-3) for name, copy in copies.items()
    })


def measure_sgemm(n: int, repeat: int, *, torch_module: ModuleType | None = None) -> Rate:
    """FLOP per second of an n x n x n float32 matrix product, by numpy and optionally torch."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    products: dict[str, Callable[[], object]] = {"numpy": lambda: a @ b}
    if torch_module is not None:
        ta, tb = torch_module.from_numpy(a), torch_module.from_numpy(b)
        products["torch"] = lambda: torch_module.mm(ta, tb)
    return _best({
        name: 2 * n**3 / (measure(product, repeat).median_ms * 1e-3)
        for name, product in products.items()
    })


def measure_machine(
    repeat: int, *, small: bool, torch_module: ModuleType | None = None
) -> MachineBounds:
    """Copy bandwidth and SGEMM rate; `small` shrinks both problems for a quick smoke run."""
    copy_bytes = SMALL_COPY_BYTES if small else FULL_COPY_BYTES
    gemm_n = SMALL_GEMM_N if small else FULL_GEMM_N
    return MachineBounds(
        copy_bandwidth=measure_copy_bandwidth(copy_bytes, repeat),
        sgemm=measure_sgemm(gemm_n, repeat, torch_module=torch_module),
    )
