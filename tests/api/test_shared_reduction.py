"""A reduction that appears twice in one body (hd.relu(hd.sum(...) + b) holds it twice, in the
condition and in the value) is lifted into one Func, computed once."""
import numpy as np

import halide_ad as hd
from halide_ad import ir


@hd.func
def dense_relu(x, w, b):
    k = hd.rdom(x.shape[1])
    return hd.compute((x.shape[0], w.shape[1]), lambda i, j: hd.relu(hd.sum(x[i, k] * w[k, j]) + b[j]))


def test_repeated_reduction_is_lifted_once(rng):
    x, w, b = rng.standard_normal((3, 4)), rng.standard_normal((4, 2)), rng.standard_normal(2)
    traced, _ = dense_relu.trace((x, w, b), {})
    reductions = [f for f in traced.program.funcs if isinstance(f.body, ir.Reduce)]
    assert len(reductions) == 1, [f.name for f in traced.program.funcs]
    np.testing.assert_allclose(dense_relu(x, w, b), np.maximum(x @ w + b, 0))
    hd.check_grad(dense_relu, x, w, b)
