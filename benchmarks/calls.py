"""Cases timed as the whole calls a user makes: a cached call of a tiny program, `value_and_grad`
of a tiny scalar program, and one training step of `examples/train_digits.py`'s CNN.

Each library gets the same inputs and builds its call once (jitting, graph-free tensors); the
runner times that call's steady state and checks halide_ad's values against a peer's:
* halide_ad: the `@hd.func` or `hd.value_and_grad(f, argnums)` called with numpy arrays;
* PyTorch, eager: the forward on tensors, and for a gradient `torch.autograd.grad` of the loss;
* JAX: `jax.jit(f)` or `jax.jit(jax.value_and_grad(f, argnums))`, with `block_until_ready()`.

A training step is the loss and its gradients with respect to the six parameter arrays, at the
example's batch size; the optimizer's update is left out of every library's time (the example's
Adam is numpy, not halide_ad).
"""
from __future__ import annotations

import functools
import importlib.util
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

import halide_ad as hd
from benchmarks import peers
from benchmarks.cases import F, jax, jnp, lax
from benchmarks.everyday import affine, jax_affine, torch_affine
from benchmarks.runner import Row
from benchmarks.timing import measure_turns, time_once
from halide_ad import tiered

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "train_digits.py"
DIGITS_BATCH = 32  # train_digits.py's default --batch
SMALL_DIGITS_BATCH = 5
DISPATCH_ELEMENTS = 16

Prepare = Callable[[Sequence[np.ndarray]], Callable[[], Any]]


@dataclass(frozen=True, slots=True)
class CallCase:
    """One call in three libraries: `prepare[library](inputs)` builds the call to time."""

    name: str
    description: str
    phase: str  # what the call does, for the report: "call", "value_and_grad", ...
    make_inputs: Callable[[bool], list[np.ndarray]]  # small -> the inputs
    prepare: dict[str, Prepare]  # library -> its call, built from the inputs
    inner: int = 1  # calls per timed sample, for calls of microseconds (see `timing.measure`)


def _arrays(value: Any) -> list[np.ndarray]:
    """The arrays in a call's result (nested tuples of numpy, torch or jax arrays), in order."""
    if isinstance(value, (tuple, list)):
        return [a for v in value for a in _arrays(v)]
    if hasattr(value, "detach"):  # a torch tensor
        return [value.detach().numpy()]
    return [np.asarray(value)]


def run_call_case(case: CallCase, *, small: bool, repeat: int, peer_names: Sequence[str]) -> Row:
    """The median time of `case`'s call in halide_ad and each peer, the libraries timed in turns
    (`timing.measure_turns`), and a check of halide_ad's values against the first peer that ran."""
    row = Row(case.name, case.phase)
    inputs = case.make_inputs(small)
    values: dict[str, list[np.ndarray]] = {}
    calls: dict[str, Callable[[], Any]] = {}
    for library in ("halide_ad", *peer_names):
        try:
            call = case.prepare[library](inputs)
            result, first_s = time_once(call)  # compiles or jits
            values[library] = _arrays(result)
            tiered.settle()  # halide_ad's kernels, not its interpreter tier, in the steady state
        except Exception as error:  # noqa: BLE001 - one failing library must not end the run
            row.record_error(library, error)
            continue
        calls[library] = call
        if library == "halide_ad":
            row.first_call_s = first_s
    timings, errors = measure_turns(calls, repeat, inner=case.inner)
    for library, error in errors.items():
        row.record_error(library, error)
    for library, timing in timings.items():
        row.times_s[library] = timing.median_ms * 1e-3
        print(f"[{case.name}] {library}: {case.phase} {timing.median_ms:.3g} ms", file=sys.stderr)
    row.check_values(values)
    return row


# --- dispatch: tiny programs at 16 elements ---------------------------------------------------------


def _tiny_inputs(small: bool) -> list[np.ndarray]:
    """x and w of 16 elements, with or without --small: the case is tiny already."""
    rng = np.random.default_rng(0)
    return [rng.standard_normal(DISPATCH_ELEMENTS, dtype=np.float32) for _ in range(2)]


@hd.func
def tiny_loss(x, w):
    """sum(x * w + x): a scalar, so that value_and_grad applies."""
    return (x * w + x).sum()


def torch_tiny_loss(x, w):
    return (x * w + x).sum()


def jax_tiny_loss(x, w):
    return jnp.sum(x * w + x)


def _hd_call(inputs):
    x, w = inputs
    return lambda: affine(x, w)


def _torch_call(inputs):
    torch = peers.load_torch(thp=False)
    x, w = (torch.from_numpy(a) for a in inputs)
    return lambda: torch_affine(x, w)


def _jax_call(inputs):
    jax_ = peers.load_jax()
    f = jax_.jit(jax_affine)
    x, w = (jax_.device_put(a) for a in inputs)
    return lambda: f(x, w).block_until_ready()


def _hd_value_and_grad(fn: Callable[..., Any], argnums: tuple[int, ...]) -> Prepare:
    def prepare(inputs):
        value_and_grad = hd.value_and_grad(fn, argnums=argnums)
        return lambda: value_and_grad(*inputs)
    return prepare


def _torch_value_and_grad(fn: Callable[..., Any], argnums: tuple[int, ...]) -> Prepare:
    """The loss, forward with a graph, and `torch.autograd.grad` of it: what a training loop runs."""
    def prepare(inputs):
        torch = peers.load_torch(thp=False)
        args = [torch.from_numpy(a) for a in inputs]
        wrt = [args[k].requires_grad_(True) for k in argnums]

        def call():
            loss = fn(*args)
            return loss, torch.autograd.grad(loss, wrt)
        return call
    return prepare


def _jax_value_and_grad(fn: Callable[..., Any], argnums: tuple[int, ...]) -> Prepare:
    def prepare(inputs):
        jax_ = peers.load_jax()
        f = jax_.jit(jax_.value_and_grad(fn, argnums=argnums))
        # jax keeps 32-bit integers unless x64 is on: give it int32 labels, not a warning
        args = [jax_.device_put(a.astype(np.int32) if a.dtype == np.int64 else a) for a in inputs]
        return lambda: jax_.block_until_ready(f(*args))
    return prepare


# --- one training step of examples/train_digits.py's CNN -------------------------------------------


@functools.cache
def train_digits() -> ModuleType:
    """examples/train_digits.py as a module (examples/ is no package): its model, not a copy."""
    spec = importlib.util.spec_from_file_location("train_digits", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _digits_inputs(small: bool) -> list[np.ndarray]:
    """The example's initial parameters and a batch of random 8x8 images with random labels (the
    step's time does not depend on the data; the example's data needs scikit-learn)."""
    example = train_digits()
    rng = np.random.default_rng(0)
    batch = SMALL_DIGITS_BATCH if small else DIGITS_BATCH
    x = rng.standard_normal((batch, 1, 8, 8), dtype=np.float32)
    y = rng.integers(0, example.CLASSES, batch)
    return [*example.init_params(rng), x, y]


PARAMS = (0, 1, 2, 3, 4, 5)  # the loss's arguments w1, b1, w2, b2, w3, b3; x and y are data


def _hd_digits_step(inputs):
    return _hd_value_and_grad(train_digits().batch_loss, PARAMS)(inputs)


def torch_digits_loss(w1, b1, w2, b2, w3, b3, x, y):
    """train_digits.py's `batch_loss` in PyTorch: w2 is (K, 4, 4, HIDDEN), so the pooled block
    flattened in (k, i, j) order meets w2 flattened the same way."""
    pool = F.max_pool2d(F.relu(F.conv2d(x, w1, b1, padding=1)), 2)
    hidden = F.relu(pool.flatten(1) @ w2.reshape(-1, w2.shape[-1]) + b2)
    return F.cross_entropy(hidden @ w3 + b3, y)


def jax_digits_loss(w1, b1, w2, b2, w3, b3, x, y):
    """train_digits.py's `batch_loss` in JAX (as `torch_digits_loss`)."""
    conv = lax.conv_general_dilated(x, w1, (1, 1), ((1, 1), (1, 1)),
                                    dimension_numbers=("NCHW", "OIHW", "NCHW"))
    conv = jax.nn.relu(conv + b1[None, :, None, None])
    pool = lax.reduce_window(conv, -jnp.inf, lax.max, (1, 1, 2, 2), (1, 1, 2, 2), "VALID")
    hidden = jax.nn.relu(pool.reshape(pool.shape[0], -1) @ w2.reshape(-1, w2.shape[-1]) + b2)
    logp = jax.nn.log_softmax(hidden @ w3 + b3)
    return -jnp.mean(jnp.take_along_axis(logp, y[:, None], axis=1))


CALL_CASES: tuple[CallCase, ...] = (
    CallCase(
        name="dispatch",
        description=f"a cached call of x * w + x at {DISPATCH_ELEMENTS} elements (torch eager, "
        "jax.jit)",
        phase="call",
        make_inputs=_tiny_inputs,
        prepare={"halide_ad": _hd_call, "torch": _torch_call, "jax": _jax_call},
        inner=200,
    ),
    CallCase(
        name="dispatch_vg",
        description=f"value_and_grad of sum(x * w + x) at {DISPATCH_ELEMENTS} elements, both "
        "inputs (torch: forward + autograd.grad; jax.jit(jax.value_and_grad))",
        phase="value_and_grad",
        make_inputs=_tiny_inputs,
        prepare={"halide_ad": _hd_value_and_grad(tiny_loss, (0, 1)),
                 "torch": _torch_value_and_grad(torch_tiny_loss, (0, 1)),
                 "jax": _jax_value_and_grad(jax_tiny_loss, (0, 1))},
        inner=100,
    ),
    CallCase(
        name="digits_step",
        description=f"one training step of examples/train_digits.py's CNN at its batch size "
        f"({DIGITS_BATCH}; {SMALL_DIGITS_BATCH} with --small): the loss and the gradients of its 6 "
        "parameter arrays (no optimizer update)",
        phase="training step",
        make_inputs=_digits_inputs,
        prepare={"halide_ad": _hd_digits_step,
                 "torch": _torch_value_and_grad(torch_digits_loss, PARAMS),
                 "jax": _jax_value_and_grad(jax_digits_loss, PARAMS)},
    ),
)
