"""choose_parallel: the loop of a nest that runs in parallel, and the threshold below which none does."""
from __future__ import annotations

import math
from dataclasses import replace

from halide_ad import config
from halide_ad.runtime.loops import Block, For, Kind, Stmt


def parallel_min_points() -> int:
    """Below this many points (times terms) a loop nest runs serially: threads cost more than
    they save there. Handing chunks to the pool and waiting for them takes 50 us back to back and
    ~100 us where the pool's thread has slept since its last loop (waking a thread on this VM):
    medians of calls in turns, two threads against one, at 128K / 256K / 512K points: x * w + x
    154 / 181 / 250 us against 41 / 100 / 226, tanh 142 / 209 / 305 against 83 / 173 / 368,
    softmax's backward 162 / 217 / 340 against 64 / 190 / 393; the digits example's convolution
    (295K points times terms) took 156 us on two threads and 96 on one, and its training step
    1.07 ms against 1.23. Set with HALIDE_AD_PARALLEL_MIN_POINTS (0: every loop nest with more
    than one point is parallel)."""
    return config.parallel_min_points()


def parallel_dim(shape: tuple[int, ...], terms: float = 1) -> int | None:
    """The dimension a loop nest over `shape` runs in parallel: the first with more than one point,
    where the points times the `terms` each adds up (a reduction's) reach parallel_min_points. A
    batch norm's statistics are 64 points of 262144 terms each: they ran on one thread."""
    if math.prod(shape) * terms < parallel_min_points():
        return None
    return next((d for d, n in enumerate(shape) if n > 1), None)


def region_parallel(ranges: dict) -> bool:
    """Whether a region around a gather loop nest's box (boundary.py: its inclusive `ranges`, one
    per variable) runs its loop over the parallel dimension in parallel: not a thin one (an edge
    row of one image), under parallel_min_points points. A region that runs inside the box's
    loop (a plane's edge columns, beside each row) is serial whatever its size."""
    return math.prod(hi - lo + 1 for lo, hi in ranges.values()) >= parallel_min_points()


def perfect_loops(s: Stmt) -> list[For]:
    """The loops of the perfect nest `s` opens: each the only statement of the one before."""
    out = []
    while isinstance(s, For):
        out.append(s)
        s = s.body.body[0] if len(s.body.body) == 1 else None
    return out


def choose_parallel(s: Stmt, terms: float = 1) -> Stmt:
    """`s` with the loop over `parallel_dim` of its perfect nest's extents parallel, where each
    point adds up `terms` terms (a reduction's). The loops must run from constant bounds."""
    outer = perfect_loops(s)
    par = parallel_dim(tuple(loop.hi - loop.lo for loop in outer), terms)
    if par is None:
        return s

    def mark(s: For, d: int) -> For:
        if d == par:
            return replace(s, kind=Kind.PARALLEL)
        return replace(s, body=Block((mark(s.body.body[0], d + 1),)))

    return mark(s, 0)
