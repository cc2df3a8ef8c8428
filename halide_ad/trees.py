"""Results and cotangents as small pytrees: arrays (or Tensors) in tuples, lists and dicts."""
from __future__ import annotations

import numpy as np

from halide_ad.errors import TraceError
from halide_ad.tensor import BoundaryView, Tensor


def flatten(obj, where: str = "the result"):
    """(leaves, rebuild) for a Tensor or a tuple/list/dict of them."""
    if isinstance(obj, BoundaryView):
        obj = obj.tensor
    if isinstance(obj, Tensor):
        return [obj], lambda leaves: leaves[0]
    if isinstance(obj, (tuple, list)):
        parts = [flatten(x, where) for x in obj]
        sizes = [len(p[0]) for p in parts]

        def rebuild(leaves, kind=type(obj)):
            out, k = [], 0
            for (_, rb), n in zip(parts, sizes, strict=True):
                out.append(rb(leaves[k:k + n]))
                k += n
            return kind(out)
        return [leaf for p in parts for leaf in p[0]], rebuild
    if isinstance(obj, dict):
        keys = list(obj)
        leaves, rebuild_values = flatten([obj[k] for k in keys], where)
        return leaves, lambda ls: dict(zip(keys, rebuild_values(ls), strict=True))
    raise TraceError(f"{where} must be an hd.Tensor or a tuple, list or dict of them; got "
                     f"{type(obj).__name__}")


def leaves_like(structure, value, count: int) -> list:
    """The leaves of `value`, which has the outputs' structure (`Traced.structure`)."""
    leaves = [None] * count

    def walk_pair(shape, v):
        if isinstance(shape, int):
            leaves[shape] = v
        elif isinstance(shape, dict):
            if set(shape) != set(v):
                raise KeyError(set(shape) ^ set(v))
            for k in shape:
                walk_pair(shape[k], v[k])
        else:
            if len(shape) != len(v):
                raise ValueError("length")
            for s, x in zip(shape, v, strict=True):
                walk_pair(s, x)

    walk_pair(structure, value)
    return leaves


def flatten_values(obj) -> list[np.ndarray]:
    """The arrays of a result with the outputs' structure, in order."""
    if isinstance(obj, np.ndarray):
        return [obj]
    if isinstance(obj, dict):
        return [a for v in obj.values() for a in flatten_values(v)]
    return [a for v in obj for a in flatten_values(v)]


def restructure(out, leaves):
    """`leaves` arranged in the structure of `out`."""
    it = iter(leaves)

    def go(o):
        if isinstance(o, np.ndarray):
            return next(it)
        if isinstance(o, dict):
            return {k: go(v) for k, v in o.items()}
        return type(o)(go(v) for v in o)
    return go(out)
