"""The derivative programs that the torch and jax wrappers run, each an `@hd.func` of its own so
that it is compiled once and can be differentiated again (to any order):

* `gradient_program(fn, needed, count)(*args, *cotangents)`: the gradients of fn's arguments at
  `needed`, by reverse mode, the other arguments constants;
* `tangent_program(fn, positions, count)(*args, *tangents)`: fn's output tangents along the
  tangents of the arguments at `positions`, by forward mode.

`fn` is an `hd.func` of `count` positional arguments; cotangents and tangents come flat, one per
output leaf, and one per position.

`Gradient` computes a gradient program's values at the top level instead, with the forward and
backward kernels that `hd.vjp` on arrays builds for `fn` (and caches with its trace), so a first
derivative compiles no program of its own; where it is differentiated again it stands for
`gradient_program`. `transposed` finds, for a tangent program, the gradient that is its transpose.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

from halide_ad.api import func, Function
from halide_ad.transforms import _cotangents, vjp
from halide_ad.forward import jvp


def flatten(obj) -> tuple[list, object]:
    """(leaves, rebuild) for an array or a tuple/list/dict of arrays (halide_ad's outputs), the
    leaves in halide_ad's order (a dict's in its keys' order), which the wrappers' flat outputs
    and cotangents follow."""
    if not isinstance(obj, (tuple, list, dict)):
        return [obj], lambda leaves: leaves[0]
    if isinstance(obj, (tuple, list)):
        parts = [flatten(x) for x in obj]
        kind = type(obj)

        def rebuild(leaves):
            out, k = [], 0
            for leaves_part, rb in parts:
                out.append(rb(leaves[k:k + len(leaves_part)]))
                k += len(leaves_part)
            return kind(out)
        return [leaf for p in parts for leaf in p[0]], rebuild
    keys = list(obj)
    leaves, rebuild_values = flatten([obj[k] for k in keys])
    return leaves, lambda ls: dict(zip(keys, rebuild_values(ls), strict=True))


def _name(fn: Function) -> str:
    return getattr(fn.fn, "__name__", "fn").replace("<lambda>", "f")


@functools.lru_cache(maxsize=256)
def gradient_program(fn: Function, needed: tuple[int, ...], count: int) -> Function:
    def gradient(*args_and_cotangents):
        args, cotangents = args_and_cotangents[:count], args_and_cotangents[count:]

        def of_needed(*xs):
            full = list(args)
            for k, x in zip(needed, xs, strict=True):
                full[k] = x
            return fn(*full)

        of_needed.__name__ = _name(fn)  # (errors name the user's function)
        out, vjp_fn = vjp(of_needed, *(args[k] for k in needed))
        return tuple(vjp_fn(flatten(out)[1](list(cotangents))))

    gradient.__name__ = f"grad_{_name(fn)}"
    return func(gradient)


@functools.lru_cache(maxsize=256)
def tangent_program(fn: Function, positions: tuple[int, ...], count: int) -> Function:
    def tangent(*args_and_tangents):
        args = args_and_tangents[:count]
        tangents = dict(zip(positions, args_and_tangents[count:], strict=True))
        return jvp(fn, args, tuple(tangents.get(k) for k in range(count)))[1]

    tangent.__name__ = f"jvp_{_name(fn)}"
    program = func(tangent)
    _tangents[program] = (fn, positions, count)
    return program


_tangents: dict[Function, tuple[Function, tuple[int, ...], int]] = {}  # program -> what it differentiates


@dataclass(frozen=True)
class Gradient:
    """`gradient_program(fn, needed, count)`, its values computed at the top level."""

    fn: Function
    needed: tuple[int, ...]
    count: int

    def __call__(self, *args_and_cotangents):
        args, cotangents = args_and_cotangents[:self.count], args_and_cotangents[self.count:]
        traced, arrays = self.fn.trace(tuple(args), {})
        buffers = traced.run(arrays)
        seeds = _cotangents(traced, traced.rebuild(list(cotangents)), _name(self.fn))
        grads = traced.gradients(traced.gradient_of(tuple(traced.arg_names[k] for k in self.needed),
                                                    buffers, seeds))
        return tuple(grads[k] for k in self.needed)

    @property
    def program(self) -> Function:
        return gradient_program(self.fn, self.needed, self.count)


def program_of(fn: Function | Gradient) -> Function:
    """The `hd.func` that `fn` computes, to differentiate."""
    return fn.program if isinstance(fn, Gradient) else fn


def transposed(fn: Function, linear: tuple[int, ...]) -> Gradient | None:
    """The transpose of the tangent program `fn` in its tangent arguments `linear`: the gradient of
    the function it differentiates, called with fn's primal arguments and the cotangents. None
    where fn is not a tangent program or `linear` holds a primal argument."""
    if fn not in _tangents:
        return None
    base, positions, count = _tangents[fn]
    if any(k < count for k in linear):
        return None
    return Gradient(base, tuple(positions[k - count] for k in linear), count)
