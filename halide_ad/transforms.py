"""The reverse-mode transformations: `hd.vjp`, `hd.grad`, `hd.value_and_grad`. Called on arrays they
compile the gradient program (halide_ad/compiler.py); called while tracing they write it into the
enclosing program (halide_ad/retrace.py)."""
from __future__ import annotations

import functools
import numbers
from dataclasses import dataclass

import numpy as np

from halide_ad import ir, retrace, tiered
from halide_ad.runtime import direct
from halide_ad.api import FORWARD, as_function, Traced
from halide_ad.arguments import call_key
from halide_ad.errors import DTypeError, NotDifferentiableError, ShapeError
from halide_ad.trace import current
from halide_ad.trees import leaves_like


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
    if current() is not None:  # inside a trace: the gradient becomes Funcs of that program
        return retrace.vjp(fn, args, kwargs)
    f = as_function(fn)
    traced, arrays = f.trace(args, kwargs)
    buffers = traced.run(arrays)
    out = traced.outputs(buffers)
    written = None  # the backward written out (`Traced.direct_vjp`), once the kernels ran it

    def vjp_fn(cotangent):
        nonlocal written
        if written:
            grads = written(buffers, cotangent)
            if grads is not None:  # else a cotangent to check and convert
                return grads
        cts = _cotangents(traced, cotangent, getattr(f.fn, "__name__", "fn"))
        grads = traced.gradients(traced.gradient_of(traced.float_args, buffers, cts))
        if written is None and tiered.INTERPRETED not in buffers:
            written = traced.direct_vjp()
        return grads

    return out, vjp_fn


def _cotangents(traced: Traced, cotangent, fn_name: str) -> dict[str, np.ndarray]:
    program = traced.program
    try:
        leaves = leaves_like(traced.structure(), cotangent, len(program.outputs))
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


@dataclass(frozen=True)
class _ScalarGradient:
    """What `value_and_grad` works out once per signature and argnums: the gradient's inputs,
    the scalar output it seeds with 1, and where each requested gradient is."""
    traced: Traced
    wrt: tuple[str, ...]
    out: str
    seed: np.ndarray  # shape (1,), as kernels see the 0-d output; copied for each call
    results: tuple[tuple[str, bool], ...]  # (buffer, whether 0-d) for each of argnums

    def __call__(self, buffers: dict[str, np.ndarray]) -> tuple:
        grads = self.traced.gradient_of(self.wrt, buffers, {self.out: self.seed.copy()})
        return tuple(grads[name].reshape(()) if scalar else grads[name] for name, scalar in self.results)

    def direct(self, call, single: bool):
        """value_and_grad's whole call for `call`'s signature written out (`direct.value_and_grad`),
        once the kernels of the forward and the gradient run; see `Traced.direct_ready`."""
        traced = self.traced
        ready = traced.direct_ready(FORWARD, self.wrt)
        if not ready:
            return ready
        return direct.value_and_grad(traced.forward_run(), traced.backward(self.wrt), call.sources(),
                                     self.out, self.seed, self.results, single)


def _scalar_output(traced: Traced, fn_name: str) -> str:
    program = traced.program
    if len(program.outputs) != 1 or program.func(program.outputs[0]).shape != ():
        shapes = [program.func(o).shape for o in program.outputs]
        raise NotDifferentiableError(f"hd.grad needs {fn_name} to return one scalar (shape ()), but it "
                                     f"returned shape(s) {shapes}; reduce it (e.g. hd.sum) or use hd.vjp")
    return program.outputs[0]


def value_and_grad(fn, argnums=0):
    """A function returning (fn(*args), gradient): like jax.value_and_grad, for scalar outputs."""
    single = isinstance(argnums, int)
    nums = (argnums,) if single else tuple(argnums)
    # Only ints can be argnums; anything else raises below on every call, and may be unhashable.
    cached = all(isinstance(k, numbers.Integral) and not isinstance(k, bool) for k in nums)
    function = None

    def wrapped(*args, **kwargs):
        nonlocal function
        if current() is not None:  # inside a trace: the gradient becomes Funcs of that program
            return retrace.value_and_grad(fn, nums, single, args, kwargs)
        if function is None:
            function = as_function(fn)
        key = call_key(args, kwargs)
        call = function._calls.get(key) if cached else None
        if call is not None:
            written = call.gradients.get(nums)
            if written:
                return written(args, kwargs)
        traced, arrays = function.trace(args, kwargs, key)
        gradient = traced.scalar_gradients.get(nums) if cached else None
        if gradient is None:  # the first call for this signature: check, run, then compile
            name = getattr(function.fn, "__name__", "fn")
            out = _scalar_output(traced, name)
            wrt = _differentiable(traced, nums, name)
            buffers = traced.run(arrays)
            program = traced.program
            gradient = _ScalarGradient(traced, wrt, out, np.ones(1, program.func(out).dtype),
                                       tuple((traced.arg_names[k], program.buffer(traced.arg_names[k]).shape == ())
                                             for k in nums))
            if cached:
                traced.scalar_gradients[nums] = gradient
        else:
            buffers = traced.run(arrays)
        results = gradient(buffers)
        if call is not None and call.gradients.get(nums) is None:
            call.gradients[nums] = gradient.direct(call, single)
        return traced.outputs(buffers)[()], (results[0] if single else results)

    return wrapped


def grad(fn, argnums=0):
    """A function returning the gradient of scalar-valued `fn`, like jax.grad."""
    vg = value_and_grad(fn, argnums)
    return functools.wraps(fn)(lambda *args, **kwargs: vg(*args, **kwargs)[1])


