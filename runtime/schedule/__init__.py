"""Schedule passes: pure Loops -> Loops rewrites of the nests runtime/lower.py builds, one per file.

In the order the forward reductions run them (runtime/codegen.py):
* `parallel.py`, `choose_parallel`: which loop of a nest runs in parallel (`parallel_dim`).
* `rows.py`, `interchange_rows`: a reduction whose reads walk the output's last dimension runs a
  row at a time, that loop inside the reduction's.
* `accumulate.py`, `split_accumulators`: a long reduction or gather window over a contiguous
  axis as LANES partial results (also for the gathers' pieces).

`boundary.py` is the analysis that splits a gather loop nest into an interior box, the regions
around it and phases of a strided dimension, and finds separable windows (`interior`, `Split`);
runtime/gathers.py still writes the loops it decides.
"""
from halide_ad.runtime.schedule.boundary import Separable, Split, interior, piece_exprs

__all__ = ["Separable", "Split", "interior", "piece_exprs"]
