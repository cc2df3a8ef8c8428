"""stage_plane: a staged pair's nests (schedule/stage.py, `stage_depth`) with the producer's
adjoint kept one plane at a time in a local array: every store to the buffer and every read of it
becomes an element of the local at the indices past the planes' leading `depth` ones, and a lane
fold's row of it the local itself (or its row). The loops over those leading dimensions are open
outside the nests, so each iteration writes the plane before the consumer reads it. The local's
elements are in range by construction: no run-time check, no wraparound guard; but only those
read are written (`read_box`), so a select keeps its branch (`Element.partial`).
"""
from __future__ import annotations

from dataclasses import replace

from halide_ad.ir import Expr, Load
from halide_ad.runtime.loops import Block, Element, For, Hoisted, If, Let, Local, Row, Spans, Stmt, Store, map_exprs
from halide_ad.traverse import map_children


def stage_plane(s: Stmt, buffer: str, depth: int, local: str, dtype: str) -> Stmt:
    """`s` with buffer `buffer`'s plane (its indices past the first `depth`) read from and written
    to the local array `local` of `dtype`."""
    def plane(index: tuple[Expr, ...]) -> Element:
        return Element(local, tuple(map(expr, index[depth:])), dtype, partial=True)

    def expr(e):
        match e:
            case Hoisted():  # prints as its name; its load is not read again
                return e
            case Row(Load(b, index)) if b == buffer:
                return Local(local, dtype) if len(index) - 1 <= depth else plane(index[:-1])
            case Load(b, index) if b == buffer:
                return plane(index)
        return map_children(e, expr) if isinstance(e, Expr) else e

    def stmt(s: Stmt) -> Stmt:
        match s:
            case Block(body):
                return Block(tuple(map(stmt, body)))
            case For(lo=lo, hi=hi, body=body):
                lo, hi = (expr(b) for b in (lo, hi))
                return replace(s, lo=lo, hi=hi, body=stmt(body))
            case Spans(body=body):
                return replace(s, body=stmt(body))
            case If(cond, then, otherwise):
                cond = tuple(map(expr, cond)) if isinstance(cond, tuple) else expr(cond)
                return replace(s, cond=cond, then=stmt(then), otherwise=otherwise and stmt(otherwise))
            case Store(b, index, value) if b == buffer:
                return Let(plane(index), expr(value))
        return map_exprs(s, expr)

    return stmt(s)
