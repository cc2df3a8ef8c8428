"""JAX integration: an `@hd.func` as a `jax.custom_vjp` function.

    import halide_ad as hd
    import halide_ad.jax as hd_jax

    @hd.func
    def conv2d(x, w): ...

    conv = hd_jax.function(conv2d)
    loss = lambda x, w: jnp.sum(conv(x, w) ** 2)
    dw = jax.grad(loss, argnums=1)(x, w)        # also under jax.jit and jax.vmap

Forward and backward run on the host through `jax.pure_callback`, so a wrapped op composes with
`jax.jit`, `jax.grad` and `jax.vmap` (sequentially, one call per batch element). The backward
callback reruns the forward (as `jax.checkpoint` would) to get halide_ad's `vjp_fn`: a Python
closure cannot travel through JAX as a residual.

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

from halide_ad.api import as_function, vjp

__all__ = ["function", "wrap"]


def _is_array(x) -> bool:
    return isinstance(x, (jax.Array, np.ndarray)) or hasattr(x, "aval")


def _merge(n: int, dynamic_at: tuple[int, ...], dynamic, static: tuple) -> list:
    """All `n` positional arguments, from the traced ones and the static (index, value) pairs."""
    args = [None] * n
    for k, a in zip(dynamic_at, dynamic, strict=True):
        args[k] = a
    for k, v in static:
        args[k] = v
    return args


def _structs(out):
    """The jax.ShapeDtypeStruct pytree describing numpy outputs."""
    return jax.tree_util.tree_map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), out)


@functools.lru_cache(maxsize=256)
def _op(f, n: int, dynamic_at: tuple[int, ...], static: tuple):
    """The custom_vjp function over the dynamic arguments, for one choice of static ones."""
    out_structs: dict = {}  # (shapes, dtypes) of the inputs -> output ShapeDtypeStructs

    def host_forward(*arrays):
        args = _merge(n, dynamic_at, [np.asarray(a) for a in arrays], static)
        # int64 outputs become int32 when jax_enable_x64 is off, as JAX's own arrays would.
        return jax.tree_util.tree_map(lambda a: a.astype(jax.dtypes.canonicalize_dtype(a.dtype),
                                                         copy=False), f(*args))

    def output_structs(arrays):
        key = tuple((a.shape, np.dtype(a.dtype).str) for a in arrays)
        if key not in out_structs:
            # halide_ad compiles once per signature; zeros of the right shape find the outputs'.
            zeros = [np.zeros(a.shape, a.dtype) for a in arrays]
            out_structs[key] = _structs(host_forward(*zeros))
        return out_structs[key]

    @jax.custom_vjp
    def op(*arrays):
        return jax.pure_callback(host_forward, output_structs(arrays), *arrays,
                                 vmap_method="sequential")

    def fwd(*arrays):
        return op(*arrays), arrays

    def host_backward(arrays, ct):
        args = _merge(n, dynamic_at, [np.asarray(a) for a in arrays], static)
        _, vjp_fn = vjp(f, *args)
        grads = vjp_fn(jax.tree_util.tree_map(_float_cotangent, ct))
        return tuple(grads[k] for k, a in zip(dynamic_at, arrays, strict=True) if _is_float(a))

    def bwd(arrays, ct):
        structs = tuple(jax.ShapeDtypeStruct(a.shape, a.dtype) for a in arrays if _is_float(a))
        grads = iter(jax.pure_callback(host_backward, structs, arrays, ct, vmap_method="sequential"))
        return tuple(next(grads) if _is_float(a) else None for a in arrays)

    op.defvjp(fwd, bwd)
    return op


def _is_float(a) -> bool:
    return jnp.issubdtype(a.dtype, jnp.floating)


def _float_cotangent(ct) -> np.ndarray:
    """Integer outputs get float0 cotangents from JAX; halide_ad wants a float array."""
    ct = np.asarray(ct)
    return np.zeros(ct.shape) if ct.dtype == jax.dtypes.float0 else ct


def function(fn):
    """Wrap an `@hd.func` (or a plain function, traced as if decorated) for JAX.

    The result takes `fn`'s positional arguments, with jax arrays where `fn` takes arrays, and
    returns jax arrays with `fn`'s output structure. It is differentiable (`jax.grad`, `jax.vjp`)
    with respect to every float array argument."""
    f = as_function(fn)

    @functools.wraps(f.fn)
    def wrapped(*args):
        dynamic_at = tuple(k for k, a in enumerate(args) if _is_array(a))
        static = tuple((k, a) for k, a in enumerate(args) if not _is_array(a))
        return _op(f, len(args), dynamic_at, static)(*(args[k] for k in dynamic_at))

    wrapped.hd_function = f
    return wrapped


wrap = function
