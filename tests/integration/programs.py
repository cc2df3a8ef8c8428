"""Small programs the integration tests share (one compile each per run)."""
import halide_ad as hd


@hd.func
def take(x, idx):
    """x[idx[i]]: idx is an integer array, data rather than a differentiable input."""
    return hd.compute(idx.shape, lambda i: x[idx[i]], name="take")


@hd.func
def scale_shift(x, a, b):
    """Two outputs, a dict, and a static float `b`: (a * x + b, sum of x^2)."""
    y = hd.compute(x.shape, lambda i: a[i] * x[i] + b, name="y")
    return {"y": y, "sq": hd.sum(x * x)}
