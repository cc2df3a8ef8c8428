"""python -m benchmarks.chunked: a 5x5 blur on a dask array, chunked, against the same blur on the
whole array, and (forward only) against dask-image's `ndfilters.convolve` on the same chunks.

Rows: the forward and the vjp (input and kernel gradients), each
* unchunked: the `@hd.func` on the whole numpy array;
* chunked, on dask's threaded scheduler;
* chunked, on a `distributed.LocalCluster` of 1 and of 2 worker processes (one thread each;
  the kernels inside a task still use every core);
* forward only: dask-image's `ndfilters.convolve` (`mode="nearest"`, as `hd.repeat_edge`) on the
  same chunks, or, without dask-image, what it runs: `map_overlap` of `scipy.ndimage.convolve`.

The overhead of chunking is the threaded time over the unchunked one. Each row is the median of
`--repeat` runs after a warm-up run (which compiles), and every chunked result is checked against
the unchunked one. Needs the dask extra. `--small` is a smoke run whose times mean nothing.

    python -m benchmarks.chunked                       # 8192^2 float32 in 2048^2 chunks
    python -m benchmarks.chunked --size 4096 --chunk 1024 --repeat 3
"""
from __future__ import annotations

import argparse
import os
import statistics
import time
import warnings

import dask
import dask.array as da
import numpy as np
from distributed import Client, LocalCluster

import halide_ad as hd
import halide_ad.dask as hdd
from halide_ad import tiered


@hd.func
def blur5(x, k):
    """x correlated with the 5x5 kernel k, the same size as x (edges repeated)."""
    e = hd.repeat_edge(x)
    r, s = hd.rdom(5, 5)
    return hd.compute(x.shape, lambda i, j: hd.sum(e[i + r - 2, j + s - 2] * k[r, s]))


def _median_s(fn, repeat: int) -> float:
    fn()  # compiles, or loads the kernels
    tiered.settle()  # the kernels, not the interpreter tier, in the timed runs
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def _peer_convolve(xd, k):
    """dask-image's convolve, or the map_overlap of scipy's that it is."""
    try:
        from dask_image.ndfilters import convolve
        return "dask-image ndfilters.convolve", lambda: convolve(xd, k[::-1, ::-1], mode="nearest")
    except ImportError:
        from scipy import ndimage
        run = lambda: xd.map_overlap(ndimage.convolve, depth=2, boundary="none",  # noqa: E731
                                     weights=k[::-1, ::-1], mode="nearest")
        return "map_overlap(scipy.ndimage.convolve)", run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=8192)
    parser.add_argument("--chunk", type=int, default=2048)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--small", action="store_true", help="512^2 in 128^2 chunks, 1 run: a smoke test")
    args = parser.parse_args()
    warnings.filterwarnings("ignore", message="Sending large graph")  # the local chunks, shipped once
    if args.small:
        args.size, args.chunk, args.repeat = 512, 128, 1
    rng = np.random.default_rng(0)
    x = rng.standard_normal((args.size, args.size), dtype=np.float32)
    k = rng.random((5, 5), dtype=np.float32)
    ct = rng.standard_normal(x.shape, dtype=np.float32)
    xd = da.from_array(x, chunks=args.chunk).persist(scheduler="threads")
    ctd = da.from_array(ct, chunks=args.chunk).persist(scheduler="threads")

    whole = blur5(x, k)
    whole_grads = hd.vjp(blur5, x, k)[1](ct)
    rows = [("forward", "unchunked", _median_s(lambda: blur5(x, k), args.repeat)),
            ("vjp", "unchunked", _median_s(lambda: hd.vjp(blur5, x, k)[1](ct), args.repeat))]

    def forward(scheduler, xd=xd):
        return hdd.function(blur5)(xd, k).compute(scheduler=scheduler)

    def vjp(scheduler, xd=xd, ctd=ctd):
        return dask.compute(*hdd.vjp(blur5, xd, k)[1](ctd), scheduler=scheduler)

    assert np.array_equal(forward("threads"), whole), "the chunked forward differs from the unchunked one"
    gx, gk = vjp("threads")
    assert np.array_equal(gx, whole_grads[0]), "the chunked input gradient differs from the unchunked one"
    np.testing.assert_allclose(gk, whole_grads[1], rtol=1e-4)
    peer_name, peer = _peer_convolve(xd, k)
    np.testing.assert_allclose(peer().compute(scheduler="threads"), whole, rtol=1e-4, atol=1e-4)

    def chunked_rows(scheduler, where: str, xd=xd, ctd=ctd) -> list:
        _, peer = _peer_convolve(xd, k)
        return [("forward", f"chunked, {where}", _median_s(lambda: forward(scheduler, xd), args.repeat)),
                ("vjp", f"chunked, {where}", _median_s(lambda: vjp(scheduler, xd, ctd), args.repeat)),
                ("forward", f"{peer_name}, {where}",
                 _median_s(lambda: peer().compute(scheduler=scheduler), args.repeat))]

    rows += chunked_rows("threads", "threads")
    for workers in (1, 2):
        with LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                          dashboard_address=None) as cluster, Client(cluster) as client:
            on_workers = client.persist([xd, ctd])  # the chunks live on the workers, as a cluster's data does
            where = f"{workers} worker process{'es' if workers > 1 else ''}"
            rows += chunked_rows(client.get, where, *on_workers)

    print(f"5x5 blur, {args.size}^2 float32 in {args.chunk}^2 chunks; median of {args.repeat}; "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs\n")
    print("| pass | run | seconds | / unchunked |\n|---|---|---|---|")
    base = {phase: s for phase, run, s in rows if run == "unchunked"}
    for phase, run, s in rows:
        print(f"| {phase} | {run} | {s:.3f} | {s / base[phase]:.2f} |")


if __name__ == "__main__":
    main()
