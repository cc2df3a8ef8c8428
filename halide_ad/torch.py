"""PyTorch integration: an `@hd.func` as a `torch.autograd.Function`.

    import halide_ad as hd
    import halide_ad.torch as hd_torch

    @hd.func
    def conv2d(x, w): ...

    conv = hd_torch.function(conv2d)        # tensors in, tensors out, differentiable
    y = conv(x, w)                          # x, w: torch tensors (float32 or float64)
    y.sum().backward()                      # w.grad comes from halide_ad's gradient kernels

Forward hands CPU tensors to halide_ad without a copy (`.detach().contiguous().numpy()` shares
the tensor's memory when it is already contiguous), runs the forward program, and keeps its
buffers (the residuals) on the autograd context. Backward computes the gradients of only the
arguments torch asks for (`ctx.needs_input_grad`), from those buffers, and wraps them with
`torch.from_numpy`, again without a copy. Tensors on another device make a round trip through the
CPU. Non-tensor arguments (ints, floats, strings, tuples) are static options, passed through as
they are, and get `None` as their gradient, as do integer and bool tensors.

Under `create_graph=True` (double backward, `torch.autograd.functional.hvp`), backward instead
runs the gradient program itself, `hd.vjp` of `fn` traced as an `@hd.func` of the arguments and
the cotangents, wrapped by this same class: its own backward differentiates it again (reverse over
reverse), to any order.
"""
from __future__ import annotations

import functools

try:
    import torch
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError("halide_ad.torch needs PyTorch, an optional dependency: pip install torch "
                      "(or pip install 'halide_ad[torch]')") from e

import numpy as np

from halide_ad.api import as_function
from halide_ad.transforms import _cotangents
from halide_ad.derived import flatten
from halide_ad.derived import gradient_program

__all__ = ["function", "wrap"]


def _to_numpy(t: torch.Tensor) -> np.ndarray:
    """The tensor's data as numpy, sharing memory when `t` is a contiguous CPU tensor."""
    return t.detach().cpu().contiguous().numpy()


def _from_numpy(a: np.ndarray, device: torch.device | None) -> torch.Tensor:
    """A tensor sharing `a`'s memory where it can (np.ascontiguousarray would turn 0-d into 1-d)."""
    if not (a.flags.writeable and a.flags.c_contiguous):  # torch.from_numpy warns on read-only arrays
        a = a.copy()
    t = torch.from_numpy(a)
    return t if device is None or device.type == "cpu" else t.to(device)


class HalideFunction(torch.autograd.Function):
    """forward(ctx, fn, meta, *args): `meta` is a dict the wrapper reads the output structure from.

    Use `function(fn)` rather than this class directly."""

    @staticmethod
    def forward(ctx, fn, meta, *args):
        np_args = [_to_numpy(a) if isinstance(a, torch.Tensor) else a for a in args]
        traced, arrays = fn.trace(tuple(np_args), {})
        buffers = traced.run(arrays)
        leaves, rebuild = flatten(traced.outputs(buffers))
        meta["rebuild"] = rebuild
        device = next((a.device for a in args if isinstance(a, torch.Tensor)), None)
        outs = tuple(_from_numpy(leaf, device) for leaf in leaves)
        ctx.fn, ctx.traced, ctx.buffers, ctx.rebuild = fn, traced, buffers, rebuild
        ctx.statics = [None if isinstance(a, torch.Tensor) else a for a in args]
        ctx.devices = [a.device if isinstance(a, torch.Tensor) else None for a in args]
        # Saving the inputs lets autograd's version counters catch an in-place change before
        # backward (the gradient kernels read the same memory: no copy was made), and gives
        # double backward the inputs with their history.
        ctx.save_for_backward(*(a for a in args if isinstance(a, torch.Tensor)))
        for leaf, t in zip(leaves, outs, strict=True):
            if leaf.dtype.kind not in "fc":
                ctx.mark_non_differentiable(t)
        return outs

    @staticmethod
    def backward(ctx, *grad_outputs):
        tensors = iter(ctx.saved_tensors)  # raises if an input was modified in place since forward
        args = [next(tensors) if static is None and device is not None else static
                for static, device in zip(ctx.statics, ctx.devices, strict=True)]
        names = ctx.traced.arg_names
        needed = tuple(k for k, (name, need) in enumerate(zip(names, ctx.needs_input_grad[2:], strict=True))
                       if need and name in ctx.traced.float_args)
        grads = [None] * len(args)
        if needed and torch.is_grad_enabled():  # create_graph: a differentiable gradient
            program = function(gradient_program(ctx.fn, needed, len(args)))
            for k, g in zip(needed, program(*args, *grad_outputs), strict=True):
                grads[k] = g
        elif needed:
            cts = _cotangents(ctx.traced, ctx.rebuild([_to_numpy(g) for g in grad_outputs]),
                              getattr(ctx.fn.fn, "__name__", "fn"))
            by_position = ctx.traced.gradients(
                ctx.traced.gradient_of(tuple(names[k] for k in needed), ctx.buffers, cts))
            for k in needed:
                grads[k] = _from_numpy(by_position[k], ctx.devices[k])
        return (None, None, *grads)


def function(fn):
    """Wrap an `@hd.func` (or a plain function, traced as if decorated) for PyTorch.

    The result takes the same positional arguments as `fn`, with torch tensors where `fn` takes
    arrays, and returns torch tensors with `fn`'s output structure (a tensor, or a tuple, list or
    dict of them). Gradients flow to every float tensor argument."""
    f = as_function(fn)

    @functools.wraps(f.fn)
    def wrapped(*args):
        meta: dict = {}
        outs = HalideFunction.apply(f, meta, *args)
        return meta["rebuild"](list(outs))

    wrapped.hd_function = f
    return wrapped


wrap = function
