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


@hd.func
def stencil_energy(u, target):
    """A clamped-stencil energy (a data term through a repeat_edge blur plus a smoothed total
    variation), for second derivatives through the wrappers."""
    c = hd.repeat_edge(u)
    blur = hd.compute(u.shape, lambda y, x: (c[y - 1, x] + c[y + 1, x] + c[y, x - 1] + c[y, x + 1]
                                             + 4 * c[y, x]) / 8, name="blur")
    tv = hd.compute(u.shape, lambda y, x: hd.sqrt((c[y, x + 1] - c[y, x]) ** 2 + (c[y + 1, x] - c[y, x]) ** 2
                                                  + 0.01), name="tv")
    return 0.5 * hd.sum((blur - target) ** 2) + 0.1 * hd.sum(tv)
