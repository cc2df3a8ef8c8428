"""Scheduling of gradient kernels: strided windows in phases, pointwise adjoints not stored.
Each schedule is checked for its shape in the generated source and against the serial scatter
reference (odd sizes, so that boundaries and partial periods run)."""
import re

import numpy as np
import pytest

import halide_ad as hd
from halide_ad.api import as_function
from halide_ad.runtime.reference import evaluate, scatter_adjoints


@hd.func
def avgpool3s2(x):
    r, s = hd.rdom(3, 3)
    return hd.compute(((x.shape[0] - 3) // 2 + 1, (x.shape[1] - 3) // 2 + 1),
                      lambda i, j: hd.sum(x[2 * i + r, 2 * j + s]) / 9)


@hd.func
def maxpool2s2(x):
    r, s = hd.rdom(2, 2)
    return hd.compute((x.shape[0] // 2, x.shape[1] // 2), lambda i, j: hd.max(x[2 * i + r, 2 * j + s]))


@hd.func
def blur_relu_pool(x):
    e = hd.repeat_edge(x)
    r, s = hd.rdom(3, 3)
    blurred = hd.compute(x.shape, lambda i, j: hd.sum(e[i + r - 1, j + s - 1]) / 9)
    return maxpool2s2(hd.relu(blurred))


def _matches_scatter_reference(fn, *args):
    traced, arrays = as_function(fn).trace(args, {})
    out, f_vjp = hd.vjp(fn, *args)
    ct = np.arange(out.size, dtype=np.float64).reshape(out.shape) % 7 - 3
    ref = scatter_adjoints(traced.program, tuple(n for n in traced.arg_names if n),
                           arrays | evaluate(traced.program, arrays), {traced.program.outputs[0]: ct})
    grads = f_vjp(ct)
    for name, g in zip(traced.arg_names, grads if isinstance(grads, tuple) else (grads,), strict=False):
        if name is not None:
            np.testing.assert_allclose(g, ref[name], rtol=1e-13, atol=1e-15)  # sums in another order


@pytest.mark.parametrize("fn, shape", [(avgpool3s2, (9, 13)), (maxpool2s2, (7, 10)), (maxpool2s2, (6, 9))])
def test_pooling_gradients_run_in_phases(fn, shape):
    x = (np.arange(np.prod(shape)) * 7 % 11).astype(np.float64).reshape(shape)
    source = hd.explain(fn, x).backward_source
    assert "# phase 0 of 2" in source and "# phase 1 of 2" in source, source
    # inside the phases, the column is q: no shift or floor division of j1 is left
    phased = source.split("# phase 0 of 2")[1]
    assert not re.search(r"j1\)? *(>>|//|&|%)", phased), source
    _matches_scatter_reference(fn, x)
    hd.check_grad(fn, x + np.linspace(0, 0.5, x.size).reshape(shape))  # no ties for the max


def test_pointwise_adjoints_are_not_stored():
    """blur -> relu -> pool: the relu's and the blur's /9 adjoints are computed inside the pooling
    gradient's pass; only the window sum's input is stored."""
    x = (np.arange(63) * 5 % 13 - 6).astype(np.float64).reshape(7, 9)
    report = hd.explain(blur_relu_pool, x)
    assert sum("[not stored" in c.formula for c in report.contributions) == 2, str(report)
    assert "adj_relu" not in report.backward_source.split(":")[0]  # not a kernel parameter
    _matches_scatter_reference(blur_relu_pool, x)
    hd.check_grad(blur_relu_pool, x + np.linspace(0, 0.3, x.size).reshape(x.shape))
