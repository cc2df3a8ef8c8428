"""Scans and scatters, written as update definitions (docs/updates.md): cumulative sums and
products, PyTorch's index_add and scatter_add, segment sums, bincount, histograms and
embedding_bag. Their gradients are derived like any others: a scan's runs it backwards, an
accumulation's reads the output's adjoint at each written element (a gather for the values).
"""
from __future__ import annotations

import halide_ad as hd
from halide_ad.ops import _checks as check


def _copy(x, name: str):
    return hd.compute(x.shape, lambda *i: x[i], name=name)


def _pure(n: int) -> list:
    return [hd.var(f"i{d}") for d in range(n)]


def _scan(op: str, x, axis: int):
    x = check.tensor(op, "x", x)
    a = check.axis(op, axis, x.ndim)
    out = _copy(x, op)
    if x.shape[a] == 1:
        return out
    i = _pure(x.ndim)
    r = hd.rdom((1, x.shape[a]))
    at, before = list(i), list(i)
    at[a], before[a] = r, r - 1
    if op == "cumsum":
        out[tuple(at)] += out[tuple(before)]
    else:
        out[tuple(at)] *= out[tuple(before)]
    return out


@hd.func
def cumsum(x, axis=-1):
    """Running sums along `axis` (torch.cumsum); a serial scan, parallel over the other axes."""
    return _scan("cumsum", x, axis)


@hd.func
def cumprod(x, axis=-1):
    """Running products along `axis` (torch.cumprod); its gradient divides by nothing, so zeros
    are fine."""
    return _scan("cumprod", x, axis)


@hd.func
def index_add(x, axis, index, source):
    """torch.index_add: x with source's slices added at `index` along `axis`. index: 1-d ints, one
    per slice of source along axis; out-of-range indices raise BoundsError at run time."""
    x = check.tensor("index_add", "x", x)
    index = check.int_tensor("index_add", "index", index)
    source = check.tensor("index_add", "source", source)
    a = check.axis("index_add", axis, x.ndim)
    if index.ndim != 1 or source.ndim != x.ndim or source.shape[a] != index.shape[0] or any(
            source.shape[d] != x.shape[d] for d in range(x.ndim) if d != a):
        raise hd.ShapeError(f"ops.index_add: source {source.shape} must be x's shape {x.shape} with axis {a} "
                            f"as long as the 1-d index {index.shape}")
    out = _copy(x, "index_add")
    i = _pure(x.ndim)
    r = hd.rdom(index.shape[0])
    at, src = list(i), list(i)
    at[a], src[a] = index[r], r
    out[tuple(at)] += source[tuple(src)]
    return out


@hd.func
def scatter_add(x, axis, index, src):
    """torch.scatter_add: out[..., index[p], ...] += src[p] at every position p of index (the
    index replaces position p's coordinate along `axis`); index has src's shape."""
    x = check.tensor("scatter_add", "x", x)
    index = check.int_tensor("scatter_add", "index", index)
    src = check.tensor("scatter_add", "src", src)
    a = check.axis("scatter_add", axis, x.ndim)
    if index.shape != src.shape or src.ndim != x.ndim:
        raise hd.ShapeError(f"ops.scatter_add: index {index.shape} and src {src.shape} must have one shape, "
                            f"of x's rank {x.ndim}")
    out = _copy(x, "scatter_add")
    p = hd.rdom(*src.shape)
    p = p if isinstance(p, tuple) else (p,)
    at = list(p)
    at[a] = index[p]
    out[tuple(at)] += src[p]
    return out


@hd.func
def segment_sum(data, segment_ids, num_segments):
    """Sums of data's rows by segment id (tf.math.unsorted_segment_sum): out[s] = sum of data[r]
    over r with segment_ids[r] == s; out has num_segments rows (ids outside raise BoundsError)."""
    data = check.tensor("segment_sum", "data", data)
    ids = check.int_tensor("segment_sum", "segment_ids", segment_ids)
    if ids.ndim != 1 or ids.shape[0] != data.shape[0]:
        raise hd.ShapeError(f"ops.segment_sum: segment_ids {ids.shape} must be 1-d, one per row of data {data.shape}")
    out = hd.zeros((num_segments,) + tuple(data.shape[1:]), data.dtype)
    rest = _pure(data.ndim - 1)
    r = hd.rdom(data.shape[0])
    out[(ids[r], *rest)] += data[(r, *rest)]
    return out


@hd.func
def bincount(x, weights=None, length=None):
    """Counts (or sums of weights) of each value of the 1-d int x, over `length` bins (torch's
    bincount with minlength=length; halide_ad needs the length when it traces). Values outside
    [0, length) raise BoundsError at run time."""
    x = check.int_tensor("bincount", "x", x)
    if length is None or not check.is_int(length) or length < 1:
        raise hd.ShapeError(f"ops.bincount needs length= (a positive int: the number of bins), got {length!r}")
    r = hd.rdom(x.shape[0])
    if weights is None:
        out = hd.zeros((length,), "int64")
        out[x[r]] += 1
        return out
    weights = check.tensor("bincount", "weights", weights, ndim=1)
    out = hd.zeros((length,), weights.dtype)
    out[x[r]] += weights[r]
    return out


@hd.func
def histogram(x, bins, lo, hi, weights=None):
    """torch.histc: `bins` equal bins over [lo, hi] (hi falls in the last bin), values outside
    ignored; with weights, their sums. The counts have no gradient; weights' is a gather."""
    x = check.tensor("histogram", "x", x, ndim=1)
    r = hd.rdom(x.shape[0], where=lambda r: (x[r] >= lo) & (x[r] <= hi))
    k = hd.clamp(hd.cast(hd.floor((x[r] - lo) * (bins / (hi - lo))), "int64"), 0, bins - 1)
    out = hd.zeros((bins,), x.dtype)
    if weights is None:
        out[k] += 1.0
    else:
        weights = check.tensor("histogram", "weights", weights, ndim=1)
        out[k] += weights[r]
    return out


@hd.func
def embedding_bag(weight, indices, offsets, mode="sum"):
    """torch.nn.functional.embedding_bag with 1-d indices: bag b sums (or averages, mode='mean')
    the rows weight[indices[k]] for k in [offsets[b], offsets[b + 1]) (the last bag runs to the
    end). An empty bag is zeros."""
    weight = check.tensor("embedding_bag", "weight", weight, ndim=2)
    indices = check.int_tensor("embedding_bag", "indices", indices)
    offsets = check.int_tensor("embedding_bag", "offsets", offsets)
    check.choice("embedding_bag", "mode", mode, ("sum", "mean"))
    n, bags = indices.shape[0], offsets.shape[0]
    j = hd.rdom(bags)
    bag = hd.compute((n,), lambda k: hd.sum(hd.where(offsets[j] <= k, 1, 0)) - 1, name="bag")
    out = hd.zeros((bags, weight.shape[1]), weight.dtype)
    d, r = hd.var("d"), hd.rdom(n)
    out[hd.clamp(bag[r], 0, bags - 1), d] += weight[indices[r], d]
    if mode == "sum":
        return out
    k = hd.rdom(n)
    count = hd.compute((bags,), lambda b: hd.sum(hd.where(bag[k] == b, 1.0, 0.0)), name="count")
    return hd.compute(out.shape, lambda b, e: out[b, e] / hd.maximum(count[b], 1.0), name="embedding_bag")
