"""Dense Jacobians and Hessians (`hd.jacrev`, `hd.jacobian`, `hd.hessian`) and every adjoint of a
program (`hd.adjoints`), built on `hd.vjp` and `hd.grad`.

A dense Jacobian is meant for small inputs: `jacrev` runs the compiled backward once per element of
the output (a one-hot cotangent each time, the kernels compiled once), and stacks the gradients
into `out.shape + in.shape`, as JAX does. `hessian(f)` is `jacrev(grad(f))`: the gradient is traced
into a program (halide_ad/retrace.py) and differentiated again, reverse over reverse.
"""
from __future__ import annotations

import functools
import numbers

import numpy as np

from halide_ad import ir
from halide_ad.ad import differentiable_buffers
from halide_ad.api import as_function
from halide_ad.trees import flatten_values, restructure
from halide_ad.transforms import _cotangents, _differentiable, grad, vjp
from halide_ad.errors import NotDifferentiableError, ShapeError, TraceError, user_loc
from halide_ad.trace import current


def jacrev(fn, argnums=0):
    """A function returning fn's Jacobian by reverse mode, dense: for each output, an array of shape
    `out.shape + arg.shape` (a tuple of them, one per argument, for a tuple `argnums`), in the
    outputs' structure; as `jax.jacrev`. One backward pass per output element: for small outputs."""
    single = isinstance(argnums, numbers.Integral)
    nums = (argnums,) if single else tuple(argnums)
    name = getattr(fn, "__name__", "fn")

    @functools.wraps(fn)
    def jacobian(*args, **kwargs):
        if current() is not None:
            raise TraceError(f"hd.jacrev({name}) was called while tracing; a dense Jacobian is built "
                             "from arrays, at the top level. Inside a traced function, use hd.vjp or "
                             "hd.grad (their results are part of the program)", user_loc())
        traced, _ = as_function(fn).trace(args, kwargs)
        _differentiable(traced, nums, name)  # argnums that name float arrays, or a clear error
        out, vjp_fn = vjp(fn, *args, **kwargs)
        outs = flatten_values(out)
        rows = []  # per output leaf: per argnum, the gradient of each of its elements
        for k, leaf in enumerate(outs):
            per_arg = [[] for _ in nums]
            for e in range(leaf.size):
                seeds = [np.zeros(o.shape, o.dtype if ir.is_float(o.dtype.name) else "float64") for o in outs]
                seeds[k].reshape(-1)[e] = 1
                grads = vjp_fn(restructure(out, seeds))
                for a, n in enumerate(nums):
                    per_arg[a].append(grads[n])
            jac = tuple(np.stack(g).reshape(leaf.shape + np.shape(args[n]))
                        for g, n in zip(per_arg, nums, strict=True))
            rows.append(jac[0] if single else jac)
        return restructure(out, rows)

    return jacobian


jacobian = jacrev


def hessian(fn, argnums=0):
    """A function returning the dense Hessian of scalar-valued `fn`, shape `arg.shape + arg.shape`
    (nested tuples for a tuple `argnums`), as `jax.hessian`: reverse over reverse."""
    return jacrev(grad(fn, argnums), argnums)


def adjoints(fn, *args, cotangent=None, **kwargs) -> dict[str, np.ndarray]:
    """{name: adjoint} for every float array argument (by parameter name) and every intermediate
    named with `hd.compute(..., name=...)` on a path from one to an output (by the buffer's name:
    the given name, or it with a suffix where two share it), as TVM's `differentiate(...).adjoints`.
    `cotangent` has the outputs' structure; it defaults to 1 for a scalar output."""
    if current() is not None:
        raise TraceError("hd.adjoints returns arrays: call it at the top level, on arrays", user_loc())
    f = as_function(fn)
    name = getattr(f.fn, "__name__", "fn")
    traced, arrays = f.trace(args, kwargs)
    program = traced.program
    if cotangent is None:
        if len(program.outputs) != 1 or program.func(program.outputs[0]).shape != ():
            shapes = [program.func(o).shape for o in program.outputs]
            raise ShapeError(f"{name} returns shape(s) {shapes}, not one scalar, so hd.adjoints needs "
                             "cotangent= (with the outputs' structure)", user_loc())
        cotangent = np.ones((), program.func(program.outputs[0]).dtype)
    cts = _cotangents(traced, cotangent, name)
    inputs = traced.float_args
    if not inputs:
        raise NotDifferentiableError(f"{name} has no float array argument, so nothing has an adjoint")
    reached = differentiable_buffers(program, inputs)
    named = tuple(n for n in traced.named if n in reached and ir.is_float(program.buffer(n).dtype))
    buffers = traced.run(arrays)
    grads = traced.gradient_of(inputs + named, buffers, cts)
    return {n: grads[n].reshape(program.buffer(n).shape) for n in inputs + named}


def checkpoint(fn):
    """`fn`, whose intermediates the backward pass recomputes instead of storing them (as
    `jax.checkpoint`). Called on arrays it is just `fn`; the difference is in gradients of
    functions that call it."""

    @functools.wraps(fn)
    def checkpointed(*args, **kwargs):
        state = current()
        if state is None:
            return as_function(fn)(*args, **kwargs)
        start = len(state.funcs)
        result = as_function(fn)(*args, **kwargs)
        state.checkpoints.append(tuple(f.name for f in state.funcs[start:]))
        return result

    return checkpointed
