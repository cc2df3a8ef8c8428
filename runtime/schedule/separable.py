"""separable_window: whether a Split's separable window (boundary.py finds it) runs as two passes
over a ring of rows, and the ring's size. runtime/gathers.py prints the two passes."""
from __future__ import annotations

from halide_ad import config

MAX_SEPARABLE_TEMP = 1 << 18  # elements of a separable window's ring of rows: its rows stay in cache


def ring_rows(split) -> int:
    """The rows of a separable window's temporary: a ring of a power of two, at least the source
    rows one output row reads, so that a row's slot is `row & (ring - 1)`."""
    offsets = [r for r, _ in split.separable.rows]
    return 1 << (max(offsets) - min(offsets)).bit_length()


def separable_window(split, shape: tuple[int, ...], first: int, par: int | None) -> bool:
    """Whether the box's last two dimensions (i, j) run as the split's separable window's two
    passes: it has one, the box's loops start at or before i (`first`), neither i nor j is the
    parallel dimension `par` (each thread would need a ring of its own), and the ring of rows
    fits MAX_SEPARABLE_TEMP; not where HALIDE_AD_SKIP names separable_window."""
    if config.skipped("separable_window"):
        return False
    i, j = len(shape) - 2, len(shape) - 1
    return (split.separable is not None and first <= i and par not in (i, j)
            and ring_rows(split) * shape[j] <= MAX_SEPARABLE_TEMP)
