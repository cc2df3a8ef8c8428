"""Math that generated kernels call: float32 functions LLVM can vectorize, and an index helper.

numba lowers `np.exp`, `np.tanh`, `math.erf` and the rest to calls of the C library's scalar
functions, and LLVM vectorizes a call only through a vector math library. numba's one, SVML, needs
an llvmlite built with Intel's patch, and the llvmlite wheels are not (`llvmlite.binding.has_svml`
is False): a float32 tanh over 4M elements ran 50 ms where numpy's SIMD loop takes 2. So, as XLA
and Eigen do, the float32 functions here are range reductions and polynomials in plain arithmetic,
inlined into the kernel's loop and vectorized with it.

Accuracy against float64 references, over the whole float32 range: tests/runtime/test_vmath.py
holds every function to 3 ulp, with IEEE special values (inf, nan, -0, overflow to inf,
underflow to 0 and subnormals) as C's functions give them. The largest errors over every float32
input (`tools/vmath_exhaustive.py` at 110f8fe; exp on [-104, 89], sigmoid on [-104, 40], tanh on
[-10.5, 10.5], erf on [-4, 4]): exp 1.01, tanh 2.42, sigmoid 2.40, erf 2.76 (at 0.477, where erf
is just below 0.5 and the ulp halves); seen in sampled sweeps: log 0.75, log1p 2.3, sin, cos and
pow 0.5. float64 kernels keep the C library's functions.

exp, tanh and erf evaluate their polynomials in fused multiply-adds (`fma`), and round x / ln 2
to an integer by adding 1.5 * 2**23, whose sum holds the integer in its low bits. tanh is one
formula, e / (e + 2) with e = exp(2|x|) - 1. Eigen's and XLA's rational x P(x**2) / Q(x**2) with
one division costs less (a third less than this tanh in a loop), but its two sums round to 5-7
ulp in float32 near tanh = 1, with fused multiply-adds or without.

Coefficients: exp's (also tanh's exp(r) - 1) and log's are Cephes' (Moshier's) single precision
ones; erf's are least-squares fits on Chebyshev nodes (`tools/fit_erf.py`); sin and cos reduce
their argument in float64 (by pi/2 in two parts below 120, and with 4/pi to 192 bits above, as
ARM's optimized-routines sinf does) and evaluate Taylor series in float64.

`nonneg(i)`: an index the compiler proved in range, as an unsigned integer. numba wraps negative
indices around (`a[i]` reads `a[i + n]` when i < 0), and LLVM cannot rule that out in a loop
`for i in range(start, stop)` with a run-time start, so it read and wrote contiguous arrays
through gathers and scatters: x * w + x over 4M elements ran 5.3 ms, where a plain loop runs 1.0.
"""
from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
from numba import njit, types
from numba.extending import intrinsic

from halide_ad.runtime.parallel import branchless

_inline = njit(inline="always", nogil=True, error_model="numpy", cache=True)
F32, F64 = np.float32, np.float64


@intrinsic
def nonneg(typingctx, i):
    """`i` as an unsigned index (the same bits): indexing skips numba's wraparound."""
    if not isinstance(i, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        return context.cast(builder, args[0], sig.args[0], types.intp)

    return types.uintp(i), codegen


def _bitcast(src, dst):
    @intrinsic
    def cast(typingctx, x):
        if not (x == src or (isinstance(src, types.Integer) and isinstance(x, types.Integer))):
            return None

        def codegen(context, builder, sig, args):
            v = context.cast(builder, args[0], sig.args[0], src)
            return builder.bitcast(v, context.get_value_type(dst))

        return dst(x), codegen
    return cast


bits32 = _bitcast(types.float32, types.int32)      # float32 -> its bits
float32_of = _bitcast(types.int32, types.float32)   # bits (any integer, truncated) -> float32
bits64 = _bitcast(types.float64, types.int64)
float64_of = _bitcast(types.int64, types.float64)

_INF32, _NAN32 = F32(np.inf), F32(np.nan)
_ONE, _HALF, _TWO = F32(1), F32(0.5), F32(2)


# int32 constants: numba widens int32 arithmetic with a Python int to int64, and 64-bit lanes
# halve the vector width (exp over 4M float32 took 5.2 ms on one thread, 2.1 in int32)
_I1, _I23, _I126, _I149 = (np.int32(k) for k in (1, 23, 126, 149))
_MANTISSA, _HALF_EXPONENT = np.int32(0x007FFFFF), np.int32(0x3F000000)
_I0 = np.int32(0)
_SIGN = np.int32(-0x80000000)


@intrinsic
def fma(typingctx, a, b, c):
    """a * b + c rounded once (LLVM's fma): half the instructions of a multiply and an add, and
    the same bits on every CPU. x86-64 CPUs since 2013 and ARM64 ones do it in one instruction;
    on others LLVM calls the C library's fmaf, correct but slow."""
    if not (a == b == c and isinstance(a, types.Float)):
        return None

    def codegen(context, builder, sig, args):
        return builder.fma(*args)

    return a(a, b, c), codegen


# Adding 1.5 * 2**23 to a float32 below 2**22 in magnitude rounds it to an integer n, held in
# the sum's low mantissa bits: n = bits(sum) - bits(1.5 * 2**23), with no float -> int
# conversion. With 127 more, the low 8 bits are 2**n's exponent field.
_ROUNDER_BIASED = F32(12582912.0 + 127.0)
# exp's 2**(n - 1), and below -86 2**(n + 63): normal floats for n in [-150, 128]
_ROUNDER_EXP, _ROUNDER_EXP_LOW = F32(12582912.0 + 126.0), F32(12582912.0 + 126.0 + 64.0)
_TWO_M63 = F32(2.0**-63)


@_inline
def _expm1_reduced(r):
    """exp(r) - 1 for |r| <= ln(2) / 2."""
    p = F32(1.9875691500e-4)
    p = fma(p, r, F32(1.3981999507e-3))
    p = fma(p, r, F32(8.3334519073e-3))
    p = fma(p, r, F32(4.1665795894e-2))
    p = fma(p, r, F32(1.6666665459e-1))
    p = fma(p, r, F32(5.0000001201e-1))
    return fma(p, r * r, r)


@_inline
def _reduce_ln2(c, rounder):
    """(k, r): k = rounder + n for n = round(c / ln 2), and r = c - n ln 2 (ln 2 in two parts,
    Cody and Waite)."""
    k = fma(c, F32(1.44269504088896341), rounder)
    n = k - rounder
    return k, fma(n, F32(2.12194440e-4), fma(n, F32(-0.693359375), c))


@_inline
def exp_f32(x):
    """2**n exp(r) formed as s (1 + p(r)) in one fused multiply-add, with s = 2**(n - 1) read
    from the rounding sum's low bits and doubled after: normal up to n = 128, where exp(88.7)
    is still finite. Below -86 the results reach the subnormals (n down to -150): s is
    2**(n + 63) there and the one scaling by 2**-63 rounds once. NaN passes through every step."""
    c = branchless(x < F32(-104.0), F32(-104.0), branchless(x > F32(89.0), F32(89.0), x))
    low = c < F32(-86.0)
    k, r = _reduce_ln2(c, branchless(low, _ROUNDER_EXP_LOW, _ROUNDER_EXP))
    s = float32_of(bits32(k) << _I23)
    return fma(_expm1_reduced(r), s, s) * branchless(low, _TWO_M63, _TWO)


@_inline
def log_f32(x):
    subnormal = x < F32(1.17549435e-38)
    bits = bits32(branchless(subnormal, x * F32(8388608.0), x))
    e = (bits >> _I23) - branchless(subnormal, _I149, _I126)
    m = float32_of((bits & _MANTISSA) | _HALF_EXPONENT)  # in [0.5, 1)
    low = m < F32(0.707106781186547524)
    e = e - branchless(low, _I1, _I0)
    m = branchless(low, m + m - _ONE, m - _ONE)  # log(1 + m), m in [-0.29, 0.41]
    z = m * m
    p = F32(7.0376836292e-2)
    p = p * m + F32(-1.1514610310e-1)
    p = p * m + F32(1.1676998740e-1)
    p = p * m + F32(-1.2420140846e-1)
    p = p * m + F32(1.4249322787e-1)
    p = p * m + F32(-1.6668057665e-1)
    p = p * m + F32(2.0000714765e-1)
    p = p * m + F32(-2.4999993993e-1)
    p = p * m + F32(3.3333331174e-1)
    fe = F32(e)
    y = p * m * z + fe * F32(-2.12194440e-4) - _HALF * z
    y = m + y + fe * F32(0.693359375)
    special = branchless(x == F32(0), -_INF32, branchless(x == _INF32, _INF32, _NAN32))
    return branchless((x > F32(0)) & (x < _INF32), y, special)


@_inline
def log1p_f32(x):
    u = x + _ONE
    d = u - _ONE
    y = log_f32(u) * (x / d)  # log(u) * x / (u - 1): exact for the rounding of 1 + x (Goldberg)
    return branchless(d == F32(0), x, branchless(x == _INF32, x, y))


@_inline
def tanh_f32(x):
    """e / (e + 2), e = exp(2|x|) - 1, with x's sign: one formula for every x, no cancellation
    near 0. Above 10, e + 2 rounds to e and the result to 1."""
    a = np.abs(x)
    k, r = _reduce_ln2(branchless(a > F32(10.0), F32(20.0), a + a), _ROUNDER_BIASED)  # NaN stays
    s = float32_of(bits32(k) << _I23)  # 2**n, n in [0, 29]
    e = fma(_expm1_reduced(r), s, s - _ONE)  # 2**n exp(r) - 1
    t = e / (e + _TWO)
    return float32_of(bits32(t) | (bits32(x) & _SIGN))


# sigmoid's exp(-|x|) scaled by 2**65: the sum's low bits are 2**(n + 65)'s exponent field
_ROUNDER_SIGMOID = F32(12582912.0 + 127.0 + 65.0)
_TWO_65, _TWO_M65 = F32(2.0**65), F32(2.0**-65)


@_inline
def sigmoid_f32(x):
    """1 / (1 + exp(-x)) as e / (1 + e) below 0, e = exp(-|x|) <= 1: exp(-x) would overflow
    below -88.7 where the result is still a subnormal. e is formed as 2**65 e, a normal float
    down to the smallest subnormal result, and the quotient is scaled back at the end. The
    same bits as e = exp_f32(-|x|) and e / (1 + e) for every float32 input but NaNs
    (`tools/vmath_exhaustive.py --sigmoid-bits`)."""
    a = np.abs(x)
    c = branchless(a > F32(104.0), F32(-104.0), -a)  # NaN stays
    k, r = _reduce_ln2(c, _ROUNDER_SIGMOID)
    s = float32_of(bits32(k) << _I23)
    e = fma(_expm1_reduced(r), s, s)  # 2**65 exp(c), rounded once as exp_f32 rounds it
    q = branchless(x >= F32(0), _TWO_65, e) / fma(e, _TWO_M65, _ONE)
    return q * _TWO_M65


@_inline
def erf_f32(x):
    a = np.abs(x)
    z = a * a
    p = F32(7.898209878476337e-05)
    p = fma(p, z, F32(-8.024353883229196e-04))
    p = fma(p, z, F32(5.19005348905921e-03))
    p = fma(p, z, F32(-2.6854809373617172e-02))
    p = fma(p, z, F32(1.1283612251281738e-01))
    p = fma(p, z, F32(-3.761262893676758e-01))
    p = fma(p, z, F32(1.128379225730896))
    small = x * p
    t = _ONE / a  # erfc(a) exp(a^2), a polynomial in 1 / a on [1, 3.95]
    q = F32(-1.1410238221287727e-02)
    q = fma(q, t, F32(3.810419887304306e-02))
    q = fma(q, t, F32(3.977751359343529e-03))
    q = fma(q, t, F32(-2.1924015879631042e-01))
    q = fma(q, t, F32(4.812455475330353e-01))
    q = fma(q, t, F32(-4.648941457271576e-01))
    q = fma(q, t, F32(4.024774581193924e-02))
    q = fma(q, t, F32(5.592983365058899e-01))
    q = fma(q, t, F32(2.544870658311993e-04))
    large = fma(-exp_f32(-z), q, _ONE)
    large = branchless(x < F32(0), -large, large)
    return branchless(a < _ONE, small, large)


@_inline
def maximum(a, b):
    """numpy's maximum (a NaN wins), as one compare and select: a max reduction with no
    argindex to keep (`_emit_accumulation`) runs in LANES partial maxima that vectorize."""
    return branchless((b > a) | (b != b), b, a)


@_inline
def minimum(a, b):
    return branchless((b < a) | (b != b), b, a)


# ---- float64 helpers: sin, cos and pow compute in float64 and round once -----------------------

def _inv_pio4_table() -> np.ndarray:
    """4/pi's binary expansion in 32-bit windows 8 bits apart (ARM's __inv_pio4): entry k is
    floor(4/pi * 2**(7 + 8k)) mod 2**32. pi from Machin's formula in integers, to 320 bits."""
    def arctan_inv(n: int, one: int) -> int:
        total, term, k, sign = 0, one // n, 1, 1
        while term:
            total += sign * (term // k)
            term //= n * n
            k, sign = k + 2, -sign
        return total
    one = 1 << 320
    pi = 16 * arctan_inv(5, one) - 4 * arctan_inv(239, one)
    return np.array([((4 << (320 + 7 + 8 * k)) // pi) & 0xFFFFFFFF for k in range(24)], np.uint32)


_INV_PIO4 = _inv_pio4_table()
_PIO2_HI, _PIO2_LO = F64(1.57079631090164184570), F64(1.58932547735281966916e-8)  # pi/2, 2 parts
_PI_2_63 = F64(1.5707963267948966) * F64(2.0) ** -62


@_inline
def _reduce(a):
    """For float32 a >= 0, finite: (r, n) with a = n * pi/2 + r, |r| <= pi/4 (float64)."""
    ad = F64(a)
    n_small = np.floor(ad * F64(0.63661977236758134308) + F64(0.5))
    r_small = ad - n_small * _PIO2_HI - n_small * _PIO2_LO
    xi = np.uint64(bits32(a)) & np.uint64(0xFFFFFFFF)
    k = (xi >> np.uint64(26)) & np.uint64(15)
    m = ((xi & np.uint64(0xFFFFFF)) | np.uint64(0x800000)) << ((xi >> np.uint64(23)) & np.uint64(7))
    res0 = (m * np.uint64(_INV_PIO4[k])) & np.uint64(0xFFFFFFFF)
    res1 = m * np.uint64(_INV_PIO4[k + np.uint64(4)])
    res2 = m * np.uint64(_INV_PIO4[k + np.uint64(8)])
    res0 = ((res2 >> np.uint64(32)) | (res0 << np.uint64(32))) + res1
    n_big = (res0 + (np.uint64(1) << np.uint64(61))) >> np.uint64(62)
    r_big = F64(np.int64(res0 - (n_big << np.uint64(62)))) * _PI_2_63
    big = a >= F32(120.0)
    return branchless(big, r_big, r_small), branchless(big, np.int64(n_big), np.int64(n_small))


@_inline
def _sin_poly(r):
    z = r * r
    return r + r * z * (F64(-1 / 6) + z * (F64(1 / 120) + z * (F64(-1 / 5040) + z * (
        F64(1 / 362880) + z * (F64(-1 / 39916800) + z * F64(1 / 6227020800))))))


@_inline
def _cos_poly(r):
    z = r * r
    return F64(1) + z * (F64(-1 / 2) + z * (F64(1 / 24) + z * (F64(-1 / 720) + z * (
        F64(1 / 40320) + z * (F64(-1 / 3628800) + z * F64(1 / 479001600))))))


@_inline
def sin_f32(x):
    a = np.abs(x)
    r, n = _reduce(branchless(a < _INF32, a, F32(0)))
    s, c = _sin_poly(r), _cos_poly(r)
    y = branchless((n & 1) == 0, s, c)
    y = branchless((n & 2) == 0, y, -y)
    y = branchless(bits32(x) < 0, -y, y)
    return branchless(a < _INF32, F32(y), x - x)


@_inline
def cos_f32(x):
    a = np.abs(x)
    r, n = _reduce(branchless(a < _INF32, a, F32(0)))
    s, c = _sin_poly(r), _cos_poly(r)
    y = branchless((n & 1) == 0, c, -s)
    y = branchless((n & 2) == 0, y, -y)
    return branchless(a < _INF32, F32(y), x - x)


@_inline
def _log_f64(x):
    """log(x) for float64 x > 0 normal, ~1e-14 relative: 2 atanh(s), s = (m - 1) / (m + 1)."""
    bits = bits64(x)
    e = (bits >> 52) - 1022
    m = float64_of((bits & 0x000FFFFFFFFFFFFF) | 0x3FE0000000000000)  # [0.5, 1)
    low = m < F64(0.70710678118654752440)
    e = e - branchless(low, 1, 0)
    m = branchless(low, m + m, m)
    s = (m - F64(1)) / (m + F64(1))
    z = s * s
    p = F64(2 / 17) * z + F64(2 / 15)
    p = p * z + F64(2 / 13)
    p = p * z + F64(2 / 11)
    p = p * z + F64(2 / 9)
    p = p * z + F64(2 / 7)
    p = p * z + F64(2 / 5)
    p = p * z + F64(2 / 3)
    return F64(e) * F64(0.6931471805599453094) + (s + s + s * z * p)


@_inline
def _exp_f64(t):
    """exp(t) for float64 t in [-745, 710] or +-inf or nan, ~1e-14 relative."""
    c = branchless(t < F64(-760.0), F64(-760.0), branchless(t > F64(720.0), F64(720.0), t))
    n = np.floor(c * F64(1.4426950408889634074) + F64(0.5))
    r = c - n * F64(0.693147180369123816490) - n * F64(1.90821492927058770002e-10)
    p = F64(1 / 479001600) * r + F64(1 / 39916800)  # Taylor to r**12, |r| <= ln(2) / 2
    p = p * r + F64(1 / 3628800)
    p = p * r + F64(1 / 362880)
    p = p * r + F64(1 / 40320)
    p = p * r + F64(1 / 5040)
    p = p * r + F64(1 / 720)
    p = p * r + F64(1 / 120)
    p = p * r + F64(1 / 24)
    p = p * r + F64(1 / 6)
    p = p * r + F64(1 / 2)
    p = p * r + F64(1)
    p = p * r + F64(1)
    ni = np.int64(n)
    n1 = ni >> 1
    y = p * float64_of((n1 + 1023) << 52) * float64_of((ni - n1 + 1023) << 52)
    return branchless(t == t, y, t)


@_inline
def pow_f32(x, y):
    """C's powf, through exp(y log|x|) in float64."""
    ax = F64(np.abs(x))
    yd = F64(y)
    finite = (ax > F64(0)) & (ax < F64(np.inf))
    lg = branchless(finite, _log_f64(branchless(finite, ax, F64(1))),
                    branchless(ax == F64(0), F64(-np.inf), ax))  # log of inf or nan is itself
    r = _exp_f64(yd * lg)
    integer = np.floor(y) == y
    odd = integer & (np.floor(y * _HALF) * _TWO != y)
    negative = bits32(x) < 0
    r = branchless(negative & odd, -r, r)
    r = branchless((x < F32(0)) & (x > -_INF32) & ~integer, F64(np.nan), r)
    one = (y == F32(0)) | (x == _ONE) | ((x == -_ONE) & (np.abs(y) == _INF32))
    return branchless(one, _ONE, F32(r))


def _python_pow(x, y):
    with np.errstate(all="ignore"):
        return np.power(x, y)


# The same names in plain Python, for kernels run without numba (HALIDE_AD_JIT=0)
plain_python = SimpleNamespace(
    exp_f32=np.exp, log_f32=np.log, log1p_f32=np.log1p, tanh_f32=np.tanh, sin_f32=np.sin,
    sigmoid_f32=lambda x: 1 / (1 + np.exp(-x)),
    cos_f32=np.cos, erf_f32=lambda x: np.float32(math.erf(x)), pow_f32=_python_pow,
    maximum=np.maximum, minimum=np.minimum)  # a NaN wins, as in `maximum` above
