"""The public entry points: `@hd.func`, `hd.vjp`, `hd.grad`, `hd.value_and_grad`."""
from __future__ import annotations

import functools
import inspect
import numbers
import re
import threading
import weakref
from dataclasses import dataclass, field

import numpy as np

from halide_ad import ir
from halide_ad.compiler import (AdjointPlan, Kernel, compile_forward, compile_gradient, run_backward,
                                run_forward)
from halide_ad.errors import DTypeError, NotDifferentiableError, ShapeError, SourceLoc, TraceError, user_loc
from halide_ad.tensor import BoundaryView, Tensor
from halide_ad.trace import TraceState, current, tracing
from halide_ad.traverse import walk

_STATIC_TYPES = (numbers.Number, str, bytes, type(None), np.dtype, type)


# ---- outputs as a small pytree ------------------------------------------------------------------

def _flatten(obj, where: str = "the result"):
    """(leaves, rebuild) for a Tensor or a tuple/list/dict of them."""
    if isinstance(obj, BoundaryView):
        obj = obj.tensor
    if isinstance(obj, Tensor):
        return [obj], lambda leaves: leaves[0]
    if isinstance(obj, (tuple, list)):
        parts = [_flatten(x, where) for x in obj]
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
        leaves, rebuild_values = _flatten([obj[k] for k in keys], where)
        return leaves, lambda ls: dict(zip(keys, rebuild_values(ls), strict=True))
    raise TraceError(f"{where} must be an hd.Tensor or a tuple, list or dict of them; got "
                     f"{type(obj).__name__}")


# ---- arguments ----------------------------------------------------------------------------------

def _is_static(value) -> bool:
    """Python numbers, strings, dtypes, None, and (nested) tuples of them: hashable options."""
    return isinstance(value, _STATIC_TYPES) or (isinstance(value, tuple) and all(_is_static(v) for v in value))


def _classify(name: str, value):
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


def _param_names(fn, count: int) -> list[str]:
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        params = []
    names = []
    for k in range(count):
        if k < len(params) and params[k].kind in (inspect.Parameter.POSITIONAL_ONLY,
                                                   inspect.Parameter.POSITIONAL_OR_KEYWORD):
            names.append(params[k].name)
        else:
            names.append(f"arg{k}")
    return names


@dataclass
class Traced:
    """One traced signature: the program, its forward kernel, and gradient kernels by `wrt`."""
    program: ir.Program
    rebuild: object
    arg_names: list[str]           # buffer name for each positional array argument, else None
    kinds: list[str]
    _grads: dict = field(default_factory=dict)
    _forward: Kernel | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def forward_kernel(self) -> Kernel:
        with self._lock:
            if self._forward is None:
                self._forward = compile_forward(self.program)
            return self._forward

    def gradient(self, wrt: tuple[str, ...]) -> tuple[Kernel, list[AdjointPlan]]:
        with self._lock:
            if wrt not in self._grads:
                self._grads[wrt] = compile_gradient(self.program, wrt)
            return self._grads[wrt]

    def run(self, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return run_forward(self.program, self.forward_kernel(), arrays)

    def outputs(self, buffers: dict[str, np.ndarray]):
        return self.rebuild([buffers[o].reshape(self.program.func(o).shape) for o in self.program.outputs])


class Function:
    """What `@hd.func` returns: called with arrays it compiles (once per signature) and runs;
    called while tracing it inlines."""

    def __init__(self, fn):
        if not callable(fn):
            raise TraceError(f"hd.func needs a function, got {type(fn).__name__}")
        functools.update_wrapper(self, fn)
        self.fn = fn
        self._traces: dict = {}
        self._lock = threading.Lock()
        try:
            self._signature = inspect.signature(fn)
        except (TypeError, ValueError):  # some builtins and C functions have none
            self._signature = None

    def __repr__(self) -> str:
        return f"<hd.func {getattr(self.fn, '__qualname__', self.fn)}>"

    def __call__(self, *args, **kwargs):
        if current() is not None:
            self._check_arguments(args, kwargs)
            return self.fn(*args, **kwargs)
        traced, arrays = self.trace(args, kwargs)
        return traced.outputs(traced.run(arrays))

    def _check_arguments(self, args: tuple, kwargs: dict) -> None:
        """Too many, too few or unknown arguments: the caller's mistake, named before tracing."""
        if self._signature is None:
            return
        try:
            self._signature.bind(*args, **kwargs)
        except TypeError as e:
            name = getattr(self.fn, "__name__", "fn")
            raise ShapeError(f"{name}{self._signature} was called with {len(args)} positional and "
                             f"{len(kwargs)} keyword argument(s): {e}", user_loc()) from None

    def trace(self, args: tuple, kwargs: dict) -> tuple[Traced, dict[str, np.ndarray]]:
        self._check_arguments(args, kwargs)
        names = _param_names(self.fn, len(args))
        classified = [_classify(n, a) for n, a in zip(names, args, strict=True)]
        kw = {k: _classify(k, v) for k, v in sorted(kwargs.items())}
        for kind, v in classified + list(kw.values()):
            if kind == "tensor":
                raise TraceError(f"{self!r} got a symbolic tensor outside a trace")
        key = (tuple((k, v.shape, v.dtype.str) if k == "array" else (k, type(v), v) for k, v in classified),
               tuple((name, k, (v.shape, v.dtype.str) if k == "array" else v) for name, (k, v) in kw.items()))
        arrays = {n: v for n, (k, v) in zip(names, classified, strict=True) if k == "array"}
        arrays |= {n: v for n, (k, v) in kw.items() if k == "array"}
        with self._lock:
            traced = self._traces.get(key)
            if traced is None:
                traced = self._traces[key] = self._trace(names, classified, kw)
        return traced, arrays

    def _trace(self, names, classified, kw) -> Traced:
        state = TraceState(getattr(self.fn, "__name__", "fn"))
        for n in list(names) + list(kw):
            state.names.add(n)

        def symbolic(name, kind, value):
            if kind != "array":
                return value
            buf = ir.Buffer(name, tuple(value.shape), value.dtype.name)
            state.inputs.append(buf)
            return Tensor(buf)

        with tracing(state):
            sym_args = [symbolic(n, k, v) for n, (k, v) in zip(names, classified, strict=True)]
            sym_kwargs = {n: symbolic(n, k, v) for n, (k, v) in kw.items()}
            try:
                result = self.fn(*sym_args, **sym_kwargs)
            except (AttributeError, TypeError) as e:  # e.g. x.shape or x[i] where x is None or 3.0
                statics = {n: v for n, (k, v) in list(zip(names, classified)) + list(kw.items())
                           if k == "static"}
                error = _static_used_as_array(e, statics, getattr(self.fn, "__name__", "fn"))
                if error is None:
                    raise
                raise error from e
            leaves, rebuild = _flatten(result, f"the result of {self.fn.__name__}")
            outputs = []
            for leaf in leaves:
                if leaf.name in outputs or leaf.name in {b.name for b in state.inputs}:
                    leaf = _copy(leaf)  # every output gets a buffer of its own
                outputs.append(leaf.name)
        program = ir.Program(state.name, tuple(state.inputs), _live_funcs(state.funcs, outputs), tuple(outputs))
        arg_names = [n if k == "array" else None for n, (k, _) in zip(names, classified, strict=True)]
        return Traced(program, rebuild, arg_names, [k for k, _ in classified])


_ARRAY_ATTRIBUTES = frozenset({"shape", "ndim", "dtype", "size", "T", "sum", "mean", "max", "min",
                               "prod", "reshape", "transpose"})


def _static_used_as_array(e: Exception, statics: dict, fn_name: str) -> TraceError | None:
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


def _copy(t: Tensor) -> Tensor:
    from halide_ad.tensor import compute
    return compute(t.shape, lambda *i: t[i], name=f"{t.name}_out")


def _live_funcs(funcs: list[ir.Func], outputs: list[str]) -> tuple[ir.Func, ...]:
    live = set(outputs)
    for f in reversed(funcs):
        if f.name in live:
            live.update(n.buffer for n in walk(f.body) if isinstance(n, ir.Load))
    return tuple(f for f in funcs if f.name in live)


_wrapped: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_wrapped_lock = threading.Lock()


def func(fn) -> Function:
    """Decorator: trace `fn` over symbolic hd.Tensors and compile it (see the README)."""
    return fn if isinstance(fn, Function) else Function(fn)


def as_function(fn) -> Function:
    """`fn` itself if decorated; a plain function is traced as if decorated, and cached the same way."""
    if isinstance(fn, Function):
        return fn
    with _wrapped_lock:
        try:
            f = _wrapped.get(fn)
        except TypeError:
            return Function(fn)
        if f is None:
            f = _wrapped[fn] = Function(fn)
        return f


# ---- gradients ----------------------------------------------------------------------------------

def _differentiable(traced: Traced, argnums: tuple[int, ...], fn_name: str) -> tuple[str, ...]:
    wrt = []
    for k in argnums:
        if not isinstance(k, numbers.Integral) or isinstance(k, bool):
            raise NotDifferentiableError(f"argnums must be an int or a tuple of ints, got {k!r}")
        if not -len(traced.kinds) <= k < len(traced.kinds):
            raise NotDifferentiableError(f"argnums={k} but {fn_name} was called with "
                                         f"{len(traced.kinds)} positional argument(s)")
        name = traced.arg_names[k]
        if name is None:
            raise NotDifferentiableError(f"argument {k} of {fn_name} is a static value, not an array; "
                                         "only float32/float64 array arguments have gradients")
        if not ir.is_float(traced.program.buffer(name).dtype):
            raise NotDifferentiableError(f"argument {k} ({name!r}) of {fn_name} is a "
                                         f"{traced.program.buffer(name).dtype} array: integer and "
                                         "bool arrays are data, not differentiable")
        wrt.append(name)
    return tuple(dict.fromkeys(wrt))


def vjp(fn, *args, **kwargs):
    """(fn(*args), vjp_fn): vjp_fn(cotangent) returns one gradient per positional argument
    (None for static and integer arguments)."""
    f = as_function(fn)
    traced, arrays = f.trace(args, kwargs)
    buffers = traced.run(arrays)
    out = traced.outputs(buffers)
    wrt = tuple(n for n in traced.arg_names if n is not None and ir.is_float(traced.program.buffer(n).dtype))
    name = getattr(f.fn, "__name__", "fn")

    def vjp_fn(cotangent):
        cts = _cotangents(traced, cotangent, name)
        kernel, plans = traced.gradient(wrt)
        grads = run_backward(kernel, plans, buffers, cts)
        return tuple(None if n is None or n not in grads else
                     grads[n].reshape(traced.program.buffer(n).shape) for n in traced.arg_names)

    return out, vjp_fn


def _cotangents(traced: Traced, cotangent, fn_name: str) -> dict[str, np.ndarray]:
    program = traced.program
    try:
        leaves = _leaves_like(traced.rebuild, cotangent, len(program.outputs))
    except (TypeError, ValueError, KeyError):
        raise ShapeError(f"the cotangent must have the structure of {fn_name}'s outputs") from None
    out = {}
    for name, ct in zip(program.outputs, leaves, strict=True):
        f = program.func(name)
        ct = np.asarray(ct)
        if ct.shape != f.shape:
            raise ShapeError(f"the cotangent for output {name!r} has shape {ct.shape}; it must be "
                             f"{f.shape}, the output's shape")
        if ct.dtype.kind not in "fiu":
            raise DTypeError(f"the cotangent for output {name!r} has dtype {ct.dtype}; use a float array")
        out[name] = np.ascontiguousarray(ct, dtype=f.dtype if ir.is_float(f.dtype) else "float64")
    return out


def _leaves_like(rebuild, value, count: int) -> list:
    """The leaves of `value`, which has the outputs' structure."""
    probe = rebuild(list(range(count)))
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

    walk_pair(probe, value)
    return leaves


def value_and_grad(fn, argnums=0):
    """A function returning (fn(*args), gradient): like jax.value_and_grad, for scalar outputs."""
    single = isinstance(argnums, int)
    nums = (argnums,) if single else tuple(argnums)

    def wrapped(*args, **kwargs):
        f = as_function(fn)
        traced, arrays = f.trace(args, kwargs)
        name = getattr(f.fn, "__name__", "fn")
        program = traced.program
        if len(program.outputs) != 1 or program.func(program.outputs[0]).shape != ():
            shapes = [program.func(o).shape for o in program.outputs]
            raise NotDifferentiableError(f"hd.grad needs {name} to return one scalar (shape ()), but it "
                                         f"returned shape(s) {shapes}; reduce it (e.g. hd.sum) or use hd.vjp")
        wrt = _differentiable(traced, nums, name)
        buffers = traced.run(arrays)
        out = program.outputs[0]
        kernel, plans = traced.gradient(wrt)
        grads = run_backward(kernel, plans, buffers, {out: np.ones((), program.func(out).dtype)})
        results = tuple(grads[traced.arg_names[k]].reshape(program.buffer(traced.arg_names[k]).shape)
                        for k in nums)
        return traced.outputs(buffers)[()], (results[0] if single else results)

    return wrapped


def grad(fn, argnums=0):
    """A function returning the gradient of scalar-valued `fn`, like jax.grad."""
    vg = value_and_grad(fn, argnums)
    return functools.wraps(fn)(lambda *args, **kwargs: vg(*args, **kwargs)[1])


def _flatten_values(obj) -> list[np.ndarray]:
    """The arrays of a result with the outputs' structure, in order."""
    if isinstance(obj, np.ndarray):
        return [obj]
    if isinstance(obj, dict):
        return [a for v in obj.values() for a in _flatten_values(v)]
    return [a for v in obj for a in _flatten_values(v)]
