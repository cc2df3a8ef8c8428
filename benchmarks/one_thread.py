"""Softmax and layer norm over (4096, 1024) float32, each library on one thread in one process.

    python -m benchmarks.one_thread [--repeat 41]

The runner's two-thread tables swing 20-50% with the load of a shared machine, more than the
gaps they show on these cases. Here halide_ad, PyTorch and JAX run in one process, each on one
thread (NUMBA_NUM_THREADS=1, torch.set_num_threads(1), XLA without its thread pool; halide_ad
without tiers, its kernels compiled before the first call), their calls rotated so that a
stretch of load falls on all alike, and each call is timed in CPU time: the medians compare the
work each library does. Calls are made as in the runner: halide_ad's
`vjp_fn(ct)`, PyTorch's `torch.autograd.grad` on a graph built once (forward under no_grad), and
JAX's jitted forward and jitted vjp function applied to its residuals.
"""
from __future__ import annotations

import os

os.environ["NUMBA_NUM_THREADS"] = "1"
os.environ["HALIDE_AD_TIERED"] = "0"  # steady state: no background compile to count
os.environ["XLA_FLAGS"] = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"

import argparse  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

import halide_ad as hd  # noqa: E402
from benchmarks import everyday  # noqa: E402


def _calls(name: str, inputs: list[np.ndarray]) -> dict[str, object]:
    """{library pass: a call}, for everyday's case `name`."""
    import jax
    import torch
    torch.set_num_threads(1)
    ours, theirs, jaxs = (getattr(everyday, f"{p}{name}") for p in ("", "torch_", "jax_"))
    out, vjp_fn = hd.vjp(ours, *inputs)
    ct = np.random.default_rng(1).standard_normal(out.shape).astype(np.float32)
    xs = [torch.from_numpy(x).requires_grad_() for x in inputs]
    y, t_ct = theirs(*xs), torch.from_numpy(ct)

    def torch_forward():
        with torch.no_grad():
            theirs(*xs)
    forward = jax.jit(jaxs)
    _, j_vjp = jax.jit(lambda *a: jax.vjp(jaxs, *a))(*inputs)
    apply = jax.jit(lambda f, c: f(c))
    return {"halide_ad forward": lambda: ours(*inputs),
            "halide_ad backward": lambda: vjp_fn(ct),
            "PyTorch forward": torch_forward,
            "PyTorch backward": lambda: torch.autograd.grad(y, xs, t_ct, retain_graph=True),
            "JAX forward": lambda: jax.block_until_ready(forward(*inputs)),
            "JAX backward": lambda: jax.block_until_ready(apply(j_vjp, ct))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=41)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    x = rng.standard_normal(everyday.ROWS).astype(np.float32)
    gamma, beta = (rng.standard_normal(everyday.ROWS[1]).astype(np.float32) for _ in range(2))
    calls = {name: _calls(name, inputs) for name, inputs in (("softmax", [x]), ("layer_norm", [x, gamma, beta]))}
    times: dict[tuple[str, str], list[float]] = {(n, k): [] for n, c in calls.items() for k in c}
    for _ in range(3):  # warm-up: compiles, buffer pools, page faults
        for c in calls.values():
            for f in c.values():
                f()
    for _ in range(args.repeat):
        for name, c in calls.items():
            for key, f in c.items():
                t0 = time.process_time()
                f()
                times[name, key].append(time.process_time() - t0)
    print(f"CPU-time medians of {args.repeat} rotated calls, one thread each, (4096, 1024) float32, "
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
