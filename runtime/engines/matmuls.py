"""einsum of two operands as BLAS matrix products on views of them, planned once per layout
(`matmul_plan`). The BLAS engine (blas.py) calls `einsum_matmul` for each product of a
contraction."""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from halide_ad.runtime.buffers import pool
from halide_ad.runtime.parallel import matmul

SMALL_PRODUCT = 1 << 16  # products this small are cheap to write in any order (a weight gradient)


def einsum_matmul(va, sa: str, vb, sb: str, out: str, into: np.ndarray | None = None) -> np.ndarray | None:
    """einsum(f"{sa},{sb}->{out}", va, vb) as BLAS matrix products (see `matmul_plan`); a
    convolution calls it with the same layouts every step, so the plan is worked out once.
    With `into`, an array of the product's shape and dtype, BLAS writes the product there
    where that array is contiguous in the product's layout, and None is returned."""
    plan = matmul_plan(sa, va.shape, va.strides, sb, vb.shape, vb.strides, out)
    if plan is None:
        return np.einsum(f"{sa},{sb}->{out}", va, vb, optimize=True)
    if plan.swap:
        va, vb = vb, va
    a, b = plan.a(va), plan.b(vb)
    shape = (max(a.shape[0], b.shape[0]), a.shape[1], b.shape[2])
    if (into is not None and plan.images == "batched" and plan.perm == tuple(range(len(plan.perm)))
            and into.shape == plan.shape and into.flags.c_contiguous and into.dtype == va.dtype):
        matmul(a, b, into.reshape(shape))
        return None
    product = pool.empty(shape, va.dtype)
    matmul(a, b, product)
    if plan.images == "summed":
        product = product.sum(axis=0)
    return product.reshape(plan.shape).transpose(plan.perm)


@dataclass(frozen=True)
class Operand:
    """An operand's axes put in `perm` order and merged into (batch, rows, columns): a view
    of it, or with `copy`, of a contiguous copy."""
    perm: tuple[int, ...]
    shape: tuple[int, int, int]
    copy: bool

    def __call__(self, v: np.ndarray) -> np.ndarray:
        v = v.transpose(self.perm)
        return (np.ascontiguousarray(v) if self.copy else v).reshape(self.shape)


@dataclass(frozen=True)
class MatmulPlan:
    swap: bool
    a: Operand
    b: Operand
    images: str  # "batched": an axis of the output; "summed": one product per image, then summed
    shape: tuple[int, ...]  # the product's letters, unmerged
    perm: tuple[int, ...]  # from those letters to the output's


@functools.lru_cache(maxsize=1024)
def matmul_plan(sa: str, shape_a, strides_a, sb: str, shape_b, strides_b, out: str) -> MatmulPlan | None:
    """How to compute einsum(f"{sa},{sb}->{out}") on operands of these shapes and strides as
    BLAS matrix products, without copying the larger operand where its strides allow: each
    operand's axes are grouped in memory order into (free, summed) matrices, batched over the
    larger operand's outermost axis when grouping needs it (a convolution's image index), and
    the operand holding the output's last letter goes right, so that the product's innermost
    axis is the output's; a small product (a weight gradient) puts the operand with more free
    points left, where BLAS runs faster (32x96 rows and columns, summing 3844: 73-89 against
    100 GFLOP/s). A small operand is copied where that saves batching. None where einsum must
    do it: letters in both operands and the output, or repeated."""
    summed = [c for c in sa if c in sb and c not in out]
    free_a, free_b = [c for c in sa if c not in sb], [c for c in sb if c not in sa]
    if sorted(free_a + free_b) != sorted(out) or len(set(sa + sb)) != len(free_a + free_b + summed):
        return None
    a, b = (sa, shape_a, strides_a), (sb, shape_b, strides_b)
    size = dict(zip(sa, shape_a)) | dict(zip(sb, shape_b))
    rows, cols = (math.prod(size[c] for c in free) for free in (free_a, free_b))
    swap = rows < cols if rows * cols <= SMALL_PRODUCT else bool(out) and out[-1] in sa
    if swap:
        a, b, free_a, free_b = b, a, free_b, free_a
    big, small = (a, b) if math.prod(a[1]) >= math.prod(b[1]) else (b, a)

    def memory_order(operand, letters) -> list[str]:
        subs, _, strides = operand
        return sorted(letters, key=lambda c: -abs(strides[subs.index(c)]))

    summed = memory_order(big, summed)
    free_a, free_b = memory_order(a, free_a), memory_order(b, free_b)
    outer = memory_order(big, big[0])[0] if big[0] else None

    def operand(o, groups, copy: str) -> Operand | None:
        """`o` as (batch, rows, columns) from its letters in `groups`; `copy`: "never", "if
        needed" (where the groups' axes do not merge) or "always"."""
        subs, shape, strides = o
        groups = [[c for c in groups[0] if c in subs], *groups[1:]]
        order = [c for group in groups for c in group]
        copied = copy == "always" or not _mergeable(subs, shape, strides, groups)
        if copied and copy == "never":
            return None
        return Operand(tuple(subs.index(c) for c in order),
                        tuple(math.prod(size[c] for c in group) for group in groups), copied)

    def layout(batch, copy_small, copy_big="never"):
        fa, fb, s = ([c for c in x if c not in batch] for x in (free_a, free_b, summed))
        oa = operand(a, [batch, fa, s], copy_small if a is small else copy_big)
        ob = operand(b, [batch, s, fb], copy_small if b is small else copy_big)
        return None if oa is None or ob is None else (oa, ob, batch, fa, fb)

    # views beat a copy, except that a small operand is cheaper to copy than the product to batch
    tries = [([], "never"), ([], "if needed")] if math.prod(small[1]) <= SMALL_PRODUCT else [([], "never")]
    if outer is not None and size[outer] > 1:
        tries += [([outer], "never"), ([outer], "if needed")]
    found = next(filter(None, (layout(batch, copy) for batch, copy in tries)), None)
    # else the larger operand is copied as well
    oa, ob, batch, free_a, free_b = found or layout([], "if needed", "if needed")
    letters = free_a + free_b
    images = "summed" if batch and batch[0] not in out else "batched"
    if batch and images == "batched":
        letters = batch + letters
    return MatmulPlan(swap, oa, ob, images, tuple(size[c] for c in letters),
                       tuple(letters.index(c) for c in out))


def _mergeable(subs: str, shape, strides, groups: list[list[str]]) -> bool:
    """Whether each group of letters' axes merge into one axis without a copy."""
    for group in groups:
        axes = [subs.index(c) for c in group if shape[subs.index(c)] != 1]
        if any(strides[x] != strides[y] * shape[y] for x, y in zip(axes, axes[1:])):
            return False
    return True
