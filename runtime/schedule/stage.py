"""stage_planes: two adjoints run a plane at a time together, the first one's plane kept in a
local array that the second reads while it is in cache, instead of a buffer written out and read
back (the maxpool gradient that a blur's gradient reads, in a blur -> relu -> maxpool pipeline).
runtime/kernels.py opens the shared loops and prints both nests inside them."""
from __future__ import annotations

import math

from halide_ad.ir import Load, adjoint_name
from halide_ad.solver.bounds import checked_at_run_time
from halide_ad.runtime.schedule.boundary import cut_dims, piece_exprs
from halide_ad.runtime.schedule.parallel import parallel_dim
from halide_ad.traverse import walk

MAX_STAGE = 1 << 18  # elements of a staged adjoint's plane, per thread: L2-sized


def stage_depth(computed, splits, gathers, k: int, private: frozenset[str]) -> int:
    """How many leading dimensions adjoint k and the next one of `computed` (AdjointPlans, each
    with its Split and its Gathers at the same position of `splits` and `gathers`) can loop over
    together, running one plane of each per iteration; 0 where they cannot. Adjoint k must be
    read by the next one only (`private`), the next one must read it at its own leading
    variables, and both loop nests must leave those dimensions whole."""
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
                   for d in cut_dims(p.new_vars, p.adjoint.shape, s)[:1]])
    par = parallel_dim(shape)  # (depth is -1 for a 0-d adjoint)
    if (depth <= 0 or par is not None and par >= depth or producer.adjoint.shape[:depth] != shape[:depth]
            or parallel_dim(producer.adjoint.shape) != par or math.prod(producer.adjoint.shape[depth:]) > MAX_STAGE):
        return 0
    loads = [n for g in gathers[k + 1] for p in g.pieces for e in piece_exprs(p) for n in walk(e)
             if isinstance(n, Load) and n.buffer == name]
    if not loads or any(n.index[:depth] != consumer.new_vars[:depth] or any(map(checked_at_run_time, n.index))
                        for n in loads):
        return 0
    return depth
