"""PyTorch and JAX on the CPU, measured at their best as BENCHMARKS.md asks.

* PyTorch: `torch.set_num_threads` equal to numba's thread count; the forward timed under
  `torch.no_grad()` (halide_ad's forward computes no residuals either); the backward timed as
  `torch.autograd.grad(y, inputs, ct, retain_graph=True)` on a graph built once. Torch's huge-page
  allocator (THP_MEM_ALLOC_ENABLE=1) is chosen once per process, before `import torch`:
  `benchmarks.torch_thp` measures the other setting in a subprocess.
* JAX: the forward is `jax.jit(f)`; the backward is the jitted application of the vjp function
  returned by a jitted `jax.vjp`, on its residuals. Every call ends in `block_until_ready()`.
"""
from __future__ import annotations

import importlib
import importlib.util
import os
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

import numba
import numpy as np

from benchmarks.timing import Prepared, time_once

THP_ENV = "THP_MEM_ALLOC_ENABLE"

_torch_thp: bool | None = None  # the allocator setting torch was imported with in this process


def thread_count() -> int:
    """The number of threads every library gets: numba's, which halide_ad's kernels run on."""
    return numba.get_num_threads()


def is_installed(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


def load_torch(*, thp: bool) -> ModuleType:
    """Import torch with its huge-page allocator on (`thp`) or off, using `thread_count()` threads.

    torch reads THP_MEM_ALLOC_ENABLE when it is imported, so a process gets one setting only.
    """
    global _torch_thp
    if _torch_thp is None:
        if thp:
            os.environ[THP_ENV] = "1"
        else:
            os.environ.pop(THP_ENV, None)
        torch = importlib.import_module("torch")
        torch.set_num_threads(thread_count())
        _torch_thp = thp
    elif _torch_thp != thp:
        raise RuntimeError(f"torch was already imported with {THP_ENV}={int(_torch_thp)}")
    return importlib.import_module("torch")


def load_jax() -> ModuleType:
    """Import jax on the CPU (without probing for accelerators)."""
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    return importlib.import_module("jax")


def prepare_torch(
    fn: Callable[..., Any], inputs: Sequence[np.ndarray], ct: np.ndarray, *, thp: bool,
    backward: bool = True,
) -> Prepared:
    """`fn`'s first forward (and unless `backward` is False its first backward) in torch, and the
    passes to time. Torch compiles nothing, but its first calls are recorded too: in a fresh
    process they include its one-off set-up, which a user's first call pays."""
    torch = load_torch(thp=thp)
    xs = [torch.from_numpy(a).requires_grad_(True) for a in inputs]

    def forward():
        with torch.no_grad():
            return fn(*xs)

    out, first_forward = time_once(forward)
    variant = "THP" if thp else "default"
    if not backward:
        return Prepared(forward, None, {"forward": first_forward}, out.numpy(), (), variant)
    ct_t = torch.from_numpy(ct)

    def forward_and_gradients():
        y = fn(*xs)
        return y, torch.autograd.grad(y, xs, ct_t, retain_graph=True)

    (y, grads), first_backward = time_once(forward_and_gradients)
    return Prepared(forward, lambda: torch.autograd.grad(y, xs, ct_t, retain_graph=True),
                    {"forward": first_forward, "backward": first_backward}, y.detach().numpy(),
                    tuple(g.numpy() for g in grads), variant)


def prepare_jax(
    fn: Callable[..., Any], inputs: Sequence[np.ndarray], ct: np.ndarray, *, backward: bool = True,
) -> Prepared:
    """`fn`'s first calls in jax (tracing and XLA compilation: the forward, and unless `backward`
    is False the jitted vjp plus its application), and the passes to time."""
    jax = load_jax()
    xs = [jax.device_put(a) for a in inputs]
    ct_j = jax.device_put(ct)

    forward_fn = jax.jit(fn)
    forward = lambda: jax.block_until_ready(forward_fn(*xs))  # noqa: E731
    out, first_forward = time_once(forward)
    if not backward:
        return Prepared(forward, None, {"forward": first_forward}, np.asarray(out), ())

    vjp = jax.jit(lambda *args: jax.vjp(fn, *args))
    apply_vjp = jax.jit(lambda vjp_fn, c: vjp_fn(c))
    (_, vjp_fn), first_vjp = time_once(lambda: jax.block_until_ready(vjp(*xs)))
    grads, first_apply = time_once(lambda: jax.block_until_ready(apply_vjp(vjp_fn, ct_j)))
    return Prepared(forward, lambda: jax.block_until_ready(apply_vjp(vjp_fn, ct_j)),
                    {"forward": first_forward, "backward": first_vjp + first_apply}, np.asarray(out),
                    tuple(np.asarray(g) for g in grads))
