"""Statements as a person would write them: a scatter contribution (`show_scatter`) and a Func or
update definition (`show_func`). Expressions print themselves (`ir.show`)."""
from __future__ import annotations

from halide_ad.ir import Func, Scatter, Update, show


def show_scatter(s: Scatter) -> str:
    """`adj_x[i + r] += g[i] * w[r]  for i in [0, 8), r in [0, 3) if ...`"""
    text = f"adj_{s.buffer}[{', '.join(map(show, s.index))}] += {show(s.value)}"
    text += "  for " + ", ".join(f"{r.var.name} in [{r.lo}, {r.hi})" for r in s.domain)
    return text + (f" if {show(s.where)}" if s.where is not None else "")


def show_func(f: Func | Update) -> str:
    if isinstance(f, Update):
        loops = ", ".join(f"{r.var.name} in [{r.lo}, {r.hi})" for r in f.pure + f.rdom)
        return (f"{f.name}[{', '.join(map(show, f.index))}] = {show(f.value)}    # update of {f.prev}, {f.dtype}"
                + (f", for {loops}" if loops else "") + (f" if {show(f.where)}" if f.where is not None else ""))
    lhs = f"{f.name}[{', '.join(v.name for v in f.vars)}]"
    dom = " for " + ", ".join(f"{v.name} < {n}" for v, n in zip(f.vars, f.shape, strict=True)) if f.vars else ""
    return f"{lhs} = {show(f.body)}    # {f.dtype}{dom}"
