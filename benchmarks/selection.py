"""Which cases run: each case by its name, and the groups by theirs.

* `kernels`: the stencil, convolution, pooling, resampling and dense gradients (`benchmarks.cases`);
* `everyday`: what a user meets first (issue 26): elementwise math, softmax, layer norm and a small
  layer (`benchmarks.everyday`), dispatch and a training step (`benchmarks.calls`), and the first
  call on empty caches (`benchmarks.warm_start.measure_cold`);
* `checkpoint`: the peak memory of a deep pipeline's gradient step with and without `hd.checkpoint`
  (`benchmarks.checkpoint`), reported in the notes.
* `chunked`: a blur on a dask array, chunked, against the whole array and dask-image (issue 30,
  `benchmarks.chunked`).
* `hvp`: the Hessian-vector product of a clamped-stencil energy against one gradient, forward over
  reverse and reverse over reverse, against JAX and PyTorch (issue 28, `benchmarks.hvp`).
* `updates`: a histogram, a linear recurrence and a bilateral-grid splat, update definitions
  (issue 29, `benchmarks.updates`), in the everyday table.
* `first_calls`: the first forward and backward of each kernel case on empty caches, a fresh
  process per library (`benchmarks.warm_start.measure_cold`), named `first_<case>`.
"""
from __future__ import annotations

from collections.abc import Sequence

from benchmarks.calls import CALL_CASES, CallCase
from benchmarks.cases import CASES, Case
from benchmarks.checkpoint import CHECKPOINT, CheckpointCase
from benchmarks.chunked import CHUNKED_BLUR, ChunkedCase
from benchmarks.everyday import EVERYDAY_CASES, FIRST_CALL, FirstCall
from benchmarks.hvp import HVP, HvpCase
from benchmarks.updates import UPDATE_CASES, UpdateCase

AnyCase = Case | CallCase | FirstCall | CheckpointCase | ChunkedCase | HvpCase | UpdateCase

FIRST_CALLS = tuple(FirstCall(name=f"first_{case.name}", case=case,
                              description=f"the first forward + backward of `{case.name}` ({case.description}), "
                              "in a fresh process per library with empty caches")
                    for case in CASES)
GROUPS: dict[str, tuple[AnyCase, ...]] = {
    "kernels": CASES,
    "everyday": (*EVERYDAY_CASES, *CALL_CASES, FIRST_CALL),
    "checkpoint": (CHECKPOINT,),
    "chunked": (CHUNKED_BLUR,),
    "hvp": (HVP,),
    "updates": UPDATE_CASES,
    "first_calls": FIRST_CALLS,
}
ALL: tuple[AnyCase, ...] = tuple(case for group in GROUPS.values() for case in group)
BY_NAME: dict[str, AnyCase] = {case.name: case for case in ALL}


def select(names: Sequence[str] | None) -> list[AnyCase]:
    """The cases with the given names or in the given groups, in the given order, each once; all
    cases for None."""
    if names is None:
        return list(ALL)
    unknown = [n for n in names if n not in BY_NAME and n not in GROUPS]
    if unknown:
        raise ValueError(f"unknown case(s) {', '.join(unknown)}; choose from the groups "
                         f"{', '.join(GROUPS)} or the cases {', '.join(BY_NAME)}")
    chosen = [c for n in names for c in (GROUPS[n] if n in GROUPS else (BY_NAME[n],))]
    return list({c.name: c for c in chosen}.values())


def select_vjp_cases(names: Sequence[str]) -> list[Case]:
    """The `Case`s (timed as forward and vjp) among `select(names)`."""
    return [c for c in select(names) if isinstance(c, Case)]
