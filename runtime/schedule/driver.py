"""How the schedule passes and decisions run: HALIDE_AD_SKIP=<pass>,... turns a pass off, and
HALIDE_AD_DUMP=<pass or decision>,... prints the nest a pass returns or, a line per call, what a
decision decided (`decision`)."""
from __future__ import annotations

import functools

from halide_ad import config
from halide_ad.ir import Expr, show as show_expr
from halide_ad.runtime.loops import Stmt, show


def run(transform, nest: Stmt, *args) -> Stmt:
    """`transform(nest, *args)`, or `nest` where HALIDE_AD_SKIP names the pass; printed where
    HALIDE_AD_DUMP names it."""
    name = transform.__name__
    out = nest if config.skipped(name) else transform(nest, *args)
    if config.dumped(name):
        print(f"# after {name}{' (skipped)' if config.skipped(name) else ''}\n{show(out)}")
    return out


def decision(say=None):
    """A schedule decision (a pure function of the IR) whose result HALIDE_AD_DUMP=<its name>
    prints, one line per call: `say(result)`, or the result as `said` writes it. The decisions
    that a skip turns off read HALIDE_AD_SKIP themselves (each declines in its own way)."""
    def wrap(decide):
        @functools.wraps(decide)
        def decided(*args, **kwargs):
            out = decide(*args, **kwargs)
            if config.dumped(decide.__name__):
                print(f"# {decide.__name__}: {(say or said)(out)}")
            return out
        return decided
    return wrap


def said(value) -> str:
    """A decision's result in one line: yes or no, none, expressions as printed, a box (variable
    -> inclusive range) as `i 1..6`, a sequence's items."""
    match value:
        case None:
            return "none"
        case bool():
            return "yes" if value else "no"
        case Expr():
            return show_expr(value)
        case dict():
            return ", ".join(f"{said(v)} {lo}..{hi}" for v, (lo, hi) in value.items()) or "whole"
        case tuple() | list():
            return "(" + ", ".join(map(said, value)) + ")"
    return str(value)


def said_split(split) -> str:
    """A Split (schedule/boundary.py) in one line: its box, how many regions around it, its phases
    and whether its window is separable."""
    if split is None:
        return "none"
    line = f"box {said(split.box)}; {len(split.outside)} region(s) around it"
    if split.phased:
        line += f"; {said(split.phased)} in phases of {said(split.strides)}"
    return line + ("; a separable window" if split.separable is not None else "")
