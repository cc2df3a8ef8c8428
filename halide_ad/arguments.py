"""A traced function's arguments: each one classified as an array (data), a Tensor, or a static
option (`classify`, with a clear error for anything else); the cheap dispatch key a call's
arguments give (`call_key`); and the error for a static option used as an array."""
from __future__ import annotations

import numbers
import re

import numpy as np

from halide_ad.errors import DTypeError, ShapeError, SourceLoc, TraceError
from halide_ad.tensor import BoundaryView, Tensor

_STATIC_TYPES = (numbers.Number, str, bytes, type(None), np.dtype, type)


def _is_static(value) -> bool:
    """Python numbers, strings, dtypes, None, and (nested) tuples of them: hashable options."""
    return isinstance(value, _STATIC_TYPES) or (isinstance(value, tuple) and all(_is_static(v) for v in value))


def classify(name: str, value):
    """('array', ndarray) for arrays, ('static', value) for the rest, or a clear error."""
    if isinstance(value, np.ndarray):
        if value.dtype.kind not in "fiub" or value.dtype.name in ("float16", "longdouble", "float128"):
            raise DTypeError(f"argument {name!r} has dtype {value.dtype}; halide_ad takes float32 "
                             "and float64 arrays (differentiable) and integer or bool arrays (data)")
        if value.size == 0:
            raise ShapeError(f"argument {name!r} has shape {value.shape}, with no elements; every "
                             "dimension must be at least 1")
        if not value.dtype.isnative:  # numba compiles native byte order only
            value = value.astype(value.dtype.newbyteorder("="))
        return "array", np.asarray(value, order="C")  # np.ascontiguousarray would make 0-d arrays 1-d
    if isinstance(value, (Tensor, BoundaryView)):
        return "tensor", value
    if isinstance(value, (np.number, np.bool_)):  # a numpy scalar is a static option, as a Python number
        return "static", value.item()
    if _is_static(value):
        return "static", value
    if isinstance(value, list) and _is_static(tuple(value)):  # a list option, kept hashable
        return "static", tuple(value)
    raise TraceError(f"argument {name!r} is a {type(value).__name__}; pass numpy arrays for data "
                     "and ints, floats, strings or tuples of them for static options "
                     "(convert with np.asarray)")


_PLAIN_STATIC_TYPES = frozenset({int, float, bool, str, type(None)})


def _plain_static(value) -> bool:
    """A number, string or None, or a (nested) tuple of them: a static option that is its own
    dispatch key (hashable, compared by value, passed on unchanged by `classify`)."""
    t = type(value)
    return t in _PLAIN_STATIC_TYPES or (t is tuple and all(_plain_static(v) for v in value))


def call_key(args: tuple, kwargs: dict) -> tuple | None:
    """What fixes a call's Traced, read cheaply from the arguments: each array's shape and dtype,
    each static option's type and value, and the keywords' names. Equal keys mean equal
    signatures in `Function.trace` (halide_ad/api.py) (which classifies every argument first). None for any other
    argument (a numpy scalar, a list, an array subclass, ...): such calls classify each time."""
    key = []
    for a in args:  # (appends, not `key += (...)`: this runs on every call, ~0.1 us a step)
        if type(a) is np.ndarray:
            key.append(a.shape)
            key.append(a.dtype)
        elif _plain_static(a):
            key.append(type(a))
            key.append(a)
        else:
            return None
    for name, a in kwargs.items() if kwargs else ():
        t = type(a)
        if t is np.ndarray:
            key += (name, a.shape, a.dtype)
        elif _plain_static(a):
            key += (name, t, a)
        else:
            return None
    return tuple(key)



_ARRAY_ATTRIBUTES = frozenset({"shape", "ndim", "dtype", "size", "T", "sum", "mean", "max", "min",
                               "prod", "reshape", "transpose"})


def static_used_as_array(e: Exception, statics: dict, fn_name: str) -> TraceError | None:
    """A TraceError when `e` comes from a static argument (a number, a string, None) used as an
    array: an array attribute (`x.shape`) or indexing (`x[i]`)."""
    tb = e.__traceback__
    while tb.tb_next is not None:
        tb = tb.tb_next
    if isinstance(e, AttributeError):
        if getattr(e, "name", None) not in _ARRAY_ATTRIBUTES:
            return None
        matches = [(n, v) for n, v in statics.items() if e.obj is v]
        use = f"{{name}}.{e.name}"
    else:  # the failing line's frame holds the very object that was subscripted
        subscripted = re.fullmatch(r"'(\w+)' object is not subscriptable", str(e))
        if subscripted is None:
            return None
        local_ids = {id(v) for v in tb.tb_frame.f_locals.values()}
        matches = [(n, v) for n, v in statics.items()
                   if type(v).__name__ == subscripted[1] and id(v) in local_ids]
        use = "{name}[...]"
    if not matches:
        return None
    name, value = matches[0]
    loc = SourceLoc(tb.tb_frame.f_code.co_filename, tb.tb_lineno, tb.tb_frame.f_code.co_name)
    return TraceError(f"argument {name!r} of {fn_name} is {type(value).__name__} {value!r}, but "
                      f"{fn_name} uses it as an array ({use.format(name=name)}): pass a numpy array "
                      "(ints, floats, strings and None are static options, not data)", loc)
