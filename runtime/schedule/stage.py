"""stage_planes: two adjoints run a plane at a time together, the first one's plane kept in a
local array that the second reads while it is in cache, instead of a buffer written out and read
back (the maxpool gradient that a blur's gradient reads, in a blur -> relu -> maxpool pipeline).
runtime/kernels.py opens the shared loops and builds both nests inside them, which the pass
`stage_plane` (schedule/staging.py) rewrites to keep the plane in the local. The first computes
only the part of its plane that the second reads (`read_box`, `clip_split`;
HALIDE_AD_SKIP=read_box computes the whole plane; HALIDE_AD_SKIP=stage_plane stages none)."""
from __future__ import annotations

import math
from dataclasses import replace

from halide_ad import config
from halide_ad.affine import linear_form
from halide_ad.ir import Load, Var, adjoint_name
from halide_ad.solver.bounds import checked_at_run_time
from halide_ad.runtime.schedule.boundary import Box, Split, cut_dims, piece_exprs
from halide_ad.runtime.schedule.driver import decision
from halide_ad.runtime.schedule.parallel import parallel_dim
from halide_ad.runtime.schedule.rows import gathers_by_rows
from halide_ad.traverse import walk

MAX_STAGE = 1 << 18  # elements of a staged adjoint's plane, per thread: L2-sized


@decision()
def stage_depth(computed, splits, gathers, k: int, private: frozenset[str]) -> int:
    """How many leading dimensions adjoint k and the next one of `computed` (AdjointPlans, each
    with its Split and its Gathers at the same position of `splits` and `gathers`) can loop over
    together, running one plane of each per iteration; 0 where they cannot. Adjoint k must be
    read by the next one only (`private`), the next one must read it at its own leading
    variables, and both loop nests must leave those dimensions whole."""
    if k + 1 >= len(computed) or config.skipped("stage_plane"):
        return 0
    producer, consumer = computed[k], computed[k + 1]
    name = adjoint_name(producer.adjoint.buffer)
    shape = consumer.adjoint.shape
    if name not in private or any(len(p.contributions) != len(g) for p, g in zip(computed[k:k + 2], gathers[k:k + 2])):
        return 0  # a fallback scatter runs as a loop nest of its own
    depth = min(_whole_dims(p, s) for p, s in zip(computed[k:k + 2], splits[k:k + 2], strict=True))
    par = parallel_dim(shape)  # (depth is -1 for a 0-d adjoint)
    if (depth <= 0 or par is not None and par >= depth or producer.adjoint.shape[:depth] != shape[:depth]
            or parallel_dim(producer.adjoint.shape) != par or math.prod(producer.adjoint.shape[depth:]) > MAX_STAGE):
        return 0
    loads = _loads(gathers[k + 1], {name})
    if not loads or not _at_own_planes(loads, consumer, depth):
        return 0
    return depth


@decision(lambda group: f"{group[0]} adjoint(s) over {group[1]} dimension(s)")
def row_group(computed, splits, gathers, terms, k: int, private: frozenset[str]) -> tuple[int, int]:
    """(n, depth): adjoints k, ..., k + n - 1 of `computed` run in one loop nest over their
    leading `depth` dimensions, the last of them the parallel one, each iteration computing a
    plane of each in order (a pair that `stage_depth` stages as one unit, its loops over the
    dimensions past `depth` inside); (0, 0) where fewer than two units would. `terms[m]` is
    adjoint m's gathers' terms per element. A member has gathers only, the parallel dimension
    its own loop nest would have (or none, too small alone to run in parallel: softmax's
    per-row adj_softmax_sum), the first member's extents in the leading dimensions and a
    nest that leaves them whole, and it reads the members before it only in the plane the same
    iteration computed. softmax's gradient: adj_softmax_sum, then the staged pair adj_softmax_exp
    and adj_x, a row of each per iteration, instead of two passes over the rows."""
    first = computed[k]
    par = parallel_dim(first.adjoint.shape, terms[k])
    if par is None:
        return 0, 0
    depth, lead = par + 1, first.adjoint.shape[:par + 1]
    written: set[str] = set()
    units, m = 0, k
    while m < len(computed):
        staged = stage_depth(computed, splits, gathers, m, private)
        if 0 < staged < depth:
            break
        unit = range(m, m + (2 if staged else 1))
        if not all(_joins(computed[i], splits[i], gathers[i], terms[i], depth, lead, written) for i in unit):
            break
        written |= {adjoint_name(computed[i].adjoint.buffer) for i in unit}
        units, m = units + 1, unit.stop
    return (m - k, depth) if units >= 2 else (0, 0)


def _joins(plan, split, gathers, terms: float, depth: int, lead: tuple[int, ...], written: set[str]) -> bool:
    shape = plan.adjoint.shape
    return (len(plan.contributions) == len(gathers) and shape[:depth] == lead
            and parallel_dim(shape, terms) in (depth - 1, None) and _whole_dims(plan, split) >= depth
            and not (split is None and gathers_by_rows(plan.new_vars, shape, gathers))
            and _at_own_planes(_loads(gathers, written), plan, depth))


def _whole_dims(plan, split) -> int:
    """How many leading dimensions adjoint `plan`'s loop nest leaves whole (a separable window's
    two passes need a plane)."""
    shape = plan.adjoint.shape
    return min([len(shape) - (1 if split is None or split.separable is None else 2)]
               + cut_dims(plan.new_vars, shape, split)[:1])


def _loads(gathers, buffers) -> list[Load]:
    """The gathers' reads of `buffers`."""
    return [n for g in gathers for p in g.pieces for e in piece_exprs(p) for n in walk(e)
            if isinstance(n, Load) and n.buffer in buffers]


def _at_own_planes(loads: list[Load], plan, depth: int) -> bool:
    """Whether each of `loads` reads the plane of adjoint `plan`'s leading `depth` variables."""
    return all(n.index[:depth] == plan.new_vars[:depth] and not any(map(checked_at_run_time, n.index))
               for n in loads)


@decision()
def read_box(producer, consumer, gathers, depth: int) -> Box | None:
    """The part of a staged producer's plane that the consumer's `gathers` read, as inclusive
    ranges of the producer's variables past `depth`, where each read's index there is one of the
    consumer's variables plus a constant (a zero padding's adjoint read at `j + 1`); None where
    they read it all, or otherwise."""
    if config.skipped("read_box"):
        return None
    shape, ranges = producer.adjoint.shape, {}
    for n in _loads(gathers, {adjoint_name(producer.adjoint.buffer)}):
        for d in range(depth, len(shape)):
            form = linear_form(n.index[d])
            if form is None or len(form[0]) != 1 or next(iter(form[0].items()))[1] != 1:
                return None
            (v, _), c = next(iter(form[0].items())), form[1]
            if v not in consumer.new_vars:
                return None
            lo, hi = c, consumer.adjoint.shape[consumer.new_vars.index(v)] - 1 + c
            old = ranges.get(producer.new_vars[d], (lo, hi))
            ranges[producer.new_vars[d]] = (max(0, min(lo, old[0])), min(shape[d] - 1, max(hi, old[1])))
    full = {v: (0, shape[d] - 1) for d, v in enumerate(producer.new_vars) if d >= depth}
    return ranges if ranges and ranges != full else None


def clip_split(split: Split | None, vars_: tuple[Var, ...], shape, read: Box) -> Split | None:
    """`split` with its box and regions cut to the `read` box, the regions left empty dropped;
    None where the nest is not one that the box and its regions cover (phases, a separable
    window, no regions) or a dimension `read` cuts is not one the box cuts."""
    if (split is None or split.phased or split.separable is not None or not split.outside
            or not {vars_.index(v) for v in read} <= set(cut_dims(vars_, shape, split))):
        return None

    def cut(box: Box) -> Box | None:
        out = dict(box)
        for v, (lo, hi) in read.items():
            a, b = box.get(v, (0, shape[vars_.index(v)] - 1))
            out[v] = (max(a, lo), min(b, hi))
        return None if any(lo > hi for lo, hi in out.values()) else out

    box = cut(split.box)
    if box is None:
        return None
    return replace(split, box=box, outside=tuple((r, gs) for region, gs in split.outside if (r := cut(region))))
