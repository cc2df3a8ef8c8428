"""Schedule passes: pure Loops -> Loops rewrites of the nests runtime/lower.py builds, one per file,
and the schedule decisions that the gather loop nests (runtime/gathers.py) follow while they build
their nests.

Passes, in the order the forward reductions run them (runtime/kernels.py):
* `parallel.py`, `choose_parallel`: which loop of a nest runs in parallel (`parallel_dim`); also
  on a gradient's gather nest that has no box, phases or separable window.
* `rows.py`, `interchange_rows`: a reduction whose reads walk the output's last dimension runs a
  row at a time, that loop inside the reduction's.
* `accumulate.py`, `split_accumulators`: a long reduction or gather window over a contiguous
  axis as LANES partial results (also for the gathers' pieces).
* `fuse_rows.py`, `fuse_rows`: then, over the kernel's nests, consecutive nests that share buffers
  only at their outer loop's row as one loop over the rows.
* `regions.py`, `split_box`: a gather loop nest's plain nest (around a `loops.Point` of its
  general gathers) as its box's and its regions' nests, each around a Point of its own gathers.
* `tap_rows.py`, `tap_rows`: a gather loop nest's box whose windows read along its last
  dimension (`taps_by_rows`) runs a row at a time: its last loop as a loop over the row of Points
  of each point's first terms, then each window's loops around a loop over the row adding one
  tap to all of it.
* `columns.py`, `edge_columns`: a gather loop nest's regions beside its box in the last
  dimension only (a plane's edge columns) run inside the box's loop over the dimension before it.
* `strided.py`, `phases`: the box's strided dimensions in phases j = stride*q + p, each phase's
  `loops.Point` stored at its j and reading the loads its phases share, once per q.
* `separable.py`, `separable`: a gather loop nest's box whose window is separable
  (`separable_window`): its last two loops as two passes over a ring of rows, each point a
  `loops.Point` of the ring's rows (`gathers.expand_points` builds the points' statements).
* `corners.py`, `tabled_points`: a gather loop nest's lone points whose gathers are constant
  taps (`points_to_table` of the regions' `loops.Point`s) run as one loop over tables, after its
  other regions.
* `hoist.py`, `hoist_loads`: then, as each region's Point is built (`gathers.expand_points`),
  its iteration reads the loads it can once, at its top (the phases of a box's iteration share
  theirs, `phases`: HALIDE_AD_SKIP=hoist_loads leaves those out too).
* `spans.py`, `outside_box`: a gather loop nest's box without regions around it: the plain nest
  (around a Point of the general gathers, built after) runs only at the points outside the box
  (`loops.Spans`), before the box's own nest.
* `staging.py`, `stage_plane`: a staged pair's nests (`stage_depth`) with the first adjoint's
  plane kept in a local array (HALIDE_AD_SKIP=stage_plane stages no pair).
* `row_sums.py`, `fuse_row_sums`: a row group's consecutive row sums, their terms written by one
  loop over the row (terms with a math function, which a fold does not compute), each row folded
  where it was.
* `fuse_folds.py`, `fuse_folds`: then a row group's consecutive lane folds over the same rows
  (layer norm's gradient's ct * g * (x - m) and ct * g) as one pass over the rows
  (`lanes.sums_of_all`), each fold's terms in the same order.

Decisions, pure functions of the IR, each tested on data:
* `boundary.py`, `interior`: a gather loop nest's interior box, the regions around it and the
  phases of a strided dimension, and its separable window (`Split`); `cut_dims`.
* `phases.py`, `pointwise_split`: a pointwise forward definition run in phases, or around an
  interior box where it is a sum of selects on its variables, like a gather.
* `separable.py`, `separable_window`: whether the separable window runs as two passes (the
  `separable` pass).
* `corners.py`, `points_to_table`: lone points whose gathers are constant taps, run from tables.
* `hoist.py`, `loads_to_hoist`: the loads an iteration reads once, at its top (none that a loop
  inside it changes).
* `rows.py`, `gathers_by_rows`, `column_blocks`: an adjoint run a row at a time; `taps_by_rows`:
  an interior box's windows run a row at a time, the window's loops outside the row's (the
  `tap_rows` pass).
* `stage.py`, `stage_depth`: two adjoints run a plane at a time together, the first computed only
  where the second reads it (`read_box`, `clip_split`); `row_group`:
  consecutive adjoints run a row (a plane) of each per iteration of one parallel loop.
* `rfactor.py`, `split_reduction`: a long reduction to one point as parallel partial results.
* `column_parts.py`, `column_parts`: sums over the rows after a row group (a layer norm gain's
  gradient) folded into it as partial sums per fixed block of rows (`row_blocks`).

Every pass runs through `run`, and every decision is wrapped in `decision` (driver.py):
HALIDE_AD_SKIP=<pass>,... turns passes off (the nest stays as it was: to bisect a miscompile or
measure what a pass buys) and HALIDE_AD_DUMP=<pass>,... prints the nests a pass returns;
HALIDE_AD_DUMP=<decision>,... prints what a decision decided, a line per call (`interior`: the box,
the regions around it, its phases). HALIDE_AD_SKIP=interior (no split gather nests),
separable_window, taps_by_rows, read_box and column_parts turn those decisions off too.
"""
from __future__ import annotations

from halide_ad.runtime.schedule.driver import decision, run
from halide_ad.runtime.schedule.boundary import Separable, Split, interior, piece_exprs

__all__ = ["Separable", "Split", "decision", "interior", "piece_exprs", "run"]
