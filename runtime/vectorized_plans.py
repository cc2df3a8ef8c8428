"""The interpreter tier's plans (`vectorized.py` runs by them, `vectorized_cost.py` counts by
them): which variables of a Func or scatter loop in Python, which split into phases, which
factors einsum contracts, and the pieces a domain is cut into and run on the threads."""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

from halide_ad.ir import Bin, Const, Expr, Load, Op, Range, Var, dtype_of
from halide_ad.runtime import reference
from halide_ad.runtime.parallel import one_blas_thread
from halide_ad.runtime.parallel import parallel_for as run_parallel
from halide_ad.traverse import free_vars, walk

CHUNK = 1 << 19  # points of a piece of a Func or scatter (numpy's temporaries of 2 MiB in float32)
PHASES_MAX = 16  # the largest k of a `// k` or `% k` that splits its variable into phases


@dataclass(frozen=True, slots=True)
class Axis:
    """The values of a variable along its axis: start + step * t for t < count."""
    start: int
    step: int
    count: int

    def values(self) -> np.ndarray:
        return self.start + self.step * np.arange(self.count, dtype=np.int64)


def index_dims(exprs) -> list[Expr]:
    """Every index of every Load in `exprs` (a scatter's target index included by the caller)."""
    return [i for e in exprs if e is not None for n in walk(e) if isinstance(n, Load) for i in n.index]


def looped_vars(dims: list[Expr], free: dict[Var, int], candidates) -> set[Var]:
    """The `candidates` to loop over so that no index depends on two varying variables: in each
    index that does, the candidate of fewest values (`free`: each varying variable's count)."""
    looped: set[Var] = set()
    for d in dims:
        varying = [v for v in free_vars(d) if v in free and v not in looped]
        choice = [v for v in varying if v in candidates]
        if len(varying) > 1 and choice:
            looped.add(min(choice, key=lambda v: (free[v], v.name)))
    return looped


def phases(exprs, free: set[Var]) -> dict[Var, int]:
    """{variable: k} for the `free` variables under a `// k` or `% k` (k a constant, the lcm of several)."""
    split: dict[Var, int] = {}
    for e in exprs:
        if e is None:
            continue
        for n in walk(e):
            if isinstance(n, Bin) and n.op in (Op.FLOORDIV, Op.MOD) and isinstance(n.rhs, Const) \
                    and isinstance(n.rhs.value, int) and 2 <= n.rhs.value <= PHASES_MAX:
                for v in free_vars(n.lhs) & free:
                    split[v] = math.lcm(split.get(v, 1), n.rhs.value)
    return {v: k for v, k in split.items() if k <= PHASES_MAX}


def split(ranges: tuple[Range, ...], phases: dict[Var, int]):
    """The axes of each combination of phases of `ranges`."""
    choices = []
    for r in ranges:
        lo, n = r.lo, reference._extent(r)
        k = phases.get(r.var, 1)
        choices.append([Axis(lo + p, k, -(-(n - p) // k)) for p in range(min(k, n))])
    for combo in itertools.product(*choices):
        yield {r.var: a for r, a in zip(ranges, combo, strict=True)}


def chunks(axes: dict[Var, Axis], along: tuple[Var, ...], counted) -> list[dict[Var, Axis]]:
    """`axes` cut along the first of `along` that has several values, into pieces of about CHUNK
    points of the `counted` variables (a result's: summed ones go to BLAS whole): numpy's
    temporaries then stay in cache, and pieces can run on two threads."""
    total = math.prod(axes[v].count for v in counted if v in axes)
    v = next((v for v in along if axes[v].count > 1), None)
    if v is None or total <= CHUNK:
        return [axes]
    a = axes[v]
    rows = max(1, CHUNK * a.count // total)
    return [axes | {v: Axis(a.start + a.step * t, a.step, min(rows, a.count - t))} for t in range(0, a.count, rows)]


def each(body, pieces: list, parallel: bool) -> None:
    """body(piece) for each piece, on the kernels' threads where `parallel` (pieces that write
    disjoint elements). BLAS runs on one thread in each: OpenBLAS's own threads spin, and on a
    busy machine a convolution's weight gradient took 1.5 s instead of 2 ms."""
    with one_blas_thread():
        if parallel and len(pieces) > 1:
            run_parallel(lambda lo, hi: [body(p) for p in pieces[lo:hi]], 0, len(pieces))
        else:
            for p in pieces:
                body(p)


def points(looped: list[Range]):
    return (dict(zip((r.var for r in looped), p, strict=True))
            for p in itertools.product(*(range(r.lo, r.hi) for r in looped)))


def product_factors(e: Expr, dtype: str) -> list[Expr]:
    """The factors of a product chain computed in `dtype`."""
    if isinstance(e, Bin) and e.op == Op.MUL and dtype_of(e) == dtype:
        return product_factors(e.lhs, dtype) + product_factors(e.rhs, dtype)
    return [e]


__all__ = ["CHUNK", "Axis", "chunks", "each", "index_dims", "looped_vars", "phases", "points", "product_factors",
           "split"]
