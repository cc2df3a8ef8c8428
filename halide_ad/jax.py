"""JAX integration: an `@hd.func` as a JAX primitive, differentiable in every mode and order.

    import halide_ad as hd
    import halide_ad.jax as hd_jax

    @hd.func
    def conv2d(x, w): ...

    conv = hd_jax.function(conv2d)
    loss = lambda x, w: jnp.sum(conv(x, w) ** 2)
    dw = jax.grad(loss, argnums=1)(x, w)        # also under jax.jit and jax.vmap
    h = jax.hessian(loss)(x, w)                 # and jax.jvp, jax.jacfwd, ...

A wrapped op is a JAX primitive whose every rule is another halide_ad program, run on the host
through `jax.pure_callback`:

* its JVP rule calls fn's tangent program (`hd.jvp`, forward mode), which is linear in the tangents;
* the transpose of a tangent program is its gradient program (`hd.vjp`, reverse mode, computed at
  zero tangents: it does not depend on them), so `jax.grad` and `jax.vjp` work;
* those programs are wrapped the same way, so every order composes: `jax.jvp`, `jax.grad`,
  `jax.hessian`, `jax.jacfwd`, `jax.jacrev`, under `jax.jit`;
* under `jax.vmap` a call runs once per batch element (`jax.lax.map`).

Each derivative program is traced and compiled once (`halide_ad.derived`). A gradient reruns
the forward pass (as `jax.checkpoint` would): halide_ad's buffers cannot travel through JAX as
residuals.

Arguments that are arrays (jax or numpy) are traced; everything else (ints, floats, strings,
tuples) is a static option, fixed at trace time like a `static_argnums` entry of `jax.jit`.
Integer arrays are data and get a zero cotangent. Float64 needs `jax_enable_x64`.
"""
from __future__ import annotations

import functools

try:
    import jax
    import jax.numpy as jnp
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError("halide_ad.jax needs JAX, an optional dependency: pip install jax jaxlib "
                      "(or pip install 'halide_ad[jax]')") from e

import numpy as np

from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

from halide_ad.api import as_function, func
from halide_ad.derived import flatten, gradient_program, program_of, tangent_program, transposed

__all__ = ["function", "wrap"]


def _is_array(x) -> bool:
    return isinstance(x, (jax.Array, np.ndarray)) or hasattr(x, "aval")


def _is_float(a) -> bool:
    return jnp.issubdtype(a.dtype, jnp.floating)


@functools.lru_cache(maxsize=256)
def _over_arrays(f, n: int, dynamic_at: tuple[int, ...], static: tuple):
    """`f` as an `hd.func` of its array arguments only, the static ones fixed."""
    def call(*arrays):
        args = [None] * n
        for k, a in zip(dynamic_at, arrays, strict=True):
            args[k] = a
        for k, v in static:
            args[k] = v
        return f(*args)

    call.__name__ = getattr(f.fn, "__name__", "fn")
    return func(call)


# ---- the primitive: one halide_ad program, on flat arrays in and out --------------------------

halide_ad_p = Primitive("halide_ad")
halide_ad_p.multiple_results = True
_out_avals: dict = {}  # (program, input shapes and dtypes) -> the outputs' ShapedArrays


def _host(fn):
    def run(*arrays):
        leaves = flatten(fn(*(np.asarray(a) for a in arrays)))[0]
        # int64 outputs become int32 when jax_enable_x64 is off, as JAX's own arrays would.
        return [a.astype(jax.dtypes.canonicalize_dtype(a.dtype), copy=False) for a in leaves]
    return run


def _signature(fn, arrays) -> tuple:
    return (fn, tuple((a.shape, np.dtype(a.dtype).str) for a in arrays))


def _known(fn, arrays, outs) -> None:
    """Record that `fn` on `arrays` gives arrays like `outs`, where a rule knows it without a run
    (which would compile a program that JAX may only transpose)."""
    _out_avals.setdefault(_signature(fn, arrays), [jax.core.ShapedArray(o.shape, o.dtype) for o in outs])


def _abstract_eval(*avals, fn):
    key = _signature(fn, avals)
    if key not in _out_avals:
        # halide_ad compiles once per signature; zeros of the right shape find the outputs'.
        outs = _host(fn)(*(np.zeros(a.shape, a.dtype) for a in avals))
        _out_avals[key] = [jax.core.ShapedArray(o.shape, o.dtype) for o in outs]
    return _out_avals[key]


def _impl(*arrays, fn):
    structs = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in _abstract_eval(*arrays, fn=fn)]
    return jax.pure_callback(_host(fn), structs, *arrays)


def _jvp(primals, tangents, *, fn):
    outs = halide_ad_p.bind(*primals, fn=fn)
    positions = tuple(k for k, (p, t) in enumerate(zip(primals, tangents, strict=True))
                      if type(t) is not ad.Zero and _is_float(p))
    if not positions:
        return outs, [ad.Zero.from_primal_value(o) for o in outs]
    tangent_fn = tangent_program(program_of(fn), positions, len(primals))
    tangent_args = (*primals, *(tangents[k] for k in positions))
    if all(_is_float(o) for o in outs):  # (a tangent program's outputs are its primal outputs')
        _known(tangent_fn, [jax.typeof(a) for a in tangent_args], [jax.typeof(o) for o in outs])
    tangent_outs = halide_ad_p.bind(*tangent_args, fn=tangent_fn)
    return outs, [t if _is_float(o) else ad.Zero.from_primal_value(o)
                  for o, t in zip(outs, tangent_outs, strict=True)]


def _transpose(cotangents, *args, fn):
    """Only tangent programs are transposed, in their tangents (the undefined arguments): by the
    gradient of what they differentiate (`derived.transposed`), or else by their own gradient
    program, which does not depend on the tangents' values (the program is linear in them), so
    zeros stand in for them."""
    linear = tuple(k for k, a in enumerate(args) if ad.is_undefined_primal(a))
    values = [jnp.zeros(a.aval.shape, a.aval.dtype) if ad.is_undefined_primal(a) else a for a in args]
    avals = _abstract_eval(*(jax.typeof(v) for v in values), fn=fn)
    cts = [jnp.zeros(a.shape, a.dtype) if type(ct) is ad.Zero else ct
           for ct, a in zip(cotangents, avals, strict=True)]
    gradient = transposed(program_of(fn), linear)
    if gradient is not None:
        primals = [a for k, a in enumerate(args) if k < gradient.count]
        _known(gradient, [jax.typeof(a) for a in (*primals, *cts)], [args[k].aval for k in linear])
        grads = iter(halide_ad_p.bind(*primals, *cts, fn=gradient))
    else:
        grads = iter(halide_ad_p.bind(*values, *cts, fn=gradient_program(program_of(fn), linear, len(args))))
    return [next(grads) if k in linear else None for k in range(len(args))]


def _batch(arrays, dims, *, fn):
    """One call per batch element (a dimension of None: not batched)."""
    size = next(a.shape[d] for a, d in zip(arrays, dims, strict=True) if d is not None)
    stacked = tuple(jnp.broadcast_to(a, (size, *a.shape)) if d is None else jnp.moveaxis(a, d, 0)
                    for a, d in zip(arrays, dims, strict=True))
    outs = jax.lax.map(lambda xs: tuple(halide_ad_p.bind(*xs, fn=fn)), stacked)
    return list(outs), [0] * len(outs)


halide_ad_p.def_impl(_impl)
halide_ad_p.def_abstract_eval(_abstract_eval)
mlir.register_lowering(halide_ad_p, mlir.lower_fun(_impl, multiple_results=True))
ad.primitive_jvps[halide_ad_p] = _jvp
ad.primitive_transposes[halide_ad_p] = _transpose
batching.primitive_batchers[halide_ad_p] = _batch


_rebuilds: dict = {}  # (program, input shapes and dtypes) -> what rebuilds the outputs' structure


def _rebuild(program, arrays):
    key = (program, tuple((a.shape, np.dtype(a.dtype).str) for a in arrays))
    if key not in _rebuilds:
        _rebuilds[key] = flatten(program(*(np.zeros(a.shape, a.dtype) for a in arrays)))[1]
    return _rebuilds[key]


def function(fn):
    """Wrap an `@hd.func` (or a plain function, traced as if decorated) for JAX.

    The result takes `fn`'s positional arguments, with jax arrays where `fn` takes arrays, and
    returns jax arrays with `fn`'s output structure. It is differentiable in every mode and to
    every order (`jax.jvp`, `jax.grad`, `jax.hessian`, ...) with respect to every float array
    argument."""
    f = as_function(fn)

    @functools.wraps(f.fn)
    def wrapped(*args):
        dynamic_at = tuple(k for k, a in enumerate(args) if _is_array(a))
        static = tuple((k, a) for k, a in enumerate(args) if not _is_array(a))
        arrays = [jnp.asarray(args[k]) for k in dynamic_at]
        program = _over_arrays(f, len(args), dynamic_at, static)
        return _rebuild(program, arrays)(halide_ad_p.bind(*arrays, fn=program))

    wrapped.hd_function = f
    return wrapped


wrap = function
