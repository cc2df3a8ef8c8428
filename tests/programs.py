"""The programs the tests share: one definition each, so each kernel is compiled once per run."""
import numpy as np

import halide_ad as hd
from halide_ad.ad import reverse_mode
from halide_ad.runtime import reference

VIEWS = {"repeat_edge": hd.repeat_edge, "constant_exterior": hd.constant_exterior, "mirror": hd.mirror}
NUMPY_PAD = {"repeat_edge": "edge", "constant_exterior": "constant", "mirror": "reflect"}


def scatter_adjoints(program, wrt, buffers, cotangents):
    """The oracle: reverse mode's scatters run as written, by numpy (`reference.scatter_adjoints`)."""
    return reference.scatter_adjoints(program, reverse_mode(program, wrt), wrt, buffers, cotangents)


@hd.func
def blur1d(x, view):
    c = VIEWS[view](x)
    return hd.compute(x.shape, lambda i: (c[i - 1] + 2 * c[i] + c[i + 1]) / 4, name="blur1d")


@hd.func
def blur3(img, view="repeat_edge"):
    c = VIEWS[view](img)
    return hd.compute(img.shape, lambda y, x: (c[y, x - 1] + c[y, x] + c[y, x + 1]) / 3, name="blur3")


@hd.func
def blur2d(img, view):
    """A 3x3 box blur under a boundary view."""
    c = VIEWS[view](img)
    r, s = hd.rdom((-1, 2), (-1, 2))
    return hd.compute(img.shape, lambda y, x: hd.sum(c[y + r, x + s]) / 9, name="blur2d")


@hd.func
def conv2d(x, w):
    N, C, H, W = x.shape
    K, _, R, S = w.shape
    c, r, s = hd.rdom(C, R, S)
    return hd.compute((N, K, H - R + 1, W - S + 1), lambda n, k, i, j:
                      hd.sum(x[n, c, i + r, j + s] * w[k, c, r, s]), name="conv2d")


@hd.func
def maxpool2(x):
    N, C, H, W = x.shape
    r, s = hd.rdom(2, 2)
    return hd.compute((N, C, H // 2, W // 2), lambda n, c, i, j: hd.max(x[n, c, 2 * i + r, 2 * j + s]),
                      name="maxpool2")


@hd.func
def dense(x, w, b):
    k = hd.rdom(x.shape[1])
    return hd.compute((x.shape[0], w.shape[1]), lambda i, j: hd.sum(x[i, k] * w[k, j]) + b[j], name="dense")


@hd.func
def softmax(x):
    """Row-wise softmax, with the max subtracted for stability."""
    r = hd.rdom(x.shape[1])
    e = hd.compute(x.shape, lambda i, j: hd.exp(x[i, j] - hd.max(x[i, r])), name="e")
    return hd.compute(x.shape, lambda i, j: e[i, j] / hd.sum(e[i, r]), name="softmax")


@hd.func
def chain(x):
    """An elementwise chain through most of the math library."""
    return hd.tanh(hd.sigmoid(x) * 3.0 - 1.0) + hd.exp(-x * x) + hd.sqrt(x * x + 1.0) * hd.sin(x)


@hd.func
def blur_pool(img):
    """A two-stage pipeline: 3x3 blur (repeat_edge), then 2x2 max pooling."""
    b = blur2d(img, "repeat_edge")
    H, W = b.shape
    r, s = hd.rdom(2, 2)
    return hd.compute((H // 2, W // 2), lambda i, j: hd.max(b[2 * i + r, 2 * j + s]), name="pool")


@hd.func
def fan_out(x):
    """x is read by two consumers and several times within one body."""
    sq = hd.compute(x.shape, lambda i: x[i] * x[i] + x[i], name="sq")
    c = hd.repeat_edge(x)
    shifted = hd.compute(x.shape, lambda i: c[i + 1] * sq[i] - c[i - 2], name="shifted")
    return shifted + sq


def numpy_blur3(img, view):
    p = np.pad(img, ((0, 0), (1, 1)), mode=NUMPY_PAD[view])
    return (p[:, :-2] + p[:, 1:-1] + p[:, 2:]) / 3
