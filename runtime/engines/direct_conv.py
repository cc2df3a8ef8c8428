"""Direct 2-D convolutions: register-blocked SIMD kernels instead of BLAS on stacked copies.

A convolution `y[n, o, i, j] = sum over c, r, s of x[n, c, i + r, j + s] * k[o, c, r, s]` and its
two gradients are contractions (`runtime/contract.py`), the engine `plan` takes them, but as BLAS products they are
products of 32 rows by a stacked copy of the image: BLAS packs the big operand for a few rows
of the other, and the copies and shifted sums around it cost a third as much again. These
kernels read the arrays where they are (or one padded or phase-split copy) and keep a block of
outputs in vector registers for the whole reduction (`runtime/engines/simd.py`), as oneDNN's convolutions do:

* `forward`, and the input gradient as a correlation of the zero-padded cotangent with the
  flipped kernel: a block of 4 output channels by 2 vectors of columns, each loaded input row
  multiplied by 4 broadcast weights;
* the weight gradient: a block of 4 output channels by 3 taps, summed over images, rows and
  vectors of columns, each lane a partial sum added up once at the end.

At a stride (`x[n, c, 2 * i + r, 2 * j + s]`) the forward and the weight gradient read a copy
of x whose rows hold their columns grouped by phase (even columns, then odd ones), so that a tap's
columns are contiguous again; the input gradient writes its rows so, one correlation per phase,
and interleaves them (`strided_input_source`).

Blocks that would run past the last column (or channel) start earlier instead and overlap the
block before, so no load leaves a row and no lane is masked; where the kernel adds to what the
output holds, the lanes (and channels) that the block before wrote are left out.

Every kernel is generated for its shapes, so its loops have constant trip counts that LLVM
unrolls, and compiled once through the kernel cache (`runtime/compile.py`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numba
import numpy as np

from halide_ad import config
from halide_ad.runtime.buffers import pool
from halide_ad.runtime.compile import compile_kernel
from halide_ad.runtime.contract import Contraction, terms
from halide_ad.runtime.engines import blas
from halide_ad.runtime.engines.conv_kernels import (CHANNELS, correlation_source, phase_width, strided_input_source,
                                                   weight_gradient_source)
from halide_ad.runtime.engines.simd import lanes

MIN_WORK = 1 << 24  # multiply-adds from which a kernel's compile (~1 s, once) pays off against BLAS's path


@dataclass(frozen=True)
class DirectConvolution:
    """One of the three sums of a 2-D convolution at strides (SH, SW): `role` names what `out`
    is, the forward's output y (N, O, Ho, Wo), its input x (N, C, Hi, Wi) or its kernel k, whose
    axes `k_axes` hold (o, c, r, s)."""
    role: str  # "forward", "input" or "weight"
    out: str
    y: str
    x: str
    k: str
    k_axes: tuple[int, int, int, int]
    N: int
    O: int
    C: int
    Ho: int
    Wo: int
    KH: int
    KW: int
    Hi: int
    Wi: int
    SH: int
    SW: int
    scale: float
    dtype: str

    def run(self, arrays: dict[str, np.ndarray], assign: bool) -> None:
        """out (+)= scale * the sum, on the kernel threads."""
        dtype = np.dtype(self.dtype)
        out = arrays[self.out]
        target = out if out.flags.c_contiguous else np.empty(out.shape, dtype)
        kernel = self._kernel(assign or target is not out)
        y = np.ascontiguousarray(arrays[self.y], dtype).reshape(-1)
        o, c, r, s = self.k_axes
        k = arrays[self.k]
        if self.role == "input":
            # adj_x[n, c, i, j] = sum over o, r, s of adj_y_padded[n, o, i + r, j + s] * k[o, c, KH - 1 - r,
            # KW - 1 - s], adj_y with KH - 1 rows and KW - 1 columns of zeros around; at a stride, per
            # column phase (`strided_input_source`)
            Hp, Wp = self.padded
            padded = pool.empty((self.N * self.O * Hp * Wp,), dtype)
            if (self.SH, self.SW) == (1, 1):
                flipped = k.transpose(o, r, s, c)[:, ::-1, ::-1, :]
                kernel(y, padded, _blocks(flipped, self.scale, dtype), target.reshape(-1))
            else:
                blocks = _blocks(k.transpose(o, r, s, c), self.scale, dtype)
                kernel(y, padded, blocks, self._split_rows(dtype), target.reshape(-1))
        else:
            x = (np.ascontiguousarray(arrays[self.x], dtype).reshape(-1),)
            if self.SW > 1:  # and a buffer for x split by column phase (conv_kernels.py)
                x += (self._split_rows(dtype),)
            if self.role == "weight":
                kernel(y, *x, target.reshape(-1))
            else:
                kernel(*x, _blocks(k.transpose(c, r, s, o), self.scale, dtype), target.reshape(-1))
        if target is not out:
            if assign:
                out[...] = target
            else:
                out += target

    def _split_rows(self, dtype) -> np.ndarray:
        """A buffer for x with its rows split by column phase (conv_kernels.py), flat."""
        return pool.empty((self.N * self.C * self.Hi * self.SW * phase_width(self.Wi, self.SW),), dtype)

    @property
    def padded(self) -> tuple[int, int]:
        """The height and width of the input gradient's padded cotangent (at a stride, padded in
        its columns only, `strided_input_source`)."""
        if (self.SH, self.SW) != (1, 1):
            return self.Ho, phase_width(self.Wi, self.SW) + (self.KW - 1) // self.SW
        return self.Ho + 2 * self.KH - 2, self.Wo + 2 * self.KW - 2

    def _kernel(self, assign: bool):
        kernels = self.__dict__.setdefault("_kernels", {})  # frozen, but a cache is not a field
        if assign not in kernels:
            L = lanes(np.dtype(self.dtype).itemsize)
            N, O, C, Ho, Wo, KH, KW = self.N, self.O, self.C, self.Ho, self.Wo, self.KH, self.KW
            stride = (self.SH, self.SW)
            if self.role == "weight":
                strides = _strides(self.k_axes, O, C, KH, KW)
                source = weight_gradient_source(N, O, C, Ho, Wo, KH, KW, L, strides, self.scale, assign,
                                                self.Hi, self.Wi, stride)
            elif self.role == "forward":
                source = correlation_source(N, C, self.Hi, self.Wi, KH, KW, O, L, assign, stride=stride)
            elif stride == (1, 1):
                pad = (KH - 1, KW - 1)
                source = correlation_source(N, O, *self.padded, KH, KW, C, L, assign, padding=pad)
            else:
                source = strided_input_source(N, O, C, Ho, Wo, KH, KW, self.Hi, self.Wi, stride, L, assign)
            kernels[assign] = compile_kernel(source, "run", f"direct convolution, {self.role} ({self.dtype})")
        return kernels[assign]


def _blocks(k: np.ndarray, scale: float, dtype) -> np.ndarray:
    """scale * k (Ci, KH, KW, Co) as the correlation's blocks of output channels read it, each
    block's weights together: (blocks, Ci, KH, KW, CHANNELS), the last block overlapping the one
    before (4.6 KB a block where 32 channels' rows spread it over 18 KB of cache lines); flat."""
    Co = k.shape[3]
    width = min(CHANNELS, Co)
    starts = [min(b, Co - width) for b in range(0, Co, width)]
    return (np.stack([k[..., b:b + width] for b in starts]) * np.asarray(scale, dtype)).reshape(-1)


def _strides(k_axes, O, C, KH, KW) -> tuple[int, int, int, int]:
    """The element strides of o, c, r and s in the C-ordered kernel whose axes k_axes hold them."""
    shape = [0] * 4
    for axis, extent in zip(k_axes, (O, C, KH, KW), strict=True):
        shape[axis] = extent
    strides = [math.prod(shape[a + 1:]) for a in range(4)]
    return tuple(strides[a] for a in k_axes)


def plan(c: Contraction, *, any_size: bool = False) -> DirectPlan | None:
    """The direct kernel's plan for contraction `c`, where it is a 2-D convolution sum big enough
    (`convolution`; with `any_size`, of any size), else None."""
    if c.b is None or c.a.dtype != c.b.dtype:
        return None
    forms = [[terms(e) for e in index] for index in (c.out_index, c.a.index, c.b.index)]
    kernel = convolution((c.out, c.a.buffer, c.b.buffer), forms, c.domain, dict(c.shapes), c.scale, c.a.dtype,
                         0 if any_size else MIN_WORK)
    return None if kernel is None else DirectPlan(c, kernel, blas.plan(c))


class DirectPlan:
    name = "a direct convolution kernel"

    def __init__(self, c: Contraction, kernel: DirectConvolution, fallback: blas.BlasPlan):
        self.names, self.shapes = (c.out, c.a.buffer, c.b.buffer), dict(c.shapes)
        self.kernel, self.fallback = kernel, fallback

    def accumulate(self, buffers: dict[str, np.ndarray], *, assign: bool = False) -> None:
        """Arrays of another dtype than the kernel's (a caller's float64 into a float32 program's
        buffers) take BLAS's path."""
        arrays = {n: buffers[n].reshape(self.shapes[n]) for n in self.names}
        if all(a.dtype == self.kernel.dtype for a in arrays.values()):
            self.kernel.run(arrays, assign)
        else:
            self.fallback.accumulate(buffers, assign=assign)


def convolution(role_names: tuple[str, str, str], forms, domain, shapes: dict, scale: float,
                dtype: str, min_work: int) -> DirectConvolution | None:
    """The direct kernel for `out[...] += scale * a[...] * b[...]`, or None where that is not a
    2-D convolution sum, `x[n, c, SH * i + r, SW * j + s]`, or is below `min_work` multiply-adds.
    `role_names` are the buffers of out, a and b; `forms` their index components' affine terms
    ({var: coefficient, None: constant}, or None). Kernels that run as plain Python
    (HALIDE_AD_JIT=0) keep BLAS's path: the vector intrinsics exist only compiled."""
    if not config.jit_enabled() or numba.config.DISABLE_JIT:
        return None
    if dtype not in ("float32", "float64") or len(set(role_names)) != 3 or any(len(f) != 4 for f in forms):
        return None
    shifted = [k for k, f in enumerate(forms)
               if all(_plain(t) for t in f[:2]) and all(_pair(t) for t in f[2:])]
    plain = [k for k, f in enumerate(forms) if all(_plain(t) for t in f)]
    if len(shifted) != 1 or len(plain) != 2:
        return None
    xf = forms[shifted[0]]
    n, c = _plain(xf[0]), _plain(xf[1])
    ys = [k for k in plain if _plain(forms[k][0]) == n]
    if len(ys) != 1:
        return None
    (ky,) = ys
    (kk,) = [k for k in plain if k != ky]
    yv = [_plain(t) for t in forms[ky]]
    kv = [_plain(t) for t in forms[kk]]
    o, i, j = yv[1], yv[2], yv[3]
    rows, cols = _pair(xf[2]), _pair(xf[3])
    if i not in rows or j not in cols:
        return None
    (r,) = rows.keys() - {i}
    (s,) = cols.keys() - {j}
    SH, SW = rows[i], cols[j]
    names = (n, o, c, i, j, r, s)
    ranges = {d.var: d for d in domain}
    if len(set(names)) != 7 or set(ranges) != set(names) or sorted(kv, key=names.index) != [o, c, r, s]:
        return None
    if any(not isinstance(d.lo, int) or d.lo != 0 for d in domain) or rows[r] != 1 or cols[s] != 1:
        return None
    N, O, C, Ho, Wo, KH, KW = (ranges[v].extent for v in names)
    x, y, k = role_names[shifted[0]], role_names[ky], role_names[kk]
    role = {y: "forward", x: "input", k: "weight"}[role_names[0]]
    k_axes = tuple(kv.index(v) for v in (o, c, r, s))
    Hi, Wi = shapes[x][2:]  # the rows and columns x has; the sum reads them up to SH * (Ho - 1) + KH
    k_shape = tuple((O, C, KH, KW)[k_axes.index(a)] for a in range(4))
    expected = {y: (N, O, Ho, Wo), x: (N, C, Hi, Wi), k: k_shape}
    if any(tuple(shapes[name]) != shape for name, shape in expected.items()):
        return None
    if Hi < SH * (Ho - 1) + KH or Wi < SW * (Wo - 1) + KW or role == "input" and (SH, SW) == (1, 1) and (
            (Hi, Wi) != (Ho + KH - 1, Wo + KW - 1)):
        return None
    L = lanes(np.dtype(dtype).itemsize)
    if min(Wo, phase_width(Wi, SW)) < L:  # a row of y, and of each phase of x's, holds a vector
        return None
    if N * O * C * Ho * Wo * KH * KW < min_work:
        return None
    return DirectConvolution(role, role_names[0], y, x, k, k_axes, N, O, C, Ho, Wo, KH, KW, Hi, Wi, SH, SW,
                             scale, dtype)


def _plain(t) -> object | None:
    """The variable of a component that is one variable, whole."""
    if t is None or len(t) != 2 or t.get(None) != 0:
        return None
    (v,) = (v for v in t if v is not None)
    return v if t[v] == 1 else None


def _pair(t) -> dict | None:
    """The two variables of a component that is a sum of positive multiples of them, and their
    coefficients."""
    if t is None or len(t) != 3 or t.get(None) != 0 or any(c < 1 for v, c in t.items() if v is not None):
        return None
    return {v: c for v, c in t.items() if v is not None}
