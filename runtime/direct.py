"""Direct calls: what a cached call runs, from its arguments to its results, written out as one
Python function (`Glue`) once its kernels are built.

A run (`execute.ForwardRun`, `BackwardRun`) keeps its buffers in a dict, and each step reads them
by name through a getter; each allocation and each step is an object called in a loop. For a
kernel of microseconds that was most of the call: a cached call of x * w + x at 16 elements
spent ~3 of its ~4.5 us between the call and its numba function. The function written here
holds each buffer in a local, calls each allocation and each numba function by a name bound to
it, and builds a dict of buffers only where a step takes one (a BLAS contraction, a kernel with
run-time bounds checks)."""
from __future__ import annotations

import numpy as np

from halide_ad.runtime.execute import NO_STATUS, Allocation, BackwardRun, ForwardRun, Kernel, NumbaStep
from halide_ad.runtime.parallel import one_blas_thread


class Glue:
    """The text and the names of one direct function, built statement by statement: `take` an
    argument, `allocate`, run a `kernel`, then `function` with what it returns."""

    def __init__(self, params: str):
        self.lines = [f"def direct({params}):"]
        self.namespace: dict = {"asarray": np.asarray, "empty": np.empty, "NO_STATUS": NO_STATUS,
                                "one_blas_thread": one_blas_thread}
        self.names: dict[str, str] = {}  # buffer name -> the expression that holds it
        self.in_dict = False  # whether buffers live in a dict `buffers` (a step takes them so)

    def bind(self, value) -> str:
        """A name in the function's namespace bound to `value`."""
        name = f"c{len(self.namespace)}"
        self.namespace[name] = value
        return name

    def set(self, buffer: str, expression: str) -> None:
        target = f"buffers[{buffer!r}]" if self.in_dict else f"b{len(self.names)}"
        self.lines.append(f"    {target} = {expression}")
        self.names[buffer] = target

    def take(self, buffer: str, expression: str, *, scalar: bool = False) -> None:
        """Input `buffer` is the array `expression` (in the function's parameters), C-contiguous;
        a 0-d one as shape (1,), as kernels see it."""
        self.set(buffer, f"asarray({expression}, order='C')" + (".reshape(1)" if scalar else ""))

    def allocate(self, a: Allocation) -> None:
        if a.small:  # np.empty itself: the same array, a call less
            self.set(a.name, f"empty({self.bind(a.shape or (1,))}, {self.bind(a.dtype)})")
        else:
            self.set(a.name, f"{self.bind(a)}()")

    def kernel(self, kernel: Kernel) -> bool:
        """Run `kernel`'s steps; False where a step reads a buffer not set before."""
        if not kernel.buffers() <= self.names.keys():
            return False
        if not self.in_dict and not all(isinstance(s, NumbaStep) and not s.checks for s in kernel.steps):
            self.lines.append("    buffers = {" + ", ".join(f"{n!r}: {v}" for n, v in self.names.items()) + "}")
            self.names = {n: f"buffers[{n!r}]" for n in self.names}
            self.in_dict = True
        indent = "    "
        if kernel.small_products:
            self.lines.append("    with one_blas_thread():")
            indent = "        "
        for step in kernel.steps:
            if self.in_dict:
                self.lines.append(f"{indent}{self.bind(step)}(buffers)")
            else:
                args = ", ".join(self.names[p] for p in step.params)
                self.lines.append(f"{indent}{self.bind(step.fn)}({args}, NO_STATUS)")
        return True

    def result(self, buffer: str, *, scalar: bool = False) -> str:
        """The expression of a buffer as a result: a 0-d one back to shape ()."""
        return self.names[buffer] + (".reshape(())" if scalar else "")

    def function(self, returns: str):
        self.lines.append(f"    return {returns}")
        exec(compile("\n".join(self.lines), "<halide_ad direct call>", "exec"), self.namespace)
        return self.namespace["direct"]


def _forward(run: ForwardRun, sources: dict[str, int | str]) -> Glue | None:
    """A call's arguments through `run`: input `name` is `args[sources[name]]` (an int) or
    `kwargs[sources[name]]` (a str). None where a step reads a buffer from elsewhere (a
    captured array)."""
    glue = Glue("args, kwargs")
    for name, at in sources.items():
        glue.take(name, f"{'args' if isinstance(at, int) else 'kwargs'}[{at!r}]", scalar=name in run.scalars)
    for a in run.allocations:
        glue.allocate(a)
    return glue if glue.kernel(run.kernel) else None


def call(run: ForwardRun, sources: dict[str, int | str], outputs: tuple[tuple[str, bool], ...], rebuild=None):
    """`run` as a function of (args, kwargs) (see `_forward`) that returns its `outputs`, each
    (buffer, whether 0-d): the one output itself, or with `rebuild`, `rebuild([output, ...])`.
    False where it cannot be written out."""
    glue = _forward(run, sources)
    if glue is None:
        return False
    results = [glue.result(o, scalar=scalar) for o, scalar in outputs]
    return glue.function(results[0] if rebuild is None else f"{glue.bind(rebuild)}([{', '.join(results)}])")


def value_and_grad(forward: ForwardRun, backward: BackwardRun, sources: dict[str, int | str], out: str,
                   seed: np.ndarray, gradients: tuple[tuple[str, bool], ...], single: bool):
    """`forward` then `backward`, seeded with a copy of `seed` (shape (1,)) as the cotangent of
    the scalar output `out`, as a function of (args, kwargs) that returns (out's value, the
    gradient of each of `gradients` (buffer, whether 0-d), or with `single` the one gradient).
    False where it cannot be written out."""
    glue = _forward(forward, sources)
    if glue is None:
        return False
    for name, fill in backward.fills:
        if isinstance(fill, str):  # a cotangent: only `out` has one
            glue.set(name, f"{glue.bind(seed)}.copy()")
        else:
            glue.allocate(fill)
    adjoints = dict(backward.results)
    if not glue.kernel(backward.kernel) or any(adjoints.get(b) not in glue.names for b, _ in gradients):
        return False
    grads = [glue.result(adjoints[b], scalar=scalar) for b, scalar in gradients]
    return glue.function(f"{glue.names[out]}[0], " + (grads[0] if single else f"({', '.join(grads)},)"))


def vjp(backward: BackwardRun, out: str, shape: tuple[int, ...], dtype: np.dtype,
        args: tuple[tuple[str | None, bool], ...]):
    """`backward` as a function of (the forward's buffers, the cotangent of the one output `out`)
    that returns a gradient for each of `args` (buffer or None, whether 0-d), None in place of
    each None: a vjp closure's cached call. The function returns None itself for a cotangent
    other than a `shape` array of `dtype`, which the caller checks and converts. False where it
    cannot be written out."""
    glue = Glue("buffers, cotangent")
    fills = dict(backward.fills)
    for name in backward.kernel.buffers() - fills.keys():
        glue.set(name, f"buffers[{name!r}]")
    glue.lines.append(f"    if type(cotangent) is not ndarray or cotangent.shape != {shape!r} "
                      f"or cotangent.dtype != {glue.bind(dtype)}:")
    glue.lines.append("        return None")
    glue.namespace["ndarray"] = np.ndarray
    for name, fill in backward.fills:
        if isinstance(fill, str):  # the cotangent: of `out`, the one output
            glue.take(name, "cotangent", scalar=shape == ())
        else:
            glue.allocate(fill)
    adjoints = dict(backward.results)
    if not glue.kernel(backward.kernel) or any(b is not None and adjoints.get(b) not in glue.names for b, _ in args):
        return False
    grads = ["None" if b is None else glue.result(adjoints[b], scalar=scalar) for b, scalar in args]
    return glue.function(f"({', '.join(grads)},)")


__all__ = ["Glue", "call", "value_and_grad", "vjp"]
