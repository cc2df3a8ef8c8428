"""Programs for the dask tests, at module level so that worker processes unpickle them by name."""
import numpy as np

import halide_ad as hd
import halide_ad.ops as ops

VIEWS = ("repeat_edge", "mirror", "constant_exterior", "clamp")


def _viewed(x, view: str):
    """A 2-d reader of x through `view`; "clamp" is the user's own clamp to the edges."""
    if view == "clamp":
        h, w = x.shape
        return lambda i, j: x[hd.clamp(i, 0, h - 1), hd.clamp(j, 0, w - 1)]
    v = {"repeat_edge": hd.repeat_edge, "mirror": hd.mirror,
         "constant_exterior": lambda t: hd.constant_exterior(t, 0.5)}[view](x)
    return lambda i, j: v[i, j]


@hd.func
def blur(x, view):
    """A 3x3 blur, unequal weights, shape kept; the view acts at the edges."""
    v = _viewed(x, view)
    return hd.compute(x.shape, lambda i, j: (0.5 * v(i - 1, j) + v(i, j) + 0.25 * v(i + 1, j - 1)
                                             + 0.125 * v(i, j + 1)))


@hd.func
def blur_pool_blur(x):
    """repeat_edge blur, 2x2 max pool at stride 2, then a mirror blur of the pooled image."""
    e = hd.repeat_edge(x)
    a = hd.compute(x.shape, lambda i, j: e[i - 1, j] + 2.0 * e[i, j] + e[i + 1, j] - e[i, j + 2])
    r, s = hd.rdom(2, 2)
    p = hd.compute((x.shape[0] // 2, x.shape[1] // 2), lambda i, j: hd.max(a[2 * i + r, 2 * j + s]))
    m = hd.mirror(p)
    return hd.compute(p.shape, lambda i, j: m[i - 2, j] * 0.25 + m[i, j - 1] + m[i + 1, j + 1] * 0.5)


@hd.func
def conv_valid(x, w):
    """A 'valid' convolution with a weight argument (broadcast to every task)."""
    kh, kw = w.shape
    r, s = hd.rdom(kh, kw)
    shape = (x.shape[0] - kh + 1, x.shape[1] - kw + 1)
    return hd.compute(shape, lambda i, j: hd.sum(x[i + r, j + s] * w[r, s]))


@hd.func
def conv_strided(x, w):
    """A stride-2 convolution over a zero-padded image, with a bias-free weight argument."""
    c = hd.constant_exterior(x)
    kh, kw = w.shape
    r, s = hd.rdom(kh, kw)
    shape = ((x.shape[0] + 1) // 2, (x.shape[1] + 1) // 2)
    return hd.compute(shape, lambda i, j: hd.sum(c[2 * i + r - 1, 2 * j + s - 1] * w[r, s]))


@hd.func
def deconv_loss(x, k, target):
    """The residual of a blurred x against a target, squared: an image-sized output, two chunked
    inputs and one weight."""
    e = hd.repeat_edge(x)
    kh, kw = k.shape
    r, s = hd.rdom(kh, kw)
    y = hd.compute(x.shape, lambda i, j: hd.sum(e[i + r - kh // 2, j + s - kw // 2] * k[r, s]))
    return hd.compute(x.shape, lambda i, j: (y[i, j] - target[i, j]) ** 2)


# ---- programs that cannot be chunked along axis 0 -------------------------------------------------

@hd.func
def flipped(x):
    return hd.compute(x.shape, lambda i, j: x[x.shape[0] - 1 - i, j])


@hd.func
def transposed(x):
    return hd.compute(x.shape, lambda i, j: x[j, i])


@hd.func
def column_sums(x):
    return x.sum(axis=0, keepdims=True)


@hd.func
def gathered(x, idx):
    return hd.compute(x.shape, lambda i, j: x[hd.clamp(idx[i, j], 0, x.shape[0] - 1), j])


@hd.func
def ramp(x):
    return hd.compute(x.shape, lambda i, j: x[i, j] * hd.cast(i, "float64"))


@hd.func
def upsampled(x):
    return hd.compute((2 * x.shape[0], x.shape[1]), lambda i, j: x[i // 2, j])


@hd.func
def masked(x, m):
    """Fine when m is chunked as x is; refused when m is a numpy array that tasks would read by position."""
    return hd.compute(x.shape, lambda i, j: x[i, j] * m[i, j])


@hd.func
def conv_full(x, w):
    """A 'full' convolution: the output is longer than the input, read through constant_exterior."""
    c = hd.constant_exterior(x)
    kh, kw = w.shape
    r, s = hd.rdom(kh, kw)
    shape = (x.shape[0] + kh - 1, x.shape[1] + kw - 1)
    return hd.compute(shape, lambda i, j: hd.sum(c[i + r - kh + 1, j + s - kw + 1] * w[r, s]))


@hd.func
def wide_mirror(x):
    """A mirror read 3 past each side: on an axis of 3 it folds more than once."""
    m = hd.mirror(x)
    return hd.compute(x.shape, lambda i, j: m[i - 3, j] + 2.0 * m[i + 3, j] + m[i, j])


@hd.func
def tone_curve(levels, table):
    """A lookup: each pixel's level indexes a small table (a numpy argument)."""
    n = table.shape[0]
    return hd.compute(levels.shape, lambda i, j: table[hd.clamp(levels[i, j], 0, n - 1)] * 2.0)


@hd.func
def conv_relu_pool(x, w, b):
    """halide_ad.ops layers on NCHW images: a padded convolution, relu, 2x2 max pool."""
    from halide_ad import ops
    return ops.max_pool2d(ops.relu(ops.conv2d(x, w, b, stride=1, padding=1)), 2)


@hd.func
def conv_only(x, w):
    """halide_ad.ops.conv2d alone, padded: big enough images take the direct convolution kernels."""
    from halide_ad import ops
    return ops.conv2d(x, w, stride=1, padding=1)


@hd.func
def row_scans(x):
    """An update definition (a running sum along each row): not chunked yet."""
    return ops.cumsum(x, 1)


@hd.func
def conv1d_channels(x, w):
    """A padded 1-D convolution of channels: small enough for BLAS, not the direct kernels."""
    return ops.conv1d(x, w, padding=1)


SHARPEN = np.array([[0.0, -1.0, 0.0], [-1.0, 5.0, -1.0], [0.0, -1.0, 0.0]])  # read as a global
GAINS = np.linspace(0.5, 1.5, 26)  # a global read at each row: refused on chunked rows


@hd.func
def sharpened(x):
    """A 3x3 filter whose weights the function reads from a module global (a captured array)."""
    e, k = hd.repeat_edge(x), hd.repeat_edge(SHARPEN)
    r, s = hd.rdom(3, 3)
    return hd.compute(x.shape, lambda i, j: hd.sum(e[i + r - 1, j + s - 1] * k[r, s]))


@hd.func
def row_gains(x):
    g = hd.repeat_edge(GAINS)
    return hd.compute(x.shape, lambda i, j: x[i, j] * g[i])


@hd.func
def patches(x, w):
    """A 2x2 convolution at stride 2, of non-overlapping patches: the outputs that read an input
    chunk are the chunk's own."""
    r, s = hd.rdom(2, 2)
    return hd.compute((x.shape[0] // 2, x.shape[1] // 2), lambda i, j: hd.sum(x[2 * i + r, 2 * j + s] * w[r, s]))
