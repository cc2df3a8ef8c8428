"""What a BLAS contraction runs for given shapes and dtypes (blas.py builds it): a `Plan` of
temporaries, copies and zero fills, and BLAS products (`matmuls.einsum_matmul`) added into the
output's windows, on `Lazy` arrays that name a buffer or a temporary and how it is indexed, built
on stand-ins that take no memory.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from halide_ad.runtime.buffers import pool
from halide_ad.runtime.engines import matmuls
from halide_ad.runtime.parallel import PARALLEL_COPY_BYTES, by_rows, copy_all


class Lazy:
    """An array that a plan reads at run time, a buffer or a temporary, indexed and reshaped
    as the plan was built: how to get it (`__call__`), and a stand-in of its shape and dtype
    (zero strides: no memory) that the plan is built with."""
    __slots__ = ("source", "ops", "stand_in")

    def __init__(self, source: str | int, ops: tuple, stand_in: np.ndarray):
        self.source, self.ops, self.stand_in = source, ops, stand_in

    @property
    def shape(self) -> tuple[int, ...]:
        return self.stand_in.shape

    @property
    def dtype(self) -> np.dtype:
        return self.stand_in.dtype

    def __getitem__(self, key) -> Lazy:
        return Lazy(self.source, self.ops + ((False, key),), self.stand_in[key])

    def reshape(self, shape: tuple[int, ...]) -> Lazy:
        return Lazy(self.source, self.ops + ((True, shape),), stand_in(shape, self.dtype))

    def __call__(self, sources: dict) -> np.ndarray:
        a = sources[self.source]
        for reshape, arg in self.ops:
            a = a.reshape(arg) if reshape else a[arg]
        return a


def stand_in(shape: tuple[int, ...], dtype) -> np.ndarray:
    """An array of this shape and dtype that takes no memory (every stride 0), to index."""
    return np.broadcast_to(np.zeros((), dtype), shape)


class Plan:
    """A contraction's work for given shapes and dtypes: temporaries to allocate, copies and
    zero fills into them (stacked windows, zero where they pad an operand) in order, then BLAS
    products written to the output's windows (`windows`: disjoint, each with the sum of its
    products), or else one product whose slices are added window by window (`sums`)."""

    def __init__(self, out: str):
        self.out = out
        self.temporaries: list[tuple[tuple[int, ...], np.dtype]] = []
        self.copies: list[tuple[Lazy, Lazy]] = []
        self.windows: list | None = None
        self.unwritten: list[tuple] | None = None
        self.sums: tuple | None = None

    def temporary(self, shape: tuple[int, ...], dtype) -> Lazy:
        self.temporaries.append((shape, dtype))
        return Lazy(len(self.temporaries) - 1, (), stand_in(shape, dtype))

    def copy(self, dst: Lazy, src: Lazy | None) -> None:
        """dst = src, or with no src, dst = 0."""
        self.copies.append((dst, src))

    def copy_shifted(self, dst: Lazy, src: Shifted) -> None:
        """dst = src: the part of the window inside its source copied, the padding around it
        zeroed, slab by slab. A convolution's input gradient stacked its windows from a
        zero-padded copy of the cotangent before: a fill and a copy more of it."""
        inside = []
        for n, m, o in zip(dst.shape, src.source.shape, src.offset, strict=True):
            lo = min(max(-o, 0), n)
            inside.append((lo, max(lo, min(n, m - o))))
        if all(hi > lo for lo, hi in inside):
            self.copy(dst[tuple(slice(lo, hi) for lo, hi in inside)],
                      src.source[tuple(slice(lo + o, hi + o) for (lo, hi), o in zip(inside, src.offset))])
        for axis, (lo, hi) in enumerate(inside):  # before and after the inside on this axis, within it on
            for pad in (slice(0, lo), slice(hi, dst.shape[axis])):  # the axes before: disjoint slabs
                if pad.stop > pad.start:
                    self.copy(dst[tuple(slice(*inside[a]) for a in range(axis)) + (pad,)], None)

    @functools.cached_property
    def rounds(self) -> list[list[tuple[Lazy, Lazy | None]]]:
        """The copies and zero fills (no source), in rounds that read only what earlier rounds
        wrote, so that each round runs in parallel (`copy_all`): a copy comes after the copies
        into the temporary it reads."""
        rounds: list[list] = []
        written: dict = {}
        for dst, src in self.copies:
            at = (-1 if src is None else written.get(src.source, -1)) + 1
            written[dst.source] = max(written.get(dst.source, 0), at)
            rounds += [[] for _ in range(at + 1 - len(rounds))]
            rounds[at].append((dst, src))
        return rounds

    def run_copies(self, sources: dict) -> None:
        """The copies and fills, round by round, into the temporaries in `sources`."""
        for copies in self.rounds:
            copy_all([(dst(sources), src if src is None else src(sources)) for dst, src in copies])

    def run(self, arrays: dict[str, np.ndarray], scale: float, assign: bool) -> None:
        sources: dict = dict(arrays)
        for k, (shape, dtype) in enumerate(self.temporaries):
            sources[k] = pool.empty(shape, dtype)
        self.run_copies(sources)
        out = arrays[self.out]
        if self.windows is not None:
            unwritten = self.unwritten if assign else []
            if unwritten is None:
                out.fill(0)
            for at in unwritten or ():  # zeroed, so that the windows need not be added to zeros
                out[at] = 0
            overwrite = assign and unwritten is not None
            for key, so, products, shifts in self.windows:
                for k, ((va, sa), (vb, sb)) in enumerate(products):
                    writes = overwrite and k == 0  # the first product writes the window, the rest add
                    direct = writes and scale == 1 and shifts == [...]
                    product = matmuls.einsum_matmul(va(sources), sa, vb(sources), sb, so, out[key] if direct else None)
                    if product is None:  # BLAS wrote the window
                        continue
                    add_products(out[key], [product[at] for at in shifts], scale, writes)
            return
        if assign:
            out.fill(0)
        va, sa, vb, sb, subs, windows = self.sums
        full = matmuls.einsum_matmul(va(sources), sa, vb(sources), sb, subs)
        for key, at in windows:
            add_products(out[key], [full[at]], scale, False)


@dataclass(frozen=True)
class Shifted:
    """A window of `source` zero-padded on every side: its element idx is source[idx +
    offset] where that is in bounds, else 0."""
    source: Lazy
    offset: tuple[int, ...]
    shape: tuple[int, ...]

    @property
    def dtype(self) -> np.dtype:
        return self.source.dtype


def add_products(window: np.ndarray, products: list[np.ndarray], scale: float, overwrite: bool) -> None:
    """window (+)= scale * the sum of products (arrays of its shape), image by image (along the
    first axis) on the threads: numpy adds on one thread (conv2d's input gradient sums three
    shifted slices of its product: 2.0-2.2 -> 1.7-1.9 ms)."""
    def add(rows) -> None:
        w, ps = window[rows], [p[rows] for p in products]
        if overwrite and scale == 1 and len(ps) > 1:  # one pass for the first two, not copy, add
            np.add(ps.pop(0), ps.pop(0), out=w)
        elif overwrite:
            write_product(w, ps.pop(0), scale, True)
        for p in ps:
            write_product(w, p, scale, False)

    nbytes = window.nbytes * (len(products) + 1)
    if window.ndim == 0 or nbytes < PARALLEL_COPY_BYTES:  # (by_rows's test, without its closures)
        add(...)
    else:
        by_rows(lambda lo, hi: add(slice(lo, hi)), len(window), nbytes)


def write_product(window: np.ndarray, product: np.ndarray, scale: float, overwrite: bool) -> None:
    """window (+)= scale * product, in one pass."""
    if scale != 1:
        np.multiply(product, product.dtype.type(scale), out=product)
    if overwrite:
        np.copyto(window, product)
    else:
        window += product
