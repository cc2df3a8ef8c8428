"""outside_box: a plain gather loop nest (around a Point of the general gathers, which
`gathers.expand_points` builds after) run only at the points outside an interior box that has no
regions around it (schedule/boundary.py found the box, but no specialized regions): the loop over
the box's last dimension runs the spans below and above the box where the enclosing loops are
inside it, else its whole extent (`loops.Spans`). The box's own nest runs after, specialized.

Skipped (HALIDE_AD_SKIP=outside_box), the general nest runs at every point and the box's nest
stores the same values over its part again: the same results, slower.
"""
from __future__ import annotations

from dataclasses import replace

from halide_ad.runtime.loops import Block, For, Spans, Stmt


def outside_box(s: Stmt, var: str, box: tuple[int, int], inside: tuple[tuple[str, int, int], ...]) -> Stmt:
    """`s` with its loop over `var` (the outermost, over the dimension's whole extent) running
    only outside the inclusive `box` range, where each of `inside` (a loop variable around it, and
    the box's inclusive range of it) holds."""
    match s:
        case For(v, 0, int(n), _, body) if v == var:
            return Spans(var, (box[0], box[1] + 1), n, inside, body)
        case For(body=body):
            return replace(s, body=outside_box(body, var, box, inside))
        case Block(body):
            return Block(tuple(outside_box(c, var, box, inside) for c in body))
    return s
