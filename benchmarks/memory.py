"""Peak memory of the backward pass: what one backward adds to a process's resident memory.

Each (case, library) runs in a fresh process (`python -m benchmarks.memory`), so no other case's
buffers or allocator caches count. The process

1. builds the inputs and the cotangent, then runs the forward with residuals and the backward
   twice and drops them: compilation and one-off set-up happen here, not in the measurement;
2. runs the forward with residuals again and keeps its output and residuals: halide_ad's
   `out, vjp_fn = hd.vjp(f, *inputs)`, torch's graph built with `requires_grad`, jax's jitted
   `jax.vjp`;
3. hands back free memory: a garbage collection, halide_ad's buffer pool emptied of the arrays it
   keeps for reuse (runtime/buffers.py; arrays still in use stay alive), glibc's `malloc_trim`;
   then reads the resident set size (RSS): the baseline;
4. calls the backward twice, dropping each result, and reads the peak RSS over both calls.

`peak` = that peak - the baseline: the steady-state footprint of a backward call, gradients
included, and whatever the backward keeps between calls (halide_ad's pool, an allocator's free
lists), as a training loop that drops last step's gradients sees it. The peak is the kernel's
high-water mark of the process's RSS (VmHWM in /proc/self/status, reset by writing 5 to
/proc/self/clear_refs), so no short-lived peak is missed between samples. `held` = RSS before the
second call - the baseline (kept between calls); `transient` = the second call's peak - RSS before
it (what a call adds on top of what is already held).

The kernel cases (`benchmarks.cases`) differentiate every input; the update cases
(`benchmarks.updates`) only their float inputs (`Programs.wrt`).

    python -m benchmarks.memory --case blur --library torch --json out.json
"""
from __future__ import annotations

import argparse
import ctypes
import gc
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

import halide_ad as hd
from benchmarks import peers
from benchmarks.cases import CASES
from benchmarks.child import run_json
from halide_ad import tiered
from halide_ad.runtime.buffers import pool

LIBRARIES = ("halide_ad", "torch", "jax")
_MIB = 2.0**20


@dataclass(frozen=True, slots=True)
class Footprint:
    """One library's backward on one case, in MiB (see the module's doc)."""

    peak: float  # peak RSS over two backward calls - the baseline
    held: float  # RSS kept between the two calls - the baseline
    transient: float  # the second call's peak - RSS just before it
    baseline: float  # RSS with inputs, cotangent, output and residuals, free memory handed back
    gradients: float  # the size of the gradients one call returns


def supported() -> bool:
    """Whether this system lets a process reset its RSS high-water mark (Linux 4.0 and later)."""
    try:
        _reset_peak()
    except OSError:
        return False
    return True


def measure_in_subprocess(case_name: str, library: str, *, small: bool) -> Footprint:
    """`library`'s backward footprint on the case named `case_name`, from a fresh process.
    Raises subprocess.CalledProcessError when that process fails."""
    arguments = ["--case", case_name, "--library", library] + (["--small"] if small else [])
    return Footprint(**run_json("benchmarks.memory", arguments))


def _status_mib(field: str) -> float:
    """A memory field of /proc/self/status (VmRSS, VmHWM; given in kB) in MiB."""
    with open("/proc/self/status") as status:
        match = re.search(rf"^{field}:\s+(\d+) kB", status.read(), re.MULTILINE)
    if match is None:
        raise OSError(f"/proc/self/status has no {field}")
    return int(match.group(1)) * 1024 / _MIB


def _reset_peak() -> None:
    """Set VmHWM to the current RSS (see proc(5), /proc/pid/clear_refs)."""
    with open("/proc/self/clear_refs", "w") as clear_refs:
        clear_refs.write("5")


def _hand_back_free_memory() -> None:
    gc.collect()
    with pool.lock:
        pool.arrays.clear()  # the arrays nothing else references are freed; the others live on
    ctypes.CDLL(None).malloc_trim(0)


def _forward(library: str, programs: Programs, inputs: Sequence[np.ndarray], ct: np.ndarray
             ) -> Callable[[], tuple[object, Callable[[], Sequence[object]]]]:
    """A function that runs the program's forward with residuals in `library` and returns its
    output and its backward: a call that returns the gradients with respect to the inputs
    `programs.wrt` once they are computed (the backward holds the residuals)."""
    if library == "halide_ad":
        def forward():
            out, vjp_fn = hd.vjp(programs.halide_ad, *inputs)
            return out, lambda: [g for k, g in enumerate(vjp_fn(ct)) if k in programs.wrt]
        return forward
    if library == "torch":
        torch = peers.load_torch(thp=False)
        xs = [torch.from_numpy(a) for a in inputs]
        wrt = [xs[k].requires_grad_(True) for k in programs.wrt]
        ct_t = torch.from_numpy(ct)

        def forward():
            y = programs.torch(*xs)
            return y, lambda: torch.autograd.grad(y, wrt, ct_t, retain_graph=True)
        return forward
    jax = peers.load_jax()
    xs = [jax.device_put(a) for a in inputs]
    ct_j = jax.device_put(ct)

    def of_wrt(*ws):  # the program as a function of the differentiated inputs
        full = list(xs)
        for k, w in zip(programs.wrt, ws, strict=True):
            full[k] = w
        return programs.jax(*full)

    vjp = jax.jit(lambda *ws: jax.vjp(of_wrt, *ws))
    apply_vjp = jax.jit(lambda vjp_fn, c: vjp_fn(c))

    def forward():
        out, vjp_fn = jax.block_until_ready(vjp(*(xs[k] for k in programs.wrt)))
        return out, lambda: jax.block_until_ready(apply_vjp(vjp_fn, ct_j))
    return forward


@dataclass(frozen=True, slots=True)
class Programs:
    """One case's program in each library, and the inputs its backward differentiates."""

    halide_ad: Callable
    torch: Callable
    jax: Callable
    wrt: tuple[int, ...]


def _programs(name: str, *, small: bool) -> tuple[Programs, list[np.ndarray], np.ndarray]:
    """The case named `name` (a kernel `Case` or an update case): its programs, inputs and
    cotangent."""
    from benchmarks.updates import UPDATE_CASES, memory_programs  # (it imports this module)

    update = next((c for c in UPDATE_CASES if c.name == name), None)
    if update is not None:
        return memory_programs(update, small=small)
    case = next(c for c in CASES if c.name == name)
    inputs = case.make_inputs(small=small)
    return (Programs(case.halide_ad, case.torch, case.jax, tuple(range(len(inputs)))), inputs,
            case.cotangent(small=small))


def measure(library: str, case_name: str, *, small: bool) -> Footprint:
    """`library`'s backward footprint on the case named `case_name`, in this process (see the
    module's doc)."""
    programs, inputs, ct = _programs(case_name, small=small)
    forward = _forward(library, programs, inputs, ct)
    for _ in range(2):  # compile; under tiered execution, until the compiled kernels have run
        forward()[1]()
        tiered.settle()
    out, backward = forward()
    _hand_back_free_memory()
    baseline = _status_mib("VmRSS")
    _reset_peak()
    gradients = sum(g.nbytes for g in backward()) / _MIB  # (torch, jax and numpy arrays)
    before = _status_mib("VmRSS")
    first_peak = _status_mib("VmHWM")
    _reset_peak()
    backward()
    second_peak = _status_mib("VmHWM")
    del out
    return Footprint(peak=max(first_peak, second_peak) - baseline, held=before - baseline,
                     transient=second_peak - before, baseline=baseline, gradients=gradients)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.memory", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--case", required=True,
                        help="a kernel case (" + ", ".join(c.name for c in CASES) + ") or an update case")
    parser.add_argument("--library", required=True, choices=LIBRARIES)
    parser.add_argument("--small", action="store_true")
    parser.add_argument("--json", required=True, type=Path, help="where to write the footprint")
    args = parser.parse_args(argv)
    args.json.write_text(json.dumps(asdict(measure(args.library, args.case, small=args.small))))


if __name__ == "__main__":
    main()
