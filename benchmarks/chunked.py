"""The chunked case (`python -m benchmarks --cases chunked`): a 5x5 blur of a float32 image as a dask
array, in halide_ad.dask, forward then vjp, against the same `@hd.func` on the whole numpy array and,
forward only, against dask-image's `ndfilters.convolve` (`mode="nearest"`, as `hd.repeat_edge`) on
the same chunks.

Each pass runs unchunked, then chunked on dask's threaded scheduler, and on a
`distributed.LocalCluster` of 1, then 2, worker processes of one thread each, with the chunks
persisted on the workers, as a cluster's data is. The overhead of chunking is a chunked time over
the unchunked one; the scaling is the 1-worker time over the 2-worker time. (A task's kernels
run on its worker's share of the cores, one each here: `halide_ad.blocks.task_threads`.)
Times are medians of `--repeat` runs after one warm-up run. Every chunked result is checked
against the unchunked one: the forward and the input gradient bit for bit, the kernel's gradient
(summed over the chunks) and dask-image's forward to float32 rounding.

Needs the dask extra; dask-image (the bench extra) gives the peer column.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import numpy as np

import halide_ad as hd
from benchmarks.timing import measure
from halide_ad import tiered

SIZE, CHUNK = 8192, 2048
SMALL_SIZE, SMALL_CHUNK = 512, 128
PEER = "dask-image"


@dataclass(frozen=True, slots=True)
class ChunkedCase:
    name: str
    description: str


CHUNKED_BLUR = ChunkedCase(
    "chunked_blur", f"5x5 blur (edges repeated) of a {SIZE}^2 float32 dask array in {CHUNK}^2 chunks, "
    "forward and vjp (input and kernel gradients), halide_ad.dask against the unchunked @hd.func and, "
    "forward only, dask-image's ndfilters.convolve on the same chunks")


@dataclass(slots=True)
class ChunkedRow:
    """One pass on one scheduler: medians in seconds, and the check of the chunked values."""

    phase: str  # "forward" or "vjp"
    scheduler: str  # "unchunked", "threads", "1 worker process", "2 worker processes"
    seconds: float | None = None  # halide_ad's
    unchunked_s: float | None = None
    peer_s: float | None = None  # dask-image's, forward only
    mismatch: str | None = None  # what differs from the unchunked values
    errors: dict[str, str] = field(default_factory=dict)


@hd.func
def blur5(x, k):
    """x correlated with the 5x5 kernel k, the same size as x (edges repeated)."""
    e = hd.repeat_edge(x)
    r, s = hd.rdom(5, 5)
    return hd.compute(x.shape, lambda i, j: hd.sum(e[i + r - 2, j + s - 2] * k[r, s]))


def _median_s(fn, repeat: int) -> float:
    fn()  # compiles, or loads the kernels
    tiered.settle()  # the kernels, not the interpreter tier, in the timed runs
    return measure(fn, repeat, warmup=1).median_ms * 1e-3


def run_chunked(case: ChunkedCase, *, small: bool, repeat: int) -> list[ChunkedRow]:
    """The case's rows: each pass unchunked, then chunked on each scheduler."""
    import dask
    import dask.array as da
    from distributed import Client, LocalCluster

    import halide_ad.dask as hdd

    size, chunk = (SMALL_SIZE, SMALL_CHUNK) if small else (SIZE, CHUNK)
    warnings.filterwarnings("ignore", message="Sending large graph")  # the local chunks, shipped once
    rng = np.random.default_rng(0)
    x = rng.standard_normal((size, size), dtype=np.float32)
    k = rng.random((5, 5), dtype=np.float32)
    ct = rng.standard_normal(x.shape, dtype=np.float32)
    whole = blur5(x, k)
    whole_grads = hd.vjp(blur5, x, k)[1](ct)
    base = {"forward": _median_s(lambda: blur5(x, k), repeat),
            "vjp": _median_s(lambda: hd.vjp(blur5, x, k)[1](ct), repeat)}
    rows = [ChunkedRow(phase, "unchunked", s, s) for phase, s in base.items()]
    peer = _peer()

    def on(scheduler: str, get, xd, ctd) -> list[ChunkedRow]:
        forward = lambda: hdd.function(blur5)(xd, k).compute(scheduler=get)  # noqa: E731
        vjp = lambda: dask.compute(*hdd.vjp(blur5, xd, k)[1](ctd), scheduler=get)  # noqa: E731
        f_row, v_row = ChunkedRow("forward", scheduler), ChunkedRow("vjp", scheduler)
        f_row.unchunked_s, v_row.unchunked_s = base["forward"], base["vjp"]
        f_row.mismatch = _differs(forward(), whole, exact=True)
        gx, gk = vjp()
        v_row.mismatch = _differs(gx, whole_grads[0], exact=True) or _differs(gk, whole_grads[1])
        f_row.seconds, v_row.seconds = _median_s(forward, repeat), _median_s(vjp, repeat)
        if peer is not None:
            run_peer = lambda: peer(xd, k[::-1, ::-1], mode="nearest").compute(scheduler=get)  # noqa: E731
            if error := _differs(run_peer(), whole):
                f_row.errors[PEER] = f"its forward differs from halide_ad's: {error}"
            else:
                f_row.peer_s = _median_s(run_peer, repeat)
        return [f_row, v_row]

    xd = da.from_array(x, chunks=chunk).persist(scheduler="threads")
    ctd = da.from_array(ct, chunks=chunk).persist(scheduler="threads")
    rows += on("threads", "threads", xd, ctd)
    for workers in (1, 2):
        with LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                          dashboard_address=None) as cluster, Client(cluster) as client:
            on_workers = client.persist([xd, ctd])
            rows += on(f"{workers} worker process{'es' if workers > 1 else ''}", client.get, *on_workers)
    return sorted(rows, key=lambda row: row.phase)  # (a stable sort: schedulers keep their order)


def _peer():
    """dask-image's convolve, or None where it is not installed."""
    try:
        from dask_image.ndfilters import convolve
    except ImportError:
        return None
    return convolve


def _differs(got: np.ndarray, want: np.ndarray, *, exact: bool = False) -> str | None:
    """None where `got` equals `want` (to float32 rounding unless `exact`), else how it differs."""
    if exact and np.array_equal(got, want) or not exact and np.allclose(got, want, rtol=1e-4, atol=1e-4):
        return None
    return f"max abs difference {np.max(np.abs(got - want)):.3g}" + (" (bit-exact expected)" if exact else "")


def chunked_table(rows: list[ChunkedRow]) -> list[str]:
    """The markdown table, then the 1 -> 2 workers scaling per pass."""
    peer = any(row.peer_s is not None or PEER in row.errors for row in rows)
    header = ["pass", "run", "halide_ad", "/ unchunked", *([PEER, f"{PEER} / halide_ad"] if peer else []),
              "check"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        check = "reference" if row.scheduler == "unchunked" else (
            f"✗ {row.mismatch}" if row.mismatch else "ok vs unchunked")
        ours = "–" if row.seconds is None else f"{row.seconds:.3f} s"
        ratio = "–" if row.seconds is None else f"{row.seconds / row.unchunked_s:.2f}"
        cells = [row.phase, row.scheduler, ours, ratio]
        if peer:
            cells += (["error", "–"] if PEER in row.errors else ["–", "–"] if row.peer_s is None
                      else [f"{row.peer_s:.3f} s", f"{row.peer_s / row.seconds:.2f}"])
        lines.append("| " + " | ".join(cells + [check]) + " |")
    times = {(row.phase, row.scheduler): row.seconds for row in rows}
    scaling = [f"{phase} {times[(phase, '1 worker process')] / times[(phase, '2 worker processes')]:.2f}x"
               for phase in ("forward", "vjp")]
    return [*lines, "", f"1 -> 2 worker processes: {', '.join(scaling)} as fast."]
