"""Update definitions shared by the tests, at module level so each compiles once."""
import halide_ad as hd


@hd.func
def histogram(idx, w, bins):
    h = hd.zeros((bins,), w.dtype)
    r = hd.rdom(idx.shape[0])
    h[hd.clamp(idx[r], 0, bins - 1)] += w[r]
    return h


@hd.func
def histogram_loss(idx, w, bins):
    return hd.sum(histogram(idx, w, bins) ** 2)


@hd.func
def counts(idx, bins):
    h = hd.zeros((bins,), "int32")
    r = hd.rdom(idx.shape[0])
    h[hd.clamp(idx[r], 0, bins - 1)] += 1
    return h


@hd.func
def unclamped(idx, w, bins):
    h = hd.zeros((bins,), w.dtype)
    r = hd.rdom(idx.shape[0])
    h[idx[r]] += w[r]
    return h


@hd.func
def iir(a, b):  # SPEC §1b: y[m, n] = a[m, n] * y[m, n-1] + b[m, n]
    M, N = b.shape
    y = hd.compute((M, N), lambda m, n: b[m, n])
    m, r = hd.var(), hd.rdom((1, N))
    y[m, r] = a[m, r] * y[m, r - 1] + b[m, r]
    return y


@hd.func
def rnn(w, u):  # h[n] = tanh(w h[n-1] + u[n])
    h = hd.compute(u.shape, lambda n: hd.tanh(u[n]))
    r = hd.rdom((1, u.shape[0]))
    h[r] = hd.tanh(w[0] * h[r - 1] + u[r])
    return h


@hd.func
def cumsum(x):
    c = hd.compute(x.shape, lambda i: x[i])
    r = hd.rdom((1, x.shape[0]))
    c[r] += c[r - 1]
    return c


@hd.func
def strided_scatter(x):  # out[2r] += x[r]: disjoint affine writes
    out = hd.full((2 * x.shape[0],), 1.0, x.dtype)
    r = hd.rdom(x.shape[0])
    out[2 * r] += x[r] * x[r]
    return out


@hd.func
def overwrite(x, w):  # y = 3x, then y[r + 1] = w[r]: the overwritten x get no gradient
    y = hd.compute(x.shape, lambda i: 3 * x[i])
    r = hd.rdom(w.shape[0])
    y[r + 1] = hd.sin(w[r]) * y[r + 1]
    return y


@hd.func
def inplace_max(x, z):  # y[i] = max(y[i], z[i]), pure i: ties go to the old value
    y = hd.compute(x.shape, lambda i: x[i])
    i = hd.var()
    y[i] = hd.maximum(y[i], z[i])
    return y


@hd.func
def two_updates(x):  # updates apply in program order; later reads see them
    t = hd.zeros((4,), x.dtype)
    r = hd.rdom(x.shape[0])
    t[r % 4] += x[r]
    t[0] *= 2.0
    return hd.compute((4,), lambda i: t[i] + t[3 - i])


@hd.func
def ring(x):  # reads elements that later points overwrite: the gradient rolls back through a tape
    c = hd.compute(x.shape, lambda i: x[i])
    r = hd.rdom(6)
    c[r % 3] += c[(r + 1) % 3]
    return c


@hd.func
def horner(c, x):  # p(x) = c[0] x^(K-1) + ... + c[K-1], Halide's horner_polynomial
    p = hd.zeros(x.shape, x.dtype)
    i, r = hd.var(), hd.rdom(c.shape[0])
    p[i] = p[i] * x[i] + c[r]
    return p


@hd.func
def row_max(x):  # an in-place max over colliding writes
    t = hd.full((x.shape[0],), -1.0, x.dtype)
    i, r = hd.var(), hd.rdom(x.shape[1])
    t[i] = hd.maximum(t[i], x[i, r])
    return t


@hd.func
def assign(idx, w):  # colliding assignments: the last write wins
    t = hd.zeros((3,), w.dtype)
    r = hd.rdom(idx.shape[0])
    t[hd.clamp(idx[r], 0, 2)] = 2 * w[r]
    return t


@hd.func
def hist2d(i, j, w):  # 2-D bins
    h = hd.zeros((4, 5), w.dtype)
    r = hd.rdom(i.shape[0])
    h[hd.clamp(i[r], 0, 3), hd.clamp(j[r], 0, 4)] += w[r]
    return h


@hd.func
def row_hist(idx, w):  # a histogram per row: the pure variable runs in parallel
    M, N = idx.shape
    h = hd.zeros((M, 3), w.dtype)
    m, r = hd.var(), hd.rdom(N)
    h[m, hd.clamp(idx[m, r], 0, 2)] += w[m, r]
    return h


@hd.func
def ends(x):  # constant indices: t[0] += x[r] accumulates (Halide's f(0) += x(r)); -1 is the last
    t = hd.zeros((3,), x.dtype)
    r = hd.rdom(x.shape[0])
    t[0] += x[r]
    t[-1] -= x[r] * x[r]
    return t


@hd.func
def sum_of_squares(x):  # a 0-d tensor
    s = hd.zeros((), x.dtype)
    r = hd.rdom(x.shape[0])
    s[()] += x[r] * x[r]
    return s


@hd.func
def masked(x):  # an rdom with a predicate
    t = hd.zeros((5,), x.dtype)
    r = hd.rdom(x.shape[0], where=lambda r: x[r] > 0.5)
    t[r % 5] += x[r]
    return t


@hd.func
def pairs(x):  # out[r // 2] += x[r]: colliding affine writes, inverted into a gather (rung 2)
    out = hd.full((x.shape[0] // 2 + 1,), 0.5, x.dtype)
    r = hd.rdom(x.shape[0])
    out[r // 2] += x[r] * x[r]
    return out


@hd.func
def suffix_sum(x):  # Halide's reverse_scan: the rdom walks the tensor from its end
    n = x.shape[0]
    c = hd.compute(x.shape, lambda i: x[i])
    r = hd.rdom(n - 1)
    c[n - 2 - r] += c[n - 1 - r]
    return c


@hd.func
def binned(x):  # the bins come from x through a floor: `level` gets no gradient, only the weights do
    level = hd.compute(x.shape, lambda i: 3 * x[i], name="level")
    h = hd.zeros((4,), x.dtype)
    r = hd.rdom(x.shape[0])
    h[hd.clamp(hd.cast(hd.floor(level[r]), "int64"), 0, 3)] += x[r] * x[r]
    return h
