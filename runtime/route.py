"""Routing: each contribution that an engine computes the same as its gather goes to that engine
(runtime/engines/: the direct SIMD convolution kernels, BLAS products); the rest stay gathers
and scatters for the loop nests. A strided convolution's input gradient splits into BLAS products
per tap and a gather that adds them (`_tap_product`)."""
from __future__ import annotations

import contextlib
import math
from contextvars import ContextVar
from dataclasses import replace

import numpy as np

from halide_ad.ir import Adjoint, Load, Scatter, Var, adjoint_name
from halide_ad.runtime.contract import Contraction, contraction, tap_product_vars
from halide_ad.runtime.engines import blas, direct_conv
from halide_ad.runtime.plans import AdjointPlan, gather_vars
from halide_ad.solver import Gather, invert


ENGINES = (direct_conv, blas)  # asked in order; BLAS takes every contraction
_chosen: ContextVar[dict | None] = ContextVar("halide_ad_engines", default=None)


@contextlib.contextmanager
def engines(chosen: dict[tuple[str, str], str]):
    """Within it, `with_engine` follows `chosen`, {(a contraction's output, its formula): the name
    of its engine's module}, and adds each choice it makes to it. A program's blocks
    (halide_ad/dask.py) so take the engines that the whole program's contractions took, whatever
    their own sizes, and sum in the same order."""
    token = _chosen.set(chosen)
    try:
        yield chosen
    finally:
        _chosen.reset(token)


def with_engine(c: Contraction) -> Contraction:
    """`c` with the first engine's plan that takes it; within `engines`, with the plan of the
    engine chosen for it before, at any size (or, where that engine cannot take it at all, e.g.
    a block narrower than a vector, the first that can)."""
    chosen = _chosen.get()
    key = (c.out, c.formula)
    named = None if chosen is None else chosen.get(key)
    plan = next((engine.plan(c, any_size=True) for engine in ENGINES if _name(engine) == named), None)
    if plan is None:
        engine, plan = next((e, p) for e, p in ((e, e.plan(c)) for e in ENGINES) if p is not None)
        if chosen is not None:
            chosen.setdefault(key, _name(engine))
    return replace(c, plan=plan)


def _name(engine) -> str:
    return engine.__name__.rpartition(".")[2]


def route(plans: list[AdjointPlan], shapes: dict[str, tuple[int, ...]]) -> list[AdjointPlan]:
    """`plans` with every gather an engine computes the same handed to it; `shapes`: of every
    buffer the contributions may read."""
    shapes = dict(shapes)  # a tap product adds its temporaries
    out = []
    for plan in plans:
        contributions = []
        for inverse in plan.contributions:
            s = inverse.scatter
            c = contraction(adjoint_name(s.buffer), s.index, s.value, s.domain, s.where, shapes,
                            one_operand=True)
            if c is not None and isinstance(inverse, Gather):  # the engine computes the same gather
                c = with_engine(c)
                direct = isinstance(c.plan, direct_conv.DirectPlan)
                split = None if direct else _tap_product(s, c, plan.adjoint, plan.new_vars, shapes)
                if split is None:
                    contributions.append(replace(c, inverse=inverse))
                else:  # its products are filled before the kernel that reads them
                    out.append(split[0])
                    contributions.append(split[1])
            else:
                contributions.append(inverse)
        out.append(replace(plan, contributions=tuple(contributions)))
    return out


MAX_TAP_PRODUCT_BYTES = 1 << 30  # else the strided input gradient runs as correlations, one per phase


def _tap_product(s: Scatter, c: Contraction, adj: Adjoint, new_vars: tuple[Var, ...],
                 shapes: dict[str, tuple[int, ...]]) -> tuple[AdjointPlan, Gather] | None:
    """A strided convolution's input gradient, `adj_x[n, c, 2*i + r] += ct[n, k, i] * w[k, c, r]`,
    in two steps (contract.tap_product_vars): BLAS writes every tap's product, `adj_x_taps[n, c,
    r, i] = sum over k of ct[n, k, i] * w[k, c, r]`, one call per image and no copies, and a
    gather adds each pixel's taps, as for an average pool's gradient (conv2d stride 2's whole
    gradient: 9.6 -> 6.1 ms). The plan that fills the products, and the gather; None where the
    contraction is not of that form, or its products would be too big."""
    order = tap_product_vars(c)
    if order is None:
        return None
    ranges = {r.var: r for r in s.domain}
    shape = tuple(ranges[v].extent for v in order)
    if math.prod(shape) * np.dtype(adj.dtype).itemsize > MAX_TAP_PRODUCT_BYTES:
        return None
    name = adj.buffer + "_taps"
    while name in shapes or adjoint_name(name) in shapes:
        name += "_"
    out = adjoint_name(name)
    per_tap = contraction(out, order, s.value, s.domain, None, shapes | {out: shape})
    if per_tap is None or per_tap.taps:
        return None
    products = Adjoint(name, shape, adj.dtype, False, (Scatter(name, order, s.value, s.domain, None, s.loc),))
    products_vars = gather_vars(products)
    filled = invert(products.scatters[0], shape, products_vars)  # what hd.explain shows
    gather = invert(Scatter(s.buffer, s.index, Load(out, order, adj.dtype), tuple(ranges[v] for v in order),
                            None, s.loc), adj.shape, new_vars)
    if not isinstance(filled, Gather) or not isinstance(gather, Gather):
        return None
    shapes[name] = shapes[out] = shape  # a second split into the same adjoint takes another name
    return AdjointPlan(products, products_vars, (with_engine(replace(per_tap, inverse=filled)),)), gather
