"""Recover a 5x5 blur kernel from a sharp and a blurred image too large to process in one piece,
with halide_ad.dask on a dask.distributed LocalCluster.

The sharp image is white noise, generated chunk by chunk; the blurred one is its blur by a kernel
we then forget, plus a little noise. Each step computes, chunk by chunk, the squared error of the
blurred estimate and its gradient with respect to the kernel (each chunk's gradient from the
same compiled gather kernels as `hd.vjp`, the chunks' sums added in a fixed tree order), then
takes a Newton step: for white noise the error's Hessian in the kernel is 2 * pixels * identity.

Run: python examples/large_deconvolution.py                         # 16384^2 float32, 2048^2 chunks
     python examples/large_deconvolution.py --size 1024 --chunk 256   # a quick run
Needs the dask extra: pip install -e ".[dask]"
"""
from __future__ import annotations

import argparse
import time

import dask.array as da
import numpy as np
from distributed import Client, LocalCluster, progress

import halide_ad as hd
import halide_ad.dask as hdd


@hd.func
def blur(x, k):
    """x blurred by k, the same size as x (edges repeated)."""
    e = hd.repeat_edge(x)
    kh, kw = k.shape
    r, s = hd.rdom(kh, kw)
    return hd.compute(x.shape, lambda i, j: hd.sum(e[i + r - kh // 2, j + s - kw // 2] * k[r, s]))


@hd.func
def squared_error(x, k, observed):
    """Per pixel, (blur(x, k) - observed)**2."""
    b = blur(x, k)
    return hd.compute(x.shape, lambda i, j: (b[i, j] - observed[i, j]) ** 2)


def true_kernel(size: int = 5) -> np.ndarray:
    y, x = np.mgrid[:size, :size] - size // 2
    k = np.exp(-(x ** 2 / 2.0 + y ** 2 / 0.6) / 2) + 0.3 * (x == y)  # a wide Gaussian and a streak
    return (k / k.sum()).astype(np.float32)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=16384, help="image side (default 16384)")
    parser.add_argument("--chunk", type=int, default=2048, help="chunk side (default 2048)")
    parser.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()

    with LocalCluster(n_workers=args.workers, threads_per_worker=1, processes=True) as cluster, \
            Client(cluster) as client:
        print(f"dashboard: {client.dashboard_link}")
        chunks = (args.chunk, args.chunk)
        shape = (args.size, args.size)
        sharp = da.random.default_rng(0).standard_normal(shape, chunks=chunks, dtype=np.float32)
        noise = da.random.default_rng(1).standard_normal(shape, chunks=chunks, dtype=np.float32)
        k_true = true_kernel()
        observed = hdd.function(blur)(sharp, k_true) + np.float32(0.01) * noise
        sharp, observed = client.persist([sharp, observed])
        progress([sharp, observed])
        print()

        pixels = args.size * args.size
        k = np.full((5, 5), 1 / 25, np.float32)
        for step in range(args.steps):
            start = time.perf_counter()
            error, vjp_fn = hdd.vjp(squared_error, sharp, k, observed)
            _, grad_k, _ = vjp_fn(da.ones_like(error))
            futures = client.compute([error.sum(dtype=np.float64), grad_k])
            progress(futures)
            total, grad_k = client.gather(futures)
            k = k - grad_k / np.float32(2 * pixels)
            rel = np.linalg.norm(k - k_true) / np.linalg.norm(k_true)
            print(f"\nstep {step}: mean squared error {total / pixels:.3e}, kernel error {rel:.2%} "
                  f"({time.perf_counter() - start:.1f} s)")
        print("recovered kernel:\n", np.array2string(k, precision=3, suppress_small=True))


if __name__ == "__main__":
    main()
