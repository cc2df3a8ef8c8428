"""Property test of the inverter and code generator: random index maps (strides, offsets, windows,
dilations, flips, div/mod, boundary views, 1-4 dimensions) over random shapes. The gradient kernel
must equal the direct serial-scatter reference exactly, on integer-valued float64 data.

The kernels run as plain Python (HALIDE_AD_JIT=0): the very source numba would compile, without
the seconds of compilation per example. HALIDE_AD_PROPERTY_EXAMPLES raises the example count.
"""
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import halide_ad as hd
from halide_ad.api import as_function
from halide_ad.runtime.reference import evaluate
from tests.programs import scatter_adjoints

EXAMPLES = int(os.environ.get("HALIDE_AD_PROPERTY_EXAMPLES", "500"))
VIEWS = [None, hd.repeat_edge, hd.mirror, hd.constant_exterior]


@st.composite
def index_maps(draw):
    """(input shape, output shape, per-dimension forms, boundary view)."""
    ndim = draw(st.integers(1, 4))
    view = draw(st.sampled_from(VIEWS))
    in_shape, out_shape, forms = [], [], []
    for _ in range(ndim):
        n = draw(st.integers(1, 5 if ndim > 2 else 7))
        kind = draw(st.sampled_from(["affine", "affine", "window", "upsample", "flip", "mod"]))
        if kind == "affine":
            form = ("affine", draw(st.sampled_from([1, 2, 3, -1, -2])), draw(st.integers(-2, 2)))
        elif kind == "window":
            form = ("window", draw(st.sampled_from([1, 2])), draw(st.integers(1, 3)),
                    draw(st.sampled_from([1, 2])), draw(st.integers(-1, 1)))
        elif kind == "upsample":
            form = ("upsample", draw(st.integers(2, 3)))
        elif kind == "mod":
            form = ("mod", draw(st.integers(2, 3)))
        else:
            form = ("flip",)
        m = draw(st.integers(1, 6 if ndim > 2 else 9))
        in_shape.append(n)
        out_shape.append(m)
        forms.append(form)
    if view is None:  # without a boundary view, every read must stay inside: fit the output
        out_shape = [_fit(f, n, m) for f, n, m in zip(forms, in_shape, out_shape, strict=True)]
        if any(m < 1 for m in out_shape):
            view = hd.repeat_edge
            out_shape = [max(m, 1) for m in out_shape]
    return tuple(in_shape), tuple(out_shape), tuple(forms), view


def _reads(form, i, r=0):
    match form:
        case ("affine", s, b):
            return s * i + b
        case ("window", s, _, d, b):
            return s * i + d * r + b
        case ("upsample", k):
            return i // k
        case ("mod", k):
            return i % k
        case ("flip",):
            return -i - 1
    raise AssertionError(form)


def _fit(form, n, m):
    """The largest output extent <= m whose reads all fall in [0, n)."""
    while m >= 1:
        window = form[2] if form[0] == "window" else 1
        reads = [_reads(form, i, r) + (n if form[0] == "flip" else 0)
                 for i in range(m) for r in range(window)]
        if min(reads) >= 0 and max(reads) < n:
            return m
        m -= 1
    return 0


def build(in_shape, out_shape, forms, view):
    windows = [f for f in forms if f[0] == "window"]

    def program(x):
        src = view(x) if view is not None else x
        rvars = hd.rdom(*(f[2] for f in windows)) if windows else ()
        rvars = rvars if isinstance(rvars, tuple) else (rvars,)

        def body(*idx):
            it = iter(rvars)
            index = []
            for f, i, n in zip(forms, idx, in_shape, strict=True):
                e = _reads(f, i, next(it) if f[0] == "window" else 0)
                index.append(e + n if f[0] == "flip" else e)
            value = src[tuple(index)] * (1.0 + idx[0] % 2)
            return hd.sum(value) if windows else value

        return hd.compute(out_shape, body, name="gathered")

    return program


@pytest.fixture(autouse=True)
def _interpreted(monkeypatch):
    monkeypatch.setenv("HALIDE_AD_JIT", "0")


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(case=index_maps(), seed=st.integers(0, 2**16))
def test_gradient_kernel_equals_serial_scatter(case, seed):
    in_shape, out_shape, forms, view = case
    rng = np.random.default_rng(seed)
    x = rng.integers(-4, 5, in_shape).astype(np.float64)
    ct = rng.integers(-4, 5, out_shape).astype(np.float64)
    fn = build(*case)
    out, f_vjp = hd.vjp(fn, x)
    (grad,) = f_vjp(ct)
    traced, arrays = as_function(fn).trace((x,), {})
    expect = evaluate(traced.program, arrays)
    np.testing.assert_array_equal(out, expect[traced.program.outputs[0]])
    ref = scatter_adjoints(traced.program, ("x",), arrays | expect, {traced.program.outputs[0]: ct})
    np.testing.assert_array_equal(grad, ref["x"])
