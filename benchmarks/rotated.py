"""tanh over 4M float32, softmax and layer norm over (4096, 1024), the three libraries in one
process, their calls rotated, on a fixed number of threads.

    python -m benchmarks.rotated [--threads 1] [--repeat 41]

The runner's two-thread tables swing 20-50% with the load of a shared machine, more than the
gaps they show on these cases. Here halide_ad, PyTorch and JAX run in one process on the same
number of threads (numba's and torch's thread counts; XLA without its thread pool on one
thread), halide_ad without tiers (its kernels compiled before the first call). Each round calls
every library's pass once, back to back, in a fixed order, so that a stretch of load falls on
all alike; each call follows an untimed call of its own. On one thread a call is timed in CPU
time, which compares the work each library does; on more, in wall time. The calls are the
runner's (`ours.prepare_halide_ad`, `peers.prepare_torch`, `peers.prepare_jax`): halide_ad's
`vjp_fn(ct)`, PyTorch's `torch.autograd.grad` on a graph built once (forward under no_grad),
and JAX's jitted forward and jitted vjp function applied to its residuals.
"""
from __future__ import annotations

import argparse
import os
import time

import numpy as np


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=41)
    return parser.parse_args()


def _calls(name: str) -> dict[str, object]:
    """{library pass: a call}, for everyday's case `name`, as the runner prepares them
    (`ours.prepare_halide_ad`, `peers.prepare_torch` with its default allocator, `peers.prepare_jax`),
    with a backward for every case (the runner times tanh's forward only)."""
    from benchmarks import everyday, ours, peers
    case = next(c for c in everyday.EVERYDAY_CASES if c.name == name)
    inputs, ct = case.make_inputs(small=False), case.cotangent(small=False)
    prepared = {"halide_ad": ours.prepare_halide_ad(case.halide_ad, inputs, ct),
                "PyTorch": peers.prepare_torch(case.torch, inputs, ct, thp=False),
                "JAX": peers.prepare_jax(case.jax, inputs, ct)}
    return {f"{library} {p}": getattr(passes, p) for library, passes in prepared.items() for p in ("forward", "backward")}


def main() -> None:
    args = _arguments()
    os.environ["NUMBA_NUM_THREADS"] = str(args.threads)  # before numba's import, as XLA's flags before jax's
    os.environ["HALIDE_AD_TIERED"] = "0"  # steady state: no background compile to count
    if args.threads == 1:
        os.environ["XLA_FLAGS"] = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
    clock = time.process_time if args.threads == 1 else time.perf_counter
    calls = {name: _calls(name) for name in ("tanh", "softmax", "layer_norm")}
    times: dict[tuple[str, str], list[float]] = {(n, k): [] for n, c in calls.items() for k in c}
    for _ in range(3):  # warm-up: compiles, buffer pools, page faults
        for c in calls.values():
            for f in c.values():
                f()
    for _ in range(args.repeat):
        for name, c in calls.items():
            for key, f in c.items():
                f()
                t0 = clock()
                f()
                times[name, key].append(clock() - t0)
    kind = "CPU-time" if args.threads == 1 else "wall-time"
    print(f"{kind} medians of {args.repeat} rotated calls, {args.threads} thread(s) each, float32, "
          f"load average {os.getloadavg()[0]:.1f}:\n")
    print("| case | pass | halide_ad | PyTorch | JAX | best peer / halide_ad |\n|---|---|---|---|---|---|")
    for name in calls:
        for p in ("forward", "backward"):
            ms = {lib: 1e3 * float(np.median(times[name, f"{lib} {p}"])) for lib in ("halide_ad", "PyTorch", "JAX")}
            best = min(ms["PyTorch"], ms["JAX"])
            print(f"| {name} | {p} | {ms['halide_ad']:.2f} ms | {ms['PyTorch']:.2f} ms | {ms['JAX']:.2f} ms | "
                  f"{best / ms['halide_ad']:.2f}× |")


if __name__ == "__main__":
    main()
