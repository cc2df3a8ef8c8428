"""Captured arrays: a numpy array that a traced function reads from a closure or a global.

    target = np.load(...)
    hd.grad(lambda u: hd.sum((blur(u) - target) ** 2))(u)

`target` is a non-differentiated input of the program (SPEC §1b). When a Tensor operation meets an
ndarray while tracing, `captured` makes it an input buffer and records where the traced function
finds it: a path of steps from the function object, through closure cells and globals (and
through other functions found there, as `blur`'s own globals). Each later call reads the array
afresh along that path (`read`), so its current values are used; a different shape or dtype
retraces. An array found on no path (a temporary computed while tracing, an object's attribute)
is used with the value it had when traced, and the trace is not reused: every call traces again.

A new lambda per call reuses the traces and kernels of the first (`code_key`): lambdas with the
same code and equal closures (arrays compared by shape and dtype) share one Function's caches.
"""
from __future__ import annotations

import types
from dataclasses import dataclass

import numpy as np

from halide_ad import ir
from halide_ad.errors import DTypeError, ShapeError, user_loc
from halide_ad.trace import require

MAX_DEPTH = 4  # function hops searched for a captured array: lambda -> helper -> @hd.func -> ...


@dataclass(frozen=True, slots=True)
class Captured:
    """Input buffer `name` holds the array at `path` (None: not found, the traced value is kept)."""
    name: str
    path: tuple[tuple[str, object], ...] | None
    shape: tuple[int, ...]
    dtype: str


def captured_buffer(array: np.ndarray) -> ir.Buffer:
    """The input buffer of a captured `array` in the trace under way (one per array object);
    `tensor.captured` is its Tensor."""
    state = require("a numpy array")
    entry = state.captured.get(id(array))
    if entry is not None:
        return entry[0]
    if array.dtype.kind not in "fiub" or array.dtype.name in ("float16", "longdouble", "float128"):
        raise DTypeError(f"a captured numpy array has dtype {array.dtype}; halide_ad reads float32, "
                         "float64, integer and bool arrays (convert it with .astype)", user_loc())
    if array.size == 0:
        raise ShapeError(f"a captured numpy array has shape {array.shape}, with no elements", user_loc())
    path = _find(state.root, array)
    base = "captured" if path is None else str(path[-1][-1])
    buf = ir.Buffer(state.fresh_name(base), tuple(array.shape), array.dtype.newbyteorder("=").name)
    state.inputs.append(buf)
    value = np.asarray(array, dtype=buf.dtype, order="C")  # native order (ascontiguousarray makes 0-d 1-d)
    state.captured[id(array)] = (buf, array, value, Captured(buf.name, path, buf.shape, buf.dtype))
    return buf


def trace_results(state) -> tuple[tuple[Captured, ...], dict[str, np.ndarray]]:
    """What a finished trace captured: the records, and the arrays by buffer name."""
    entries = state.captured.values()
    return tuple(e[3] for e in entries), {e[3].name: e[2] for e in entries}


def read(records: tuple[Captured, ...], fn) -> dict[str, np.ndarray] | None:
    """The captured arrays by buffer name, read afresh from `fn`; None when one cannot be reused
    (gone, reshaped, of another dtype, or never found on a path): the caller traces again."""
    out = {}
    for c in records:
        if c.path is None:
            return None
        value = _follow(fn, c.path)
        if type(value) is not np.ndarray or value.shape != c.shape or value.dtype.name != c.dtype:
            return None
        if not value.dtype.isnative:  # numba reads native byte order only
            value = value.astype(value.dtype.newbyteorder("="))
        out[c.name] = np.asarray(value, order="C")
    return out


# ---- where a function finds an array ------------------------------------------------------------

def _referenced(fn: types.FunctionType):
    """(step, value) for each closure cell and each global that `fn`'s code names."""
    code = fn.__code__
    for k, cell in enumerate(fn.__closure__ or ()):
        try:
            yield ("cell", k), cell.cell_contents
        except ValueError:  # an empty cell: a variable not yet assigned
            continue
    for name in _global_names(code):
        if name in fn.__globals__:
            yield ("global", name), fn.__globals__[name]


def _global_names(code: types.CodeType) -> list[str]:
    """The names `code` and the functions defined in it may read as globals."""
    names = list(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names += _global_names(const)
    return names


def _python_function(obj):
    """The plain Python function behind `obj` (an @hd.func's, a custom rule's), or None."""
    if getattr(type(obj), "wraps_python_function", False):
        obj = obj.fn
    return obj if isinstance(obj, types.FunctionType) else None


def _find(root, array: np.ndarray) -> tuple | None:
    """The shortest path of steps from `root` to `array`, breadth first."""
    start = _python_function(root)
    if start is None:
        return None
    frontier, seen = [((), start)], {id(start)}
    for _ in range(MAX_DEPTH):
        following = []
        for path, fn in frontier:
            for step, value in _referenced(fn):
                if value is array:
                    return path + (_named(fn, step),)
                inner = _python_function(value)
                if inner is not None and id(inner) not in seen:
                    seen.add(id(inner))
                    following.append((path + (step,), inner))
        frontier = following
    return None


def _named(fn: types.FunctionType, step: tuple[str, object]) -> tuple[str, object]:
    """A closure step keeps its cell's index and records its variable's name for the buffer."""
    if step[0] == "cell":
        return ("cell", step[1], fn.__code__.co_freevars[step[1]])
    return step


def _follow(fn, path: tuple) -> object:
    obj = fn
    for step in path:
        obj = _python_function(obj)
        if obj is None:
            return None
        if step[0] == "cell":
            cells = obj.__closure__ or ()
            if step[1] >= len(cells):
                return None
            try:
                obj = cells[step[1]].cell_contents
            except ValueError:
                return None
        else:
            obj = obj.__globals__.get(step[1])
    return obj


# ---- one Function for every lambda with the same code --------------------------------------------

_PLAIN = (int, float, bool, str, bytes, type(None))


def code_key(fn, depth: int = 0) -> tuple | None:
    """A key equal for functions that trace alike: the same code, globals and defaults, and
    closures equal but for array values (shape and dtype count). None when a cell holds something
    that cannot be compared so (a list, a dict): such functions are told apart by identity."""
    if not isinstance(fn, types.FunctionType) or depth > MAX_DEPTH:
        return None
    parts = [fn.__code__, id(fn.__globals__)]
    defaults = (*(fn.__defaults__ or ()), *sorted((fn.__kwdefaults__ or {}).items()))
    for value in (*(_cell_value(c) for c in fn.__closure__ or ()), *defaults):
        part = _value_key(value, depth)
        if part is None:
            return None
        parts.append(part)
    for name in _global_names(fn.__code__):  # a global array's shape may be read as a constant
        value = fn.__globals__.get(name)
        if type(value) is np.ndarray:
            parts.append((name, value.shape, value.dtype.str))
        elif isinstance(value, types.FunctionType) or getattr(type(value), "wraps_python_function", False):
            parts.append((name, value))  # (by identity) a global rebound to another function traces another program
    return tuple(parts)


_EMPTY = object()


def _cell_value(cell):
    try:
        return cell.cell_contents
    except ValueError:
        return _EMPTY


def _value_key(value, depth: int):
    if type(value) is np.ndarray:
        return ("array", value.shape, value.dtype.str)
    if type(value) in _PLAIN:
        return (type(value), value)
    if type(value) is tuple:
        parts = tuple(_value_key(v, depth) for v in value)
        return None if any(p is None for p in parts) else ("tuple",) + parts
    if isinstance(value, types.FunctionType):
        inner = code_key(value, depth + 1)
        return None if inner is None else ("fn", inner)
    if value is _EMPTY or getattr(type(value), "wraps_python_function", False) or isinstance(
            value, (types.ModuleType, type, types.BuiltinFunctionType)):
        return ("object", value)  # by identity: what tracing reads from these does not change
    return None  # another object may hold options that tracing reads and the caller changes
