"""Schedule passes: pure Loops -> Loops rewrites of the nests runtime/lower.py builds, one per file.

* `parallel.py`, `choose_parallel`: which loop of a nest runs in parallel (`parallel_dim`).
* `boundary.py`: the analysis that splits a gather loop nest into an interior box, the regions
  around it and phases of a strided dimension (`interior`, `Split`); runtime/codegen.py still
  writes the loops it decides, as text.
"""
from halide_ad.runtime.schedule.boundary import Separable, Split, interior, piece_exprs

__all__ = ["Separable", "Split", "interior", "piece_exprs"]
