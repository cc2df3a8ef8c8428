"""Fuzzed programs: random compositions of stages (elementwise math, stencils and windows under
boundary views, reductions, pooling, strided reads, upsampling, transposes, reshapes, 1-d
convolutions and scaling by a weight input, softmax, fan-out, reads at an argmax, and update
definitions: scans, affine scatters, histograms and in-place maxima) over random shapes of 1-4
dimensions, sizes including 1. The compiled forward and gradient must equal the numpy reference interpreter
(`evaluate`, and `scatter_adjoints`, which never uses the solver), and smooth programs must pass
finite differences.

Kernels run as plain Python (HALIDE_AD_JIT=0): the source numba would compile, without seconds of
compilation per example. HALIDE_AD_FUZZ_EXAMPLES raises the example count (CI: 300).
"""
import math
import os

import numpy as np
import pytest
from halide_ad.runtime.reference import evaluate
from tests.programs import scatter_adjoints
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import halide_ad as hd
from halide_ad.api import as_function

EXAMPLES = int(os.environ.get("HALIDE_AD_FUZZ_EXAMPLES", "300"))
W_SIZE = 3  # the weight input w has shape (W_SIZE,); conv stages read a prefix of it
MAX_ELEMENTS = 256
VIEWS = {"repeat_edge": hd.repeat_edge, "mirror": hd.mirror, "constant_exterior": hd.constant_exterior}
# name -> (function on tensors, smooth everywhere that random normal data lands)
UNARY = {
    "tanh": (hd.tanh, True),
    "sin": (hd.sin, True),
    "sigmoid": (hd.sigmoid, True),
    "square": (lambda t: t * t, True),
    "exp_tanh": (lambda t: hd.exp(hd.tanh(t)), True),
    "softplus": (lambda t: hd.log(1.0 + hd.exp(hd.tanh(t))), True),
    "hypot1": (lambda t: hd.sqrt(t * t + 1.0), True),
    "atan2": (lambda t: hd.atan2(t, 2.0), True),
    "relu": (hd.relu, False),
    "abs": (hd.abs, False),
    "maximum": (lambda t: hd.maximum(t, 0.1), False),
    "where": (lambda t: hd.where(t > 0.2, t, 0.5 * t), False),
    "clamp": (lambda t: hd.clamp(t, -0.5, 0.7), False),
}
SMOOTH_UNARY = [k for k, (_, smooth) in UNARY.items() if smooth]


@pytest.fixture(autouse=True)
def _interpreted(monkeypatch):
    monkeypatch.setenv("HALIDE_AD_JIT", "0")


# ---- the strategy: stage specs, drawn while tracking the shape they produce ------------------------


def _kinds(shape, smooth):
    nd = len(shape)
    kinds = ["conv", "scale", "unary", "stencil", "window", "stride", "upsample", "combine", "softmax", "reduce",
             "pool", "reshape", "scan", "scatter"]
    if nd >= 2:
        kinds.append("transpose")
    if not smooth:
        kinds += ["take_max", "histogram", "inplace_max"]
    return kinds


@st.composite
def stage(draw, shape, shapes_so_far, smooth):
    """(spec, new shape): one stage applied to a tensor of `shape`."""
    nd = len(shape)
    kind = draw(st.sampled_from(_kinds(shape, smooth)))
    axis = draw(st.integers(0, nd - 1))
    n = shape[axis]
    if kind == "unary":
        return ("unary", draw(st.sampled_from(SMOOTH_UNARY if smooth else list(UNARY)))), shape
    if kind == "stencil":
        offsets = draw(st.lists(st.integers(-2, 2), min_size=1, max_size=3, unique=True))
        weights = [draw(st.sampled_from([0.5, -1.0, 2.0, 0.25])) for _ in offsets]
        return ("stencil", axis, draw(st.sampled_from(list(VIEWS))), tuple(offsets), tuple(weights)), shape
    if kind == "window":
        axes = sorted(set(draw(st.lists(st.integers(0, nd - 1), min_size=1, max_size=2))))
        bounds = tuple((draw(st.integers(-2, 0)), draw(st.integers(1, 3))) for _ in axes)
        return ("window", tuple(axes), draw(st.sampled_from(list(VIEWS))), bounds), shape
    if kind == "stride":
        step = draw(st.sampled_from([1, 2, 3, -1, -2]))
        start = draw(st.integers(0, n - 1))
        new = len(range(n)[start::step])
        return ("stride", axis, start, step), shape[:axis] + (new,) + shape[axis + 1:]
    if kind == "upsample" and 3 * math.prod(shape) <= MAX_ELEMENTS:
        k = draw(st.integers(2, 3))
        return ("upsample", axis, k), shape[:axis] + (n * k,) + shape[axis + 1:]
    if kind == "conv":
        k = draw(st.integers(1, min(W_SIZE, n)))
        return ("conv", axis, k), shape[:axis] + (n - k + 1,) + shape[axis + 1:]
    if kind == "combine":
        same = [k for k, s in enumerate(shapes_so_far) if s == shape]
        if same:
            return ("combine", draw(st.sampled_from(same)), draw(st.sampled_from(["+", "-", "*"]))), shape
    if kind == "softmax":
        return ("softmax", axis), shape
    if kind == "scale":  # by one element of w: a 0-d slice, broadcast
        return ("scale", draw(st.integers(0, W_SIZE - 1))), shape
    if kind == "reduce":
        op = draw(st.sampled_from(["sum", "mean"] if smooth else ["sum", "mean", "max", "min"]))
        keepdims = draw(st.booleans())
        new = shape[:axis] + ((1,) if keepdims else ()) + shape[axis + 1:]
        return ("reduce", op, axis, keepdims), new
    if kind == "pool":
        k = draw(st.integers(1, min(3, n)))
        s = draw(st.integers(1, 3))
        op = "sum" if smooth else draw(st.sampled_from(["sum", "max", "min"]))
        return ("pool", op, axis, k, s), shape[:axis] + ((n - k) // s + 1,) + shape[axis + 1:]
    if kind == "scan" and n > 1:  # t[.., r, ..] += c * t[.., r - 1, ..] (or a ring that rereads)
        return ("scan", axis, draw(st.sampled_from([0.5, -1.0, 1.0])), draw(st.booleans())), shape
    if kind == "scatter":  # out[.., r // k, ..] += t[.., r, ..]: colliding affine writes
        k = draw(st.integers(1, 3))
        return ("scatter", axis, k), shape[:axis] + (-(-n // k),) + shape[axis + 1:]
    if kind == "histogram":  # out[.., bin(t), ..] += t: a data-dependent index
        return ("histogram", axis, draw(st.integers(1, 4))), shape[:axis] + (3,) + shape[axis + 1:]
    if kind == "inplace_max":  # t2[i] = max(t2[i], t[.., r, ..]) over axis, from a start value
        return ("inplace_max", axis), shape[:axis] + shape[axis + 1:]
    if kind == "take_max":  # a data-dependent read: t at the argmax along axis
        return ("take_max", axis), shape[:axis] + shape[axis + 1:]
    if kind == "transpose":
        perm = tuple(draw(st.permutations(range(nd))))
        return ("transpose", perm), tuple(shape[p] for p in perm)
    if kind == "reshape":
        total = math.prod(shape)
        if nd > 1 and draw(st.booleans()):
            new = (total,)  # flatten
        else:
            divisors = [d for d in range(2, n + 1) if n % d == 0]
            if nd < 4 and divisors:
                d = draw(st.sampled_from(divisors))
                new = shape[:axis] + (d, n // d) + shape[axis + 1:]
            else:
                new = shape[::-1] if nd > 1 else shape
        return ("reshape", new), new
    return ("unary", "tanh"), shape


@st.composite
def programs(draw, smooth=False):
    nd = draw(st.integers(1, 4))
    limit = {1: 7, 2: 5, 3: 4, 4: 3}[nd]
    in_shape = tuple(draw(st.integers(1, limit)) for _ in range(nd))
    stages, shapes = [], [in_shape]
    shape = in_shape
    for _ in range(draw(st.integers(1, 3))):
        spec, shape = draw(stage(shape, shapes, smooth))
        stages.append(spec)
        shapes.append(shape)
        if not shape:  # a full reduction to a scalar ends the program
            break
    return in_shape, tuple(stages)


# ---- building the program -----------------------------------------------------------------------

def _at(idx, axis, value):
    return tuple(value if d == axis else i for d, i in enumerate(idx))


def apply(spec, t, w, tensors):
    match spec:
        case ("unary", name):
            return UNARY[name][0](t)
        case ("stencil", axis, view, offsets, weights):
            v = VIEWS[view](t)

            def stencil(*i):
                terms = [c * v[_at(i, axis, i[axis] + o)] for o, c in zip(offsets, weights, strict=True)]
                return sum(terms[1:], terms[0])
            return hd.compute(t.shape, stencil, name="stencil")
        case ("window", axes, view, bounds):
            v = VIEWS[view](t)
            rs = hd.rdom(*bounds)
            rs = rs if isinstance(rs, tuple) else (rs,)

            def window(*i):
                idx = list(i)
                weight = 1.0
                for a, r in zip(axes, rs, strict=True):
                    idx[a] = i[a] + r
                    weight = weight + 0.5 * r
                return hd.sum(v[tuple(idx)] * weight)
            return hd.compute(t.shape, window, name="window")
        case ("stride", axis, start, step):
            return t[_at((slice(None),) * t.ndim, axis, slice(start, None, step))]
        case ("upsample", axis, k):
            shape = _at(t.shape, axis, t.shape[axis] * k)
            return hd.compute(shape, lambda *i: t[_at(i, axis, i[axis] // k)], name="upsample")
        case ("conv", axis, k):
            r = hd.rdom(k)
            shape = _at(t.shape, axis, t.shape[axis] - k + 1)
            return hd.compute(shape, lambda *i: hd.sum(t[_at(i, axis, i[axis] + r)] * w[r]), name="conv")
        case ("combine", which, op):
            other = tensors[which]
            return {"+": lambda: t + other, "-": lambda: t - other, "*": lambda: t * other}[op]()
        case ("scale", k):
            return t * w[k]
        case ("softmax", axis):
            e = hd.exp(t - t.max(axis, keepdims=True))
            return e / e.sum(axis, keepdims=True)
        case ("reduce", op, axis, keepdims):
            return getattr(t, op)(axis, keepdims=keepdims)
        case ("pool", op, axis, k, s):
            r = hd.rdom(k)
            shape = _at(t.shape, axis, (t.shape[axis] - k) // s + 1)
            reduce = {"sum": hd.sum, "max": hd.max, "min": hd.min}[op]
            return hd.compute(shape, lambda *i: reduce(t[_at(i, axis, s * i[axis] + r)]), name="pool")
        case ("take_max", axis):
            r = hd.rdom(t.shape[axis])
            shape = t.shape[:axis] + t.shape[axis + 1:]
            arg = hd.compute(shape, lambda *i: hd.argmax(t[i[:axis] + (r,) + i[axis:]]), name="arg")
            return hd.compute(shape, lambda *i: t[i[:axis] + (arg[i],) + i[axis:]], name="take")
        case ("scan", axis, c, ring):
            out = hd.compute(t.shape, lambda *i: t[i], name="scanned")
            i = [hd.var(f"s{d}") for d in range(t.ndim)]
            n = t.shape[axis]
            r = hd.rdom((0, 2 * n)) if ring else hd.rdom((1, n))
            at = tuple(_at(i, axis, r % n if ring else r))
            out[at] += c * out[tuple(_at(i, axis, (r + 1) % n if ring else r - 1))]
            return out
        case ("scatter", axis, k):
            out = hd.zeros(_at(t.shape, axis, -(-t.shape[axis] // k)), t.dtype)
            i = [hd.var(f"s{d}") for d in range(t.ndim)]
            r = hd.rdom(t.shape[axis])
            out[tuple(_at(i, axis, r // k))] += t[tuple(_at(i, axis, r))]
            return out
        case ("histogram", axis, scale):
            out = hd.zeros(_at(t.shape, axis, 3), t.dtype)
            i = [hd.var(f"s{d}") for d in range(t.ndim)]
            r = hd.rdom(t.shape[axis])
            x = t[tuple(_at(i, axis, r))]
            out[tuple(_at(i, axis, hd.clamp(hd.cast(hd.floor(x * scale), "int64") + 1, 0, 2)))] += x
            return out
        case ("inplace_max", axis):
            shape = t.shape[:axis] + t.shape[axis + 1:]
            out = hd.full(shape, -0.5, t.dtype)
            i = [hd.var(f"s{d}") for d in range(len(shape))]
            r = hd.rdom(t.shape[axis])
            out[tuple(i)] = hd.maximum(out[tuple(i)], t[tuple(i[:axis]) + (r,) + tuple(i[axis:])])
            return out
        case ("transpose", perm):
            return t.transpose(perm)
        case ("reshape", shape):
            return t.reshape(shape)
    raise AssertionError(spec)


def build(stages):
    def program(x, w):
        tensors, t = [x], x
        for spec in stages:
            t = apply(spec, t, w, tensors)
            tensors.append(t)
        return t
    return program


def _inputs(in_shape, seed):
    rng = np.random.default_rng(seed)
    return rng.standard_normal(in_shape), rng.standard_normal(W_SIZE), rng


# ---- the properties -----------------------------------------------------------------------------

@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(case=programs(), seed=st.integers(0, 2**16))
@example(case=((2, 3, 3), (("reshape", (2, 1, 3, 3)), ("scale", 0))), seed=0)  # an inlined adjoint read across a BLAS step
@example(case=((2, 3, 4), (("reshape", (2, 3, 4, 1)), ("reshape", (1, 4, 3, 2)), ("reshape", (2, 3, 4, 1)))),
         seed=2)  # div/mod towers: they took minutes to inline and split
@example(case=((1, 2, 2, 2), (("upsample", 0, 2), ("reshape", (16,)), ("softmax", 0))),
         seed=0)  # a negated numpy sum to one number (softmax's max over 16 entries)
@example(case=((1, 1, 1), (("stencil", 0, "repeat_edge", (1, 2, -1), (0.5, 0.5, -1.0)),)),
         seed=0)  # a window whose taps cancel at a size-1 edge: no separable factors
@example(case=((2, 1, 1), (("inplace_max", 0), ("inplace_max", 0))),
         seed=0)  # an update's adjoint, read by its backward run, was inlined into nothing
def test_random_program_equals_reference(case, seed):
    in_shape, stages = case
    x, w, rng = _inputs(in_shape, seed)
    fn = build(stages)
    out, f_vjp = hd.vjp(fn, x, w)
    traced, arrays = as_function(fn).trace((x, w), {})
    program = traced.program
    expect = evaluate(program, arrays)
    np.testing.assert_allclose(out, expect[program.outputs[0]], rtol=1e-10, atol=1e-12)
    ct = rng.standard_normal(np.shape(out))
    gx, gw = f_vjp(ct)
    ref = scatter_adjoints(program, ("x", "w"), arrays | expect, {program.outputs[0]: ct})
    np.testing.assert_allclose(gx, ref["x"], rtol=1e-9, atol=1e-10)
    np.testing.assert_allclose(gw, ref["w"], rtol=1e-9, atol=1e-10)


@settings(max_examples=max(EXAMPLES // 10, 20), deadline=None, suppress_health_check=list(HealthCheck))
@given(case=programs(smooth=True), seed=st.integers(0, 2**16))
def test_random_smooth_program_matches_finite_differences(case, seed):
    in_shape, stages = case
    x, w, _ = _inputs(in_shape, seed)
    hd.check_grad(build(stages), x, w, modes=("rev", "fwd"), rtol=1e-5, atol=1e-7,
                  directions=2, seed=seed)
