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
from halide_ad.runtime.engines.simd import lanes

MIN_WORK = 1 << 24  # multiply-adds from which a kernel's compile (~1 s, once) pays off against BLAS's path
CHANNELS = 4  # output channels per block
VECTORS = 2  # vectors of columns per block of the forward and the input gradient
TAPS = 3  # taps per block of the weight gradient


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
            if self.SW > 1:  # and a buffer for x split by column phase (`_phases_source`)
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
        """A buffer for x with its rows split by column phase (`_phase_layout`), flat."""
        return pool.empty((self.N * self.C * self.Hi * self.SW * _phase_width(self.Wi, self.SW),), dtype)

    @property
    def padded(self) -> tuple[int, int]:
        """The height and width of the input gradient's padded cotangent (at a stride, padded in
        its columns only, `strided_input_source`)."""
        if (self.SH, self.SW) != (1, 1):
            return self.Ho, _phase_width(self.Wi, self.SW) + (self.KW - 1) // self.SW
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
    if min(Wo, _phase_width(Wi, SW)) < L:  # a row of y, and of each phase of x's, holds a vector
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


def correlation_source(N, Ci, Hi, Wi, KH, KW, Co, L, assign, padding=(0, 0), stride=(1, 1)) -> str:
    """`run(inp, k, out)`: out[n, o, y, x] (+)= sum over c, r, s of inp[n, c, SH * y + r, SW * x +
    s] * k[c, r, s, o], inp's rows split by column phase (`_phases_source`), out
    C-ordered, both flat, k in blocks of output channels (`_blocks`); in parallel over the rows
    (n, y) of out. With `padding` (rows, columns), `run(src, inp, k, out)`
    first copies src into inp's middle, zeros around it: numpy took 1.2 ms for the 4.5 MB of a
    convolution's input gradient, half of it filling what the copy then overwrites."""
    SH, SW = stride
    Ho, Wo = (Hi - KH) // SH + 1, (Wi - KW) // SW + 1
    row, columns = _phase_layout(Wi, SW, KW)
    MR = min(CHANNELS, Co)
    NR = max(v for v in range(1, VECTORS + 1) if v * L <= Wo)
    block = NR * L
    acc = [[f"a{t}_{u}" for u in range(NR)] for t in range(MR)]
    every = [a for line in acc for a in line]
    body = [f"{a} = simd.zero(out)" for a in every]
    body += [f"for c in range({Ci}):",
             f"    for r in range({KH}):",
             f"        base = n * {Ci * Hi * row} + c * {Hi * row} + ({SH} * y + r) * {row} + xb",
             f"        kb = (b * {Ci} + c) * {KH * KW * MR} + r * {KW * MR}",
             f"        for s in range({KW}):",
             "            at = base + COLUMN[s]"]
    body += [f"            v{u} = simd.load(inp, at + {u * L})" for u in range(NR)]
    for t in range(MR):
        body.append(f"            w = simd.splat(k, kb + {t})")
        body += [f"            {acc[t][u]} = simd.fma(w, v{u}, {acc[t][u]})" for u in range(NR)]
    body.append(f"            kb += {MR}")
    body.append(f"o = n * {Co * Ho * Wo} + ob * {Ho * Wo} + y * {Wo} + xb")
    for t in range(MR):
        stores = []
        for u in range(NR):
            at = f"o + {t * Ho * Wo + u * L}"
            if assign:  # a block that overlaps the one before writes the same values again
                stores.append(f"simd.store(out, {at}, {acc[t][u]})")
            else:
                new = acc[t][u] if Wo % block == 0 else f"simd.keep_from({acc[t][u]}, xbi - xb - {u * L})"
                stores.append(f"simd.store(out, {at}, simd.add(simd.load(out, {at}), {new}))")
        if not assign and Co % MR:
            body.append(f"if ob + {t} >= obi:")
            body += ["    " + line for line in stores]
        else:
            body += stores
    return _module([
        f"COLUMN = {columns!r}",
        "",
        "",
        "@kernel",
        "def rows(lo, hi, inp, k, out):",
        "    for item in range(lo, hi):",
        f"        n = item // {Ho}",
        f"        y = item - n * {Ho}",
        f"        for b in range({-(-Co // MR)}):",
        f"            obi = b * {MR}",
        f"            ob = min(obi, {Co - MR})",
        f"            for xbi in range(0, {Wo}, {block}):",
        f"                xb = min(xbi, {Wo - block})",
        *("                " + line for line in body),
        "",
        "",
        *(_padding_source(N * Ci, Hi, Wi, *padding, N * Ho, L) if any(padding) else
          _phases_source(N * Ci * Hi, Wi, SW, "run(x, inp, k, out)", "x", "inp",
                         f"parallel_for(rows, 0, {N * Ho}, inp, k, out)") if SW > 1 else [
            "def run(inp, k, out):",
            f"    parallel_for(rows, 0, {N * Ho}, inp, k, out)"]),
    ])


def _phase_width(Wi: int, SW: int) -> int:
    """The columns of each phase j % SW of a row of Wi columns split by phase (the last ones may
    hold one zero more)."""
    return -(-Wi // SW)


def _phase_layout(Wi: int, SW: int, KW: int) -> tuple[int, tuple[int, ...]]:
    """The length of a row of x split by column phase, and where tap s's columns start in it."""
    Wq = _phase_width(Wi, SW)
    return SW * Wq, tuple(s % SW * Wq + s // SW for s in range(KW))


def strided_input_source(N, O, C, Ho, Wo, KH, KW, Hi, Wi, stride, L, assign) -> str:
    """`run(y, padded, k, split, x)`: x[n, c, SH * i + r, SW * j + s] (+)= sum over o of y[n, o, i, j]
    * k[o, r, s, c] (k in blocks of channels, `_blocks`, and scaled), all flat. Each column phase p
    of x's rows is a correlation of y's rows, zero-padded in their columns, with the taps s = p +
    SW * m: `rows` writes x's rows split by phase into `split` (no row is written twice), then
    `unsplit` interleaves them into x, adding where x holds a contribution already. A row Y of x
    sums over the rows r with Y - r a multiple of SH in range; a row no tap reaches gets zeros."""
    SH, SW = stride
    Wq = _phase_width(Wi, SW)
    row = SW * Wq
    P = (KW - 1) // SW  # zero columns before each padded row of y: the most taps a phase has, less 1
    Wg = Wq + P
    MR = min(CHANNELS, C)
    NR = max(v for v in range(1, VECTORS + 1) if v * L <= Wq)
    block = NR * L
    acc = [[f"a{t}_{u}" for u in range(NR)] for t in range(MR)]
    every = [a for line in acc for a in line]
    body = [f"for b in range({-(-C // MR)}):",
            f"    ob = min(b * {MR}, {C - MR})"]
    for p in range(SW):
        taps = [s for s in range(p, KW, SW)]
        inner = [f"for xbi in range(0, {Wq}, {block}):",
                 f"    xb = min(xbi, {Wq - block})",
                 *(f"    {a} = simd.zero(split)" for a in every)]
        if taps:
            inner += [f"    for o in range({O}):",
                      f"        for r in range({KH}):",
                      "            d = Y - r",
                      f"            if d >= 0 and d % {SH} == 0 and d < {SH * Ho}:",
                      f"                base = ((n * {O} + o) * {Ho} + d // {SH}) * {Wg} + xb + {P}",
                      f"                kb = (b * {O} + o) * {KH * KW * MR} + r * {KW * MR}"]
            for s in taps:
                step = [f"v{u} = simd.load(padded, base + {u * L - s // SW})" for u in range(NR)]
                for t in range(MR):
                    step.append(f"w = simd.splat(k, kb + {s * MR + t})")
                    step += [f"{acc[t][u]} = simd.fma(w, v{u}, {acc[t][u]})" for u in range(NR)]
                inner += ["                " + line for line in step]
        inner.append(f"    at = ((n * {C} + ob) * {Hi} + Y) * {row} + {p * Wq} + xb")
        inner += [f"    simd.store(split, at + {t * Hi * row + u * L}, {acc[t][u]})"
                  for t in range(MR) for u in range(NR)]
        body += ["    " + line for line in inner]
    write = "=" if assign else "+="
    unsplit = [f"for q in range({Wi // SW}):"]
    unsplit += [f"    x[to + {SW} * q + {p}] {write} split[at + {p * Wq} + q]" for p in range(SW)]
    unsplit += [f"x[to + {j}] {write} split[at + {j % SW * Wq + j // SW}]" for j in range(Wi // SW * SW, Wi)]
    return _module([
        "@kernel",
        "def pad(lo, hi, y, padded):",
        "    for line in range(lo, hi):",
        f"        at = line * {Wo}",
        f"        to = line * {Wg}",
        f"        for j in range({P}):",
        "            padded[to + j] = 0",
        f"        for j in range({Wo}):",
        f"            padded[to + {P} + j] = y[at + j]",
        f"        for j in range({P + Wo}, {Wg}):",
        "            padded[to + j] = 0",
        "",
        "",
        "@kernel",
        "def rows(lo, hi, padded, k, split):",
        "    for item in range(lo, hi):",
        f"        n = item // {Hi}",
        f"        Y = item - n * {Hi}",
        *("        " + line for line in body),
        "",
        "",
        "@kernel",
        "def interleave(lo, hi, split, x):",
        "    for line in range(lo, hi):",
        f"        at = line * {row}",
        f"        to = line * {Wi}",
        *("        " + line for line in unsplit),
        "",
        "",
        "def run(y, padded, k, split, x):",
        f"    parallel_for(pad, 0, {N * O * Ho}, y, padded)",
        f"    parallel_for(rows, 0, {N * Hi}, padded, k, split)",
        f"    parallel_for(interleave, 0, {N * C * Hi}, split, x)",
    ])


def _phases_source(lines: int, Wi: int, SW: int, signature: str, rows: str, split: str,
                   then: str) -> list[str]:
    """`phases`: each of x's `lines` rows into `split`'s, its columns grouped by phase j % SW (the
    columns a strided row of taps reads, contiguous; `_phase_layout`), then `run` does `then`.
    numpy's strided copies took 1.3 ms for conv2d stride 2's 4 MB input."""
    Wq = _phase_width(Wi, SW)
    row = SW * Wq
    body = [f"for q in range({Wi // SW}):"]
    body += [f"    out[to + {p * Wq} + q] = src[at + {SW} * q + {p}]" for p in range(SW)]
    body += [f"out[to + {j % SW * Wq + j // SW}] = src[at + {j}]" for j in range(Wi // SW * SW, Wi)]
    body += [f"out[to + {p * Wq + Wq - 1}] = 0" for p in range(SW) if len(range(p, Wi, SW)) < Wq]
    return [
        "@kernel",
        "def phases(lo, hi, src, out):",
        "    for line in range(lo, hi):",
        f"        at = line * {Wi}",
        f"        to = line * {row}",
        *("        " + line for line in body),
        "",
        "",
        f"def {signature}:",
        f"    parallel_for(phases, 0, {lines}, {rows}, {split})",
        f"    {then}",
    ]


def _padding_source(planes, Hp, Wp, ph, pw, rows, L) -> list[str]:
    """`pad`: inp's rows from src's, with zeros around, in vectors (a row of at least L elements;
    its last vector overlaps the one before)."""
    H, W = Hp - 2 * ph, Wp - 2 * pw
    copy = [f"for j in range(0, {W - L + 1}, {L}):",
            f"    simd.store(inp, at + {pw} + j, simd.load(src, first + j))"]
    if W % L:
        copy.append(f"simd.store(inp, at + {pw + W - L}, simd.load(src, first + {W - L}))")
    zeros = [f"inp[at + {j}] = 0" for j in range(pw)] + [f"inp[at + {pw + W + j}] = 0" for j in range(pw)]
    return [
        "@kernel",
        "def pad(lo, hi, src, inp):",
        "    for row in range(lo, hi):",
        f"        i = row % {Hp} - {ph}",
        f"        at = row * {Wp}",
        f"        if 0 <= i < {H}:",
        f"            first = (row // {Hp} * {H} + i) * {W}",
        *("            " + line for line in zeros + copy),
        "        else:",
        f"            for j in range({Wp}):",
        "                inp[at + j] = 0",
        "",
        "",
        "def run(src, inp, k, out):",
        f"    parallel_for(pad, 0, {planes * Hp}, src, inp)",
        f"    parallel_for(rows, 0, {rows}, inp, k, out)",
    ]


def weight_gradient_source(N, O, C, Ho, Wo, KH, KW, L, k_strides, scale, assign, Hi, Wi, stride) -> str:
    """`run(y, x, k)`: k[o, c, r, s] (+)= scale * sum over n, i, j of y[n, o, i, j] * x[n, c, SH * i
    + r, SW * j + s], y C-ordered, x's rows split by column phase (`_phases_source`),
    both flat, k flat with the element strides k_strides of o, c, r, s; in parallel over blocks
    of (output channels, c)."""
    SH, SW = stride
    row, columns = _phase_layout(Wi, SW, KW)
    MR = min(CHANNELS, O)
    so, sc, sr, ss = k_strides
    taps = [(r, s) for r in range(KH) for s in range(KW)]
    width = min(TAPS, len(taps))
    groups = -(-len(taps) // width)
    padded = taps + [taps[0]] * (groups * width - len(taps))  # the last block's spare taps: unstored repeats
    acc = [[f"a{t}_{u}" for u in range(width)] for t in range(MR)]
    every = [a for line in acc for a in line]

    def products(indent: str, keep: str | None) -> list[str]:
        def wrap(e):
            return e if keep is None else f"simd.keep_from({e}, {keep})"
        lines = [f"v{u} = {wrap(f'simd.load(x, xb + o{u} + j)')}" for u in range(width)]
        for t in range(MR):
            lines.append(f"g = {wrap(f'simd.load(y, yb + {t * Ho * Wo} + j)')}")
            lines += [f"{acc[t][u]} = simd.fma(g, v{u}, {acc[t][u]})" for u in range(width)]
        return [indent + line for line in lines]

    new_rows = O % MR != 0  # the last block overlaps the one before: only its new channels are written
    clear = []
    if assign:
        zero = [f"for tap in range({len(taps)}):", f"    k[(ob + t) * {so} + c * {sc} + K_AT[tap]] = 0"]
        if new_rows:
            zero = ["if ob + t >= obi:"] + ["    " + line for line in zero]
        clear = [f"for t in range({MR}):"] + ["    " + line for line in zero]
    stores = []
    for t in range(MR):
        for u in range(width):
            cond = [f"REAL[{width} * grp + {u}]"] * (len(padded) > len(taps))
            cond += [f"ob + {t} >= obi"] * new_rows
            store = (f"k[(ob + {t}) * {so} + c * {sc} + K_AT[{width} * grp + {u}]] += "
                     f"{float(scale)!r} * simd.total({acc[t][u]})")
            stores += [f"if {' and '.join(cond)}:", "    " + store] if cond else [store]
    tail = Wo % L
    lines = [
        f"X_AT = {tuple(r * row + columns[s] for r, s in padded)!r}",
        f"K_AT = {tuple(r * sr + s * ss for r, s in padded)!r}",
        f"REAL = {tuple(k < len(taps) for k in range(len(padded)))!r}",
        "",
        "",
        "@kernel",
        "def blocks(lo, hi, y, x, k):",
        "    for item in range(lo, hi):",
        f"        obi = (item // {C}) * {MR}",
        f"        c = item - (item // {C}) * {C}",
        f"        ob = min(obi, {O - MR})",
        *("        " + line for line in clear),
        f"        for n in range({N}):",
        f"            for grp in range({groups}):",
        *(f"                o{u} = X_AT[{width} * grp + {u}]" for u in range(width)),
        *(f"                {a} = simd.zero(y)" for a in every),
        f"                for i in range({Ho}):",
        f"                    yb = n * {O * Ho * Wo} + ob * {Ho * Wo} + i * {Wo}",
        f"                    xb = n * {C * Hi * row} + c * {Hi * row} + i * {SH * row}",
        f"                    for j in range(0, {Wo - L + 1}, {L}):",
        *products("                        ", None),
    ]
    if tail:  # the row's last vector overlaps the one before: zero the lanes it already summed
        lines += [f"                    j = {Wo - L}", *products("                    ", str(L - tail))]
    lines += ["                " + line for line in stores]
    main = f"parallel_for(blocks, 0, {-(-O // MR) * C}, y, x, k)"
    if SW > 1:
        lines += ["", ""] + _phases_source(N * C * Hi, Wi, SW, "run(y, x_rows, x, k)", "x_rows", "x", main)
    else:
        lines += ["", "", "def run(y, x, k):", "    " + main]
    return _module(lines)


def _module(lines: list[str]) -> str:
    return "from halide_ad.runtime.engines import simd\n\n\n" + "\n".join(lines) + "\n"
